"""Transformer building blocks: positional encoding, feed-forward, encoder and decoder stacks.

Blocks are pre-norm (LayerNorm before each sub-layer, residual after), which trains stably
without learning-rate warmup tricks and lets the stacks end with one final LayerNorm.

Key masks are boolean (B, N), True where a context token holds at least one observed step; a
token of pure padding is never attended to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from forecaster.attention import MultiHeadAttention


def sinusoidal_positional_encoding(n_positions: int, d_model: int) -> torch.Tensor:
    """(n_positions, D) table with PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...)."""
    position = torch.arange(n_positions, dtype=torch.float32).unsqueeze(1)  # (n, 1)
    div_term = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
    )
    table = torch.zeros(n_positions, d_model)
    table[:, 0::2] = torch.sin(position * div_term)
    table[:, 1::2] = torch.cos(position * div_term[: d_model // 2])
    return table


def _attend_mask(key_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, N) key mask -> (B, 1, 1, N), broadcast over heads and queries."""
    return None if key_mask is None else key_mask[:, None, None, :]


class Dropout(nn.Dropout):
    """nn.Dropout, with a cheaper mask on CPU.

    On CPU torch draws one random number per element for the mask (`bernoulli_`), which took
    a quarter of a training step's time on M4 Hourly (2 threads). Here each 64-bit draw of
    torch's generator gives four 16-bit uniform integers, one per element, so the rate is
    rounded to a multiple of 2^-16 (0.1 -> 0.100006); seeds reproduce it as before. Other
    devices keep torch's kernel (Philox on CUDA is already fast).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(...) -> (...), unchanged in eval mode."""
        if not self.training or self.p == 0.0 or x.device.type != "cpu" or self.inplace:
            return super().forward(x)
        dropped = round(self.p * 2**16)  # of the 2^16 values a draw takes
        if dropped == 2**16:
            return torch.zeros_like(x)
        n = x.numel()
        draws = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
        # (ceil(n / 4),) int64 -> (n,) int16, uniform over [-2^15, 2^15)
        uniform = draws.view(torch.int16)[:n].view(x.shape)
        keep = (uniform >= dropped - 2**15).to(x.dtype)
        kept_share = 1.0 - dropped / 2**16
        return x * keep.mul_(1.0 / kept_share)


class FeedForward(nn.Module):
    """Position-wise two-layer network with GELU."""

    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.GELU(), Dropout(dropout), nn.Linear(d_ff, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D)."""
        return self.net(x)


class HorizonDropout(nn.Module):
    """Drops whole token updates in training, token m of M with probability max_rate * (m+1)/M.

    Applied to the residual branches of the decoder (CATS' query-adaptive masking): a dropped
    update leaves the token as it was, so far horizon tokens learn to lean on their draft.
    """

    def __init__(self, max_rate: float):
        super().__init__()
        self.max_rate = max_rate

    def forward(self, update: torch.Tensor) -> torch.Tensor:
        """(B, M, D) -> (B, M, D), unchanged in eval mode."""
        if not self.training or self.max_rate == 0.0:
            return update
        n_tokens = update.shape[1]
        rate = self.max_rate * torch.arange(1, n_tokens + 1, device=update.device) / n_tokens
        keep = torch.rand(update.shape[0], n_tokens, 1, device=update.device) >= rate[:, None]
        return update * keep.to(update.dtype)


class EncoderBlock(nn.Module):
    """Bidirectional self-attention then feed-forward, each pre-norm with a residual."""

    def __init__(
        self, d_model: int, n_heads: int, d_ff: int, dropout: float, attention_dropout: float
    ):
        super().__init__()
        self.self_attention_norm = nn.LayerNorm(d_model)
        self.self_attention = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.feed_forward_norm = nn.LayerNorm(d_model)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.dropout = Dropout(dropout)

    def forward(
        self, x: torch.Tensor, key_mask: torch.Tensor | None = None, return_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, N, D), key_mask: (B, N) -> ((B, N, D), weights (B, heads, N, N) or None)."""
        h = self.self_attention_norm(x)
        attended = self.self_attention(
            h, h, h, mask=_attend_mask(key_mask), return_weights=return_weights
        )
        weights = None
        if return_weights:
            attended, weights = attended
        x = x + self.dropout(attended)
        x = x + self.dropout(self.feed_forward(self.feed_forward_norm(x)))
        return x, weights


class DecoderBlock(nn.Module):
    """Causal self-attention, cross-attention to the encoder, feed-forward; all pre-norm."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float,
        attention_dropout: float,
        horizon_dropout: float = 0.0,
    ):
        super().__init__()
        self.self_attention_norm = nn.LayerNorm(d_model)
        self.self_attention = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.cross_attention_norm = nn.LayerNorm(d_model)
        self.cross_attention = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.feed_forward_norm = nn.LayerNorm(d_model)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.dropout = Dropout(dropout)
        self.horizon_dropout = HorizonDropout(horizon_dropout)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        memory_mask: torch.Tensor | None = None,
        return_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """x: (B, M, D) horizon tokens, memory: (B, N, D) encoder output, memory_mask: (B, N).

        Returns (B, M, D) and, when asked, self-attention (B, heads, M, M) and
        cross-attention (B, heads, M, N) weights.
        """

        def residual(update: torch.Tensor) -> torch.Tensor:
            return self.horizon_dropout(self.dropout(update))

        h = self.self_attention_norm(x)
        attended = self.self_attention(h, h, h, causal=True, return_weights=return_weights)
        self_weights = cross_weights = None
        if return_weights:
            attended, self_weights = attended
        x = x + residual(attended)
        h = self.cross_attention_norm(x)
        attended = self.cross_attention(
            h, memory, memory, mask=_attend_mask(memory_mask), return_weights=return_weights
        )
        if return_weights:
            attended, cross_weights = attended
        x = x + residual(attended)
        x = x + residual(self.feed_forward(self.feed_forward_norm(x)))
        return x, self_weights, cross_weights


@dataclass
class EncoderOutput:
    hidden: torch.Tensor  # (B, N, D)
    self_attention: list[torch.Tensor]  # per layer (B, heads, N, N); empty unless asked


@dataclass
class DecoderOutput:
    hidden: torch.Tensor  # (B, M, D)
    self_attention: list[torch.Tensor]  # per layer (B, heads, M, M); empty unless asked
    cross_attention: list[torch.Tensor]  # per layer (B, heads, M, N); empty unless asked


class Encoder(nn.Module):
    def __init__(
        self,
        n_layers: int,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float,
        attention_dropout: float,
    ):
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderBlock(d_model, n_heads, d_ff, dropout, attention_dropout)
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model)

    def forward(
        self, x: torch.Tensor, key_mask: torch.Tensor | None = None, return_weights: bool = False
    ) -> EncoderOutput:
        """(B, N, D) context tokens, (B, N) key mask -> EncoderOutput."""
        weights = []
        for layer in self.layers:
            x, w = layer(x, key_mask, return_weights)
            if return_weights:
                weights.append(w)
        return EncoderOutput(self.norm(x), weights)


class Decoder(nn.Module):
    def __init__(
        self,
        n_layers: int,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float,
        attention_dropout: float,
        horizon_dropout: float = 0.0,
    ):
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderBlock(d_model, n_heads, d_ff, dropout, attention_dropout, horizon_dropout)
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        memory_mask: torch.Tensor | None = None,
        return_weights: bool = False,
    ) -> DecoderOutput:
        """(B, M, D) horizon tokens attending to (B, N, D) memory -> DecoderOutput."""
        self_weights, cross_weights = [], []
        for layer in self.layers:
            x, sw, cw = layer(x, memory, memory_mask, return_weights)
            if return_weights:
                self_weights.append(sw)
                cross_weights.append(cw)
        return DecoderOutput(self.norm(x), self_weights, cross_weights)
