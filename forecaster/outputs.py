"""Typed outputs of the model and of the high-level API."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class ModelOutput:
    """What `PatchTransformer.forward` returns, in the input's scale.

    Shapes use B batch (series), H horizon, Q quantiles.
    """

    mean: torch.Tensor  # (B, H) point forecast
    quantiles: torch.Tensor | None  # (B, H, Q), or None when the model has no quantile head


@dataclass(frozen=True)
class AttentionMaps:
    """Attention weights behind one forecast per series, averaged over nothing.

    Shapes use S series, heads attention heads, N encoder tokens (context patches),
    M decoder tokens (horizon patches). Each list holds one array per layer.
    """

    series_ids: list[str]
    encoder: list[np.ndarray]  # per encoder layer: (S, heads, N, N) self-attention
    decoder_self: list[np.ndarray]  # per decoder layer: (S, heads, M, M) causal self-attention
    cross: list[np.ndarray]  # per decoder layer: (S, heads, M, N) decoder -> encoder
    context_starts: list[str]  # per series: ISO timestamp of the first context step
    patch_length: int  # steps per token; token i covers steps [i*stride, i*stride + patch_length)
    patch_stride: int
