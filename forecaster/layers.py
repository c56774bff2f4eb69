"""Transformer building blocks: positional encoding, feed-forward, encoder and decoder stacks.

Blocks are pre-norm (LayerNorm before each sub-layer, residual after), which trains stably
without learning-rate warmup tricks and lets the stacks end with one final LayerNorm.
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


class FeedForward(nn.Module):
    """Position-wise two-layer network with GELU."""

    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D)."""
        return self.net(x)


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
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, return_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, N, D) -> ((B, N, D), weights (B, heads, N, N) or None)."""
        h = self.self_attention_norm(x)
        attended = self.self_attention(h, h, h, return_weights=return_weights)
        weights = None
        if return_weights:
            attended, weights = attended
        x = x + self.dropout(attended)
        x = x + self.dropout(self.feed_forward(self.feed_forward_norm(x)))
        return x, weights


class DecoderBlock(nn.Module):
    """Causal self-attention, cross-attention to the encoder, feed-forward; all pre-norm."""

    def __init__(
        self, d_model: int, n_heads: int, d_ff: int, dropout: float, attention_dropout: float
    ):
        super().__init__()
        self.self_attention_norm = nn.LayerNorm(d_model)
        self.self_attention = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.cross_attention_norm = nn.LayerNorm(d_model)
        self.cross_attention = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.feed_forward_norm = nn.LayerNorm(d_model)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, return_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """x: (B, M, D) horizon tokens, memory: (B, N, D) encoder output.

        Returns (B, M, D) and, when asked, self-attention (B, heads, M, M) and
        cross-attention (B, heads, M, N) weights.
        """
        h = self.self_attention_norm(x)
        attended = self.self_attention(h, h, h, causal=True, return_weights=return_weights)
        self_weights = cross_weights = None
        if return_weights:
            attended, self_weights = attended
        x = x + self.dropout(attended)
        h = self.cross_attention_norm(x)
        attended = self.cross_attention(h, memory, memory, return_weights=return_weights)
        if return_weights:
            attended, cross_weights = attended
        x = x + self.dropout(attended)
        x = x + self.dropout(self.feed_forward(self.feed_forward_norm(x)))
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

    def forward(self, x: torch.Tensor, return_weights: bool = False) -> EncoderOutput:
        """(B, N, D) context tokens -> EncoderOutput."""
        weights = []
        for layer in self.layers:
            x, w = layer(x, return_weights)
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
    ):
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderBlock(d_model, n_heads, d_ff, dropout, attention_dropout)
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, return_weights: bool = False
    ) -> DecoderOutput:
        """(B, M, D) horizon tokens attending to (B, N, D) memory -> DecoderOutput."""
        self_weights, cross_weights = [], []
        for layer in self.layers:
            x, sw, cw = layer(x, memory, return_weights)
            if return_weights:
                self_weights.append(sw)
                cross_weights.append(cw)
        return DecoderOutput(self.norm(x), self_weights, cross_weights)
