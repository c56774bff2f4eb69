"""Typed outputs of the model and of the high-level API."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from forecaster.data import quantile_column


def no_glitches(n_series: int) -> np.ndarray:
    """`ForecastArrays.glitches` for `n_series` series none of which had a glitch."""
    out = np.empty(n_series, dtype=object)
    none = np.empty(0, dtype="datetime64[ns]")
    for row in range(n_series):
        out[row] = none
    return out


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
    # Per series: ISO timestamp of the first context step, padding included; None when the
    # padded context reaches before 1677-09-21 (yearly data: 336 steps back from before 2013).
    context_starts: list[str | None]
    patch_length: int  # steps per token; token i covers steps [i*stride, i*stride + patch_length)
    patch_stride: int


@dataclass(frozen=True)
class ForecastArrays:
    """Forecasts of S series as arrays: what `Forecaster.forecast` returns.

    Shapes use S series, H horizon, Q quantile levels.
    """

    series_ids: np.ndarray  # (S,) object: the ids as validated (text)
    origins: np.ndarray  # (S,) datetime64[ns]: each series' last history timestamp
    timestamps: np.ndarray  # (S, H) datetime64[ns], the steps after each series' end
    mean: np.ndarray  # (S, H) float64
    quantiles: np.ndarray  # (S, H, Q) float64; Q = len(levels), may be 0
    levels: tuple[float, ...]  # the quantile level of each slice of `quantiles`
    # (S,) object: per series, the timestamps (a datetime64[ns] array, mostly empty) of the
    # readings the forecast did not use because they were read as glitches
    # (`TrainConfig.glitch_threshold`).
    glitches: np.ndarray

    def __len__(self) -> int:
        return len(self.series_ids)

    def rows(self, index: slice | np.ndarray) -> ForecastArrays:
        """The forecasts of the series at `index` (a slice or integer positions)."""
        return ForecastArrays(
            self.series_ids[index],
            self.origins[index],
            self.timestamps[index],
            self.mean[index],
            self.quantiles[index],
            self.levels,
            self.glitches[index],
        )

    def select(self, horizon: int, levels: Sequence[float]) -> ForecastArrays:
        """The first `horizon` steps and the quantile `levels` (each one of `self.levels`)."""
        picks = [self.levels.index(q) for q in levels]
        return ForecastArrays(
            self.series_ids,
            self.origins,
            self.timestamps[:, :horizon],
            self.mean[:, :horizon],
            self.quantiles[:, :horizon, picks],
            tuple(levels),
            self.glitches,
        )

    @staticmethod
    def concat(parts: Sequence[ForecastArrays]) -> ForecastArrays:
        """The series of every part, in order (parts with the same levels and horizon)."""
        if len(parts) == 1:
            return parts[0]
        return ForecastArrays(
            np.concatenate([p.series_ids for p in parts]),
            np.concatenate([p.origins for p in parts]),
            np.concatenate([p.timestamps for p in parts]),
            np.concatenate([p.mean for p in parts]),
            np.concatenate([p.quantiles for p in parts]),
            parts[0].levels,
            np.concatenate([p.glitches for p in parts]),
        )

    def to_frame(self) -> pd.DataFrame:
        """Long frame `unique_id, ds, mean` plus one `q<level>` column per level."""
        s, h = self.mean.shape
        out = {
            "unique_id": pd.array(np.repeat(self.series_ids, h), dtype="string"),
            "ds": self.timestamps.reshape(s * h),
            "mean": self.mean.reshape(s * h),
        }
        for k, level in enumerate(self.levels):
            out[quantile_column(level)] = self.quantiles[:, :, k].reshape(s * h)
        return pd.DataFrame(out)

    def to_arrow(self) -> pa.Table:
        """`to_frame()`'s table as Arrow, built from the arrays directly (for file writers:
        no DataFrame in between)."""
        s, h = self.mean.shape
        ids = pa.array(self.series_ids.astype(str), type=pa.string())
        out = {
            "unique_id": ids.take(pa.array(np.repeat(np.arange(s), h))),
            "ds": pa.array(self.timestamps.reshape(s * h)),
            "mean": pa.array(self.mean.reshape(s * h)),
        }
        for k, level in enumerate(self.levels):
            out[quantile_column(level)] = pa.array(self.quantiles[:, :, k].reshape(s * h))
        return pa.table(out)

    def glitch_frame(self) -> pd.DataFrame:
        """Long frame `unique_id, ds`: one row per reading read as a glitch, series by series
        in time order (empty when there is none)."""
        counts = np.fromiter((len(g) for g in self.glitches), dtype=np.int64, count=len(self))
        stamps = (
            np.concatenate(list(self.glitches))
            if counts.sum()
            else np.empty(0, dtype="datetime64[ns]")
        )
        return pd.DataFrame(
            {
                "unique_id": pd.array(np.repeat(self.series_ids, counts), dtype="string"),
                "ds": stamps.astype("datetime64[ns]"),
            }
        )
