"""What attention earns: forecasts with one kind of attention made uniform, and how peaked the
learned attention is.

Zeroing a layer's queries makes every score equal, so each query averages the values of all
the keys it may attend to (padding masks and causality still apply). The layer keeps its
projections, its feed-forward network and its residual path; it loses only its choice of
where to look. The gap between the learned and the uniform forecasts, on windows the model
was not trained on, is what that choice earns: the pipelines log it for every evaluated model
(`attention_earned_*`), the benchmarks print it (`--attention`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pandas as pd
import torch

from forecaster.attention import MultiHeadAttention
from forecaster.forecaster import Forecaster
from forecaster.model import PatchTransformer
from forecaster.outputs import AttentionMaps

# The kinds of attention, named as in AttentionMaps, and how reports spell them.
PARTS = ("encoder", "decoder_self", "cross")
LABELS = {
    "encoder": "encoder self-attention",
    "decoder_self": "decoder self-attention",
    "cross": "cross-attention",
}


def _layers(model: PatchTransformer, part: str) -> list[MultiHeadAttention]:
    if part == "encoder":
        return [block.self_attention for block in model.encoder.layers]
    if part == "decoder_self":
        return [block.self_attention for block in model.decoder.layers]
    if part == "cross":
        return [block.cross_attention for block in model.decoder.layers]
    raise ValueError(f"part: expected one of {PARTS}, got {part!r}")


@contextmanager
def uniform_attention(model: PatchTransformer, part: str) -> Iterator[None]:
    """Within the block, every layer of `part` (one of PARTS) attends uniformly.

    The model is changed in place for the duration of the block: not thread-safe.
    """

    def zero_queries(_module: torch.nn.Module, _inputs: object, output: torch.Tensor):
        return torch.zeros_like(output)

    handles = [m.query_proj.register_forward_hook(zero_queries) for m in _layers(model, part)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _entropy_ratio(
    weights: np.ndarray, allowed: np.ndarray, rows: np.ndarray | None = None
) -> float:
    """Mean entropy of the attention rows over the entropy of a uniform row over the same keys
    (1: uniform, 0: one key each), over the `rows` kept (all by default) that may see two keys
    or more; NaN when there are none. weights (..., queries, keys); `allowed` (True where a
    query may see a key) broadcasts to it, `rows` to weights[..., 0]."""
    allowed = np.broadcast_to(allowed, weights.shape)
    n_keys = allowed.sum(axis=-1)
    keep = n_keys > 1 if rows is None else (n_keys > 1) & rows
    if not keep.any():
        return math.nan
    seen = np.where(allowed, weights, 0.0)
    entropy = -(seen * np.log(np.where(seen > 0, seen, 1.0))).sum(axis=-1)
    return float((entropy[keep] / np.log(n_keys[keep])).mean())


def attention_summary(maps: AttentionMaps) -> dict[str, float]:
    """How far the learned attention is from uniform, per kind (last layer of each stack).

    - `*_entropy`: the entropy ratio of `_entropy_ratio` (1 means uniform);
    - `cross_row_distance`: the mean total-variation distance between the cross-attention rows
      of two horizon tokens of the same series and head (0: every horizon token looks at the
      context the same way; NaN with a single horizon token).
    """
    # Keys masked as padding get weight 0 from every query; a key any query weighs was allowed
    # (softmax underflow to 0 for one query stays a peaked row, not a masked key).
    encoder = maps.encoder[-1]  # (S, heads, N, N)
    context_seen = (encoder > 0).any(axis=-2, keepdims=True)  # (S, heads, 1, N)
    decoder = maps.decoder_self[-1]  # (S, heads, M, M)
    causal = np.tri(decoder.shape[-1], dtype=bool)  # query m sees horizon tokens 0..m
    cross = maps.cross[-1]  # (S, heads, M, N)
    rows = cross[:, :, :, None, :] - cross[:, :, None, :, :]  # (S, heads, M, M, N)
    n_tokens = cross.shape[2]
    pairs = n_tokens * (n_tokens - 1)
    distance = math.nan
    if pairs:
        distance = float((0.5 * np.abs(rows).sum(axis=-1).sum(axis=(-1, -2)) / pairs).mean())
    return {
        # Padded context tokens attend too, but only what real tokens do is of interest.
        "encoder_entropy": _entropy_ratio(encoder, context_seen, rows=context_seen[..., 0, :]),
        "decoder_self_entropy": _entropy_ratio(decoder, causal),
        "cross_entropy": _entropy_ratio(cross, (cross > 0).any(axis=-2, keepdims=True)),
        "cross_row_distance": distance,
    }


def attention_earned(
    forecaster: Forecaster,
    frame: pd.DataFrame,
    *,
    n_windows: int,
    horizon: int,
    learned_mase: float | None = None,
) -> dict[str, float]:
    """Per kind of attention (PARTS), the relative rise of the backtest MASE over the last
    `n_windows` horizons of `frame` when that attention is made uniform: 0.1 means the learned
    attention lowers the error by a tenth of it; about 0 means it earns nothing there.
    `learned_mase`: the model's own backtest MASE on the same windows, when already known."""
    if learned_mase is None:
        learned = forecaster.backtest(frame, n_windows=n_windows, horizon=horizon)
        learned_mase = learned.metrics["mase"]
    if not learned_mase > 0:  # a perfect (or unscorable) backtest leaves nothing to earn
        return dict.fromkeys(PARTS, math.nan)
    earned = {}
    for part in PARTS:
        with uniform_attention(forecaster.model, part):
            uniform = forecaster.backtest(frame, n_windows=n_windows, horizon=horizon)
        earned[part] = uniform.metrics["mase"] / learned_mase - 1
    return earned
