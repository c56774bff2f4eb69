"""Scaled dot-product attention and multi-head attention, from first principles.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Masks are boolean and mean "may attend" where True, over the last two dimensions
(queries, keys) and broadcast over any leading ones. A query whose every key is masked
attends to nothing: its weights are all 0 and its output is 0 (never NaN), in both paths.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def causal_mask(
    n_queries: int, n_keys: int | None = None, device: torch.device | None = None
) -> torch.Tensor:
    """Boolean (n_queries, n_keys) mask where query t may attend to keys 0..t.

    The only place the causal mask is built. With n_keys != n_queries it is aligned at the top
    left, as `torch.nn.functional.scaled_dot_product_attention(is_causal=True)` does.
    """
    n_keys = n_queries if n_keys is None else n_keys
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril()


def _combined_mask(
    mask: torch.Tensor | None, causal: bool, n_queries: int, n_keys: int, device: torch.device
) -> torch.Tensor | None:
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
    if causal:
        tri = causal_mask(n_queries, n_keys, device=device)
        mask = tri if mask is None else mask & tri
    return mask


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    return_weights: bool = False,
    dropout_p: float = 0.0,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T / sqrt(d_k)) v over any number of leading batch dimensions.

    Args:
        q: (..., Lq, d_k) queries.
        k: (..., Lk, d_k) keys.
        v: (..., Lk, d_v) values.
        mask: boolean, broadcastable to (..., Lq, Lk); True means "may attend".
        causal: also apply `causal_mask` (query t sees keys <= t).
        return_weights: take the explicit path and also return the (..., Lq, Lk) weights.
            Otherwise the fused kernel runs (flash / memory-efficient attention on GPU).
        dropout_p: dropout on the attention weights (pass 0.0 in eval).

    Returns:
        (..., Lq, d_v) output, or (output, weights) when return_weights is True.
    """
    n_queries, n_keys = q.shape[-2], k.shape[-2]
    mask = _combined_mask(mask, causal, n_queries, n_keys, q.device)
    # Rows with no key to attend to are defined to output 0; give them a harmless mask so
    # neither path computes softmax over nothing (NaN), then zero them at the end.
    has_key = None if mask is None else mask.any(dim=-1, keepdim=True)
    safe_mask = None if mask is None else mask | ~has_key

    if return_weights:
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., Lq, Lk)
        if safe_mask is not None:
            scores = scores.masked_fill(~safe_mask, torch.finfo(scores.dtype).min)
        weights = scores.softmax(dim=-1)
        if has_key is not None:
            weights = weights * has_key
        if dropout_p > 0.0:
            weights = F.dropout(weights, p=dropout_p)
        return weights @ v, weights

    squeeze = q.dim() == 2  # the fused kernel wants at least one batch dimension
    if squeeze:
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    output = F.scaled_dot_product_attention(q, k, v, attn_mask=safe_mask, dropout_p=dropout_p)
    if squeeze:
        output = output.squeeze(0)
    if has_key is not None:
        output = output * has_key
    return output


class MultiHeadAttention(nn.Module):
    """Multi-head attention with query/key/value projections and the output projection W_O.

    Self-attention passes the same sequence as query, key and value; cross-attention takes
    queries from one sequence and keys/values from another.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(
                f"n_heads must divide d_model: expected a divisor of {d_model}, got {n_heads}"
            )
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.query_proj = nn.Linear(d_model, d_model)
        self.key_proj = nn.Linear(d_model, d_model)
        self.value_proj = nn.Linear(d_model, d_model)
        self.output_proj = nn.Linear(d_model, d_model)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        # (B, L, D) -> (B, heads, L, D / heads)
        return x.view(batch, length, self.n_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        return_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend from `query` to `key`/`value`.

        Args:
            query: (B, Lq, D).
            key, value: (B, Lk, D).
            mask: boolean, True = may attend; (Lq, Lk), (B, Lq, Lk) or (B, heads, Lq, Lk).
            causal: query t sees keys <= t only.
            return_weights: also return the per-head weights (B, heads, Lq, Lk).

        Returns:
            (B, Lq, D), or (output, weights) when return_weights is True.
        """
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (B, Lq, Lk) -> (B, 1, Lq, Lk): same mask for every head
        q = self._split_heads(self.query_proj(query))
        k = self._split_heads(self.key_proj(key))
        v = self._split_heads(self.value_proj(value))
        dropout_p = self.dropout if self.training else 0.0
        attended = scaled_dot_product_attention(
            q, k, v, mask=mask, causal=causal, return_weights=return_weights, dropout_p=dropout_p
        )
        weights = None
        if return_weights:
            attended, weights = attended
        batch, _, length, _ = attended.shape
        # (B, heads, Lq, D / heads) -> (B, Lq, D)
        attended = attended.transpose(1, 2).reshape(batch, length, self.d_model)
        output = self.output_proj(attended)
        return (output, weights) if return_weights else output
