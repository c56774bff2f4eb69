"""Sliding windows over many series without copying a series once per window.

All series are concatenated into one float32 array; a window is just a start offset into it.
A batch gathers its windows with one fancy-index (B, L + H), so memory is the data plus one
batch, whatever the number of windows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from forecaster.config import ModelConfig
from forecaster.features import CALENDAR_FEATURES, calendar_features
from forecaster.scaling import SeriesScaler


@dataclass
class SeriesPanel:
    """Many series laid end to end, scaled, with their covariates."""

    values: np.ndarray  # (T,) float32, scaled per series
    covariates: np.ndarray  # (T, F) float32; F may be 0
    series_ids: list[str]  # one per series, in panel order
    offsets: np.ndarray  # (n_series + 1,) start of each series in `values`

    @classmethod
    def from_frame(
        cls, frame: pd.DataFrame, config: ModelConfig, scaler: SeriesScaler
    ) -> SeriesPanel:
        """frame: a validated long frame (grouped by series, time-ordered)."""
        ids = frame["unique_id"].to_numpy()
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        offsets = np.r_[starts, len(ids)]
        y = frame["y"].to_numpy(dtype=np.float64)
        values = np.empty(len(y), dtype=np.float32)
        series_ids = [str(ids[s]) for s in starts]
        for series_id, start, end in zip(series_ids, offsets[:-1], offsets[1:], strict=True):
            mean, std = scaler.stats_for(series_id, y[start:end])
            values[start:end] = (y[start:end] - mean) / std
        return cls(values, covariate_matrix(frame, config), series_ids, offsets)

    def window_starts(self, window_length: int) -> np.ndarray:
        """Start offsets of every stride-1 window of `window_length` inside one series."""
        lengths = np.diff(self.offsets) - window_length + 1
        lengths = np.maximum(lengths, 0)
        series_start = np.repeat(self.offsets[:-1], lengths)
        within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        return series_start + within


def covariate_matrix(frame: pd.DataFrame, config: ModelConfig) -> np.ndarray:
    """(T, F) float32: calendar features of `ds`, then the configured covariate columns."""
    parts = []
    if config.calendar_features:
        columns = [CALENDAR_FEATURES.index(name) for name in config.calendar_features]
        parts.append(calendar_features(frame["ds"])[:, columns])
    if config.covariates:
        parts.append(frame[list(config.covariates)].to_numpy(dtype=np.float32))
    if not parts:
        return np.zeros((len(frame), 0), dtype=np.float32)
    return np.concatenate(parts, axis=1).astype(np.float32, copy=False)


@dataclass
class WindowBatch:
    past_values: torch.Tensor  # (B, L)
    future_values: torch.Tensor  # (B, H)
    past_covariates: torch.Tensor | None  # (B, L, F)
    future_covariates: torch.Tensor | None  # (B, H, F)

    def to(self, device: torch.device) -> WindowBatch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        return WindowBatch(
            move(self.past_values),
            move(self.future_values),
            move(self.past_covariates),
            move(self.future_covariates),
        )


def gather_windows(
    panel: SeriesPanel, starts: np.ndarray, context_length: int, horizon: int
) -> WindowBatch:
    """The windows beginning at `starts`: (B, L) history and (B, H) targets, plus covariates."""
    index = starts[:, None] + np.arange(context_length + horizon)  # (B, L + H)
    values = torch.from_numpy(panel.values[index])
    past_cov = future_cov = None
    if panel.covariates.shape[1]:
        cov = torch.from_numpy(panel.covariates[index])  # (B, L + H, F)
        past_cov, future_cov = cov[:, :context_length], cov[:, context_length:]
    return WindowBatch(values[:, :context_length], values[:, context_length:], past_cov, future_cov)
