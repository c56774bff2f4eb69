"""Sliding windows over many series without copying a series once per window.

All series are laid end to end in one float64 array, NaN where a value is missing. A window is
named by its origin: the index in that array of its first forecast step. Its context is the
`context_length` steps before the origin; where those fall before the series begins they are
padding, marked unobserved, so a series shorter than the context still gives windows. A batch
gathers its windows with one fancy-index (B, L + H), so memory is the data plus one batch,
whatever the number of windows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from forecaster.config import LossUnit, ModelConfig
from forecaster.metrics import panel_mase_scales
from forecaster.time_axis import CALENDAR_FEATURES, calendar_features
from forecaster.validation import ValidatedFrame

# A long frame or its columns as arrays: both index by column name.
LongColumns = pd.DataFrame | Mapping[str, Any]


@dataclass
class SeriesPanel:
    """Many series laid end to end, in their own units, with their covariates."""

    values: np.ndarray  # (T,) float64, NaN where not observed
    covariates: np.ndarray  # (T, F) float32; F may be 0
    series_ids: list[str]  # one per series, in panel order
    offsets: np.ndarray  # (n_series + 1,) start of each series in `values`
    loss_scale: np.ndarray  # (n_series,) the unit in which each series' errors are counted

    @classmethod
    def from_validated(
        cls,
        validated: ValidatedFrame,
        config: ModelConfig,
        unobserved: np.ndarray | None = None,
    ) -> SeriesPanel:
        """The panel of a validated history (grouped by series, on a regular grid, NaN =
        missing), taking its series boundaries from the validation; the rows where
        `unobserved` (bool, one per row) is True read as missing too."""
        values = np.asarray(validated.columns["y"], dtype=np.float64)
        if unobserved is not None:
            values = np.where(unobserved, np.nan, values)
        return cls(
            values=values,
            covariates=covariate_matrix(validated.columns, config),
            series_ids=validated.series_ids,
            offsets=validated.offsets,
            loss_scale=series_scales(
                values, validated.offsets, config.loss_unit, config.season_length or 1
            ),
        )

    def window_origins(
        self, horizon: int, min_context: int | np.ndarray = 1, min_targets: int | None = None
    ) -> np.ndarray:
        """Origins of every stride-1 window with at least `min_targets` of its `horizon`
        targets inside its series (None: all of them).

        The first origin of a series leaves `min_context` steps of history before it; earlier
        context steps are padding. Targets past the series' end are unobserved
        (`gather_windows`). A series shorter than min_context + min_targets gives none.
        """
        lengths = np.diff(self.offsets)
        targets = horizon if min_targets is None else min(min_targets, horizon)
        counts = np.maximum(lengths - targets - min_context + 1, 0)
        first = np.repeat(self.offsets[:-1] + min_context, counts)
        within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        return first + within

    def training_origins(self, horizon: int) -> np.ndarray:
        """Origins of every window training reads: one step of history and one target at
        least, the targets past the series' end unobserved.

        A series shorter than context + horizon is forecast from more history than any
        window with a whole horizon of targets gives it: a 30-point series with H = 12 trains
        on contexts of at most 18 points, then forecasts from 30. Windows whose horizon runs
        past the end reach those longer contexts for their near steps (200 hourly sensors of
        18 readings, H = 12: holdout sMAPE 22.5 -> 7.9, against 10.8 for the history's mean
        and 12.8 for naive; README, Short catalogues), and series shorter than a horizon
        train at all.
        """
        return self.window_origins(horizon, min_targets=1)

    def last_origins(self) -> np.ndarray:
        """The origin just after each series' last step: where its forecast starts."""
        return self.offsets[1:].copy()

    def series_of(self, origins: np.ndarray) -> np.ndarray:
        """Index of the series each origin belongs to (an origin at a series' end counts too)."""
        return np.searchsorted(self.offsets, origins - 1, side="right") - 1


def series_scales(
    values: np.ndarray, offsets: np.ndarray, unit: LossUnit, season: int = 1
) -> np.ndarray:
    """Per series: the unit its errors are counted in (see ModelConfig.loss_unit).

    "rms" is the root mean square of its observed values; "std" their std, or the mean's
    magnitude for a constant series. A series whose unit would be 0 (all zeros) gets 1.
    "rms_mase" is the geometric mean of the "rms" unit and MASE's scale over `season` steps,
    the metric's own (`forecaster.metrics.panel_mase_scales`); a series without one (no
    change between observed values) keeps its "rms" unit.
    Training counts errors in these units, so every series weighs the same in the loss and,
    within a series, windows weigh by their error in the series' own units.
    """
    observed = ~np.isnan(values)
    codes = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    count = np.bincount(codes, weights=observed, minlength=len(offsets) - 1)
    clean = np.where(observed, values, 0.0)
    total = np.bincount(codes, weights=clean, minlength=len(offsets) - 1)
    mean = total / np.maximum(count, 1)
    centered = np.where(observed, values - mean[codes], 0.0)
    std = np.sqrt(
        np.bincount(codes, weights=centered**2, minlength=len(offsets) - 1) / np.maximum(count, 1)
    )
    level = np.abs(mean)
    if unit in ("rms", "rms_mase"):
        scale = np.sqrt(std**2 + level**2)
        scale = np.where(scale > 0, scale, 1.0)
        if unit == "rms":
            return scale
        return np.sqrt(scale * mase_units(values, offsets, season, scale))
    fallback = np.where(level > 0, level, 1.0)
    # Relative, so that a series in small units that moves keeps its std; looser than the
    # scaler's bound (`constant_tolerance`) because numpy sums a whole series sequentially.
    return np.where(std > 1e-10 * level, std, fallback)


def mase_units(
    values: np.ndarray, offsets: np.ndarray, season: int, fallback: np.ndarray
) -> np.ndarray:
    """Per series: MASE's scale over `season` steps (`forecaster.metrics.panel_mase_scales`,
    the metric's own), or its `fallback` (n_series,) unit where it has none (no change
    between observed values)."""
    change = panel_mase_scales(values, offsets, season)
    return np.where(np.isnan(change), fallback, change)


def covariate_matrix(frame: LongColumns, config: ModelConfig) -> np.ndarray:
    """(T, F) float32: calendar features of `ds`, then the configured covariate columns."""
    parts = []
    if config.calendar_features:
        columns = [CALENDAR_FEATURES.index(name) for name in config.calendar_features]
        parts.append(calendar_features(frame["ds"])[:, columns])
    for name in config.covariates:
        parts.append(np.nan_to_num(np.asarray(frame[name], dtype=np.float32), nan=0.0)[:, None])
    if not parts:
        return np.zeros((len(frame["ds"]), 0), dtype=np.float32)
    return np.concatenate(parts, axis=1).astype(np.float32, copy=False)


@dataclass
class WindowBatch:
    """Model inputs and targets of B windows. Unobserved values are 0 and masked False."""

    past_values: torch.Tensor  # (B, L) float64
    past_observed_mask: torch.Tensor  # (B, L) bool
    future_values: torch.Tensor  # (B, H) float64
    future_observed_mask: torch.Tensor  # (B, H) bool
    past_covariates: torch.Tensor | None  # (B, L, F)
    future_covariates: torch.Tensor | None  # (B, H, F)
    loss_scale: torch.Tensor  # (B, 1) float64, the series' error unit

    def to(self, device: torch.device) -> WindowBatch:
        """Copy every tensor to `device` (asynchronously from pinned memory on CUDA)."""
        pin = device.type == "cuda"

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            if pin:
                t = t.pin_memory()
            return t.to(device, non_blocking=pin)

        return WindowBatch(
            move(self.past_values),
            move(self.past_observed_mask),
            move(self.future_values),
            move(self.future_observed_mask),
            move(self.past_covariates),
            move(self.future_covariates),
            move(self.loss_scale),
        )


def gather_windows(
    panel: SeriesPanel, origins: np.ndarray, context_length: int, horizon: int
) -> WindowBatch:
    """The windows at `origins`: (B, L) context and (B, H) targets with their masks.

    Context steps before the series' first step are padding; target steps past its end (only
    when forecasting from `last_origins`) are unobserved. Covariates of those steps are 0.
    """
    series = panel.series_of(origins)
    first = panel.offsets[series][:, None]
    end = panel.offsets[series + 1][:, None]
    index = origins[:, None] + np.arange(-context_length, horizon)  # (B, L + H)
    inside = (index >= first) & (index < end)
    clipped = np.clip(index, first, end - 1)
    values = panel.values[clipped]
    observed = inside & ~np.isnan(values)
    values = np.where(observed, values, 0.0)
    past_cov = future_cov = None
    if panel.covariates.shape[1]:
        cov = np.where(inside[..., None], panel.covariates[clipped], 0.0).astype(np.float32)
        cov = torch.from_numpy(cov)  # (B, L + H, F)
        past_cov, future_cov = cov[:, :context_length], cov[:, context_length:]
    values_t = torch.from_numpy(values)
    observed_t = torch.from_numpy(observed)
    return WindowBatch(
        past_values=values_t[:, :context_length],
        past_observed_mask=observed_t[:, :context_length],
        future_values=values_t[:, context_length:],
        future_observed_mask=observed_t[:, context_length:],
        past_covariates=past_cov,
        future_covariates=future_cov,
        loss_scale=torch.from_numpy(panel.loss_scale[series][:, None]),
    )


def with_outages(
    batch: WindowBatch, probability: float, max_span: int, rng: np.random.Generator
) -> WindowBatch:
    """Training augmentation: each window loses, with `probability`, one span of 1 ..
    `max_span` context steps (marked unobserved), ending at the forecast origin in half the
    cases (the feed is down until now) and anywhere in the context otherwise.

    A model trained only on complete windows never learns what a gap looks like; live feeds
    have them. A window keeps at least two observed steps.
    """
    observed = batch.past_observed_mask
    size, length = observed.shape
    span = np.minimum(rng.integers(1, max_span + 1, size), length)
    end = np.where(rng.random(size) < 0.5, length, rng.integers(span, length + 1))  # exclusive
    steps = np.arange(length)
    lost = (rng.random(size) < probability)[:, None] & (
        (steps >= (end - span)[:, None]) & (steps < end[:, None])
    )  # (B, L)
    lost_t = torch.from_numpy(lost).to(observed.device)
    kept = observed & ~lost_t
    enough = kept.sum(dim=1, keepdim=True) >= 2
    kept = torch.where(enough, kept, observed)
    return dataclasses.replace(
        batch,
        past_values=torch.where(kept, batch.past_values, torch.zeros_like(batch.past_values)),
        past_observed_mask=kept,
    )


def with_frequency_masking(
    batch: WindowBatch, probability: float, rate: float, rng: np.random.Generator
) -> WindowBatch:
    """Training augmentation (FrAug's FreqMask, Chen et al. 2023): each complete window
    (context and targets all observed) is, with `probability`, replaced by its context and
    targets joined, with a share `rate` of their Fourier components zeroed and split again.

    The context and its targets stay one consistent signal, so the model sees plausible
    variations of the few patterns a year of training data holds. Windows with padding or
    gaps are left as they are: a padded step has no value to transform.
    """
    complete = batch.past_observed_mask.all(dim=1) & batch.future_observed_mask.all(dim=1)
    if not bool(complete.any()):  # draws nothing: data of short series trains as without it
        return batch
    chosen = complete & torch.from_numpy(rng.random(len(complete)) < probability)
    if not bool(chosen.any()):
        return batch
    length = batch.past_values.shape[1]
    joined = torch.cat([batch.past_values, batch.future_values], dim=1)[chosen]  # (b, L + H)
    spectrum = torch.fft.rfft(joined, dim=1)  # (b, (L + H) // 2 + 1)
    drop = torch.from_numpy(rng.random(spectrum.shape) < rate)
    joined = torch.fft.irfft(spectrum.masked_fill(drop, 0), n=joined.shape[1], dim=1)
    past, future = batch.past_values.clone(), batch.future_values.clone()
    past[chosen], future[chosen] = joined[:, :length], joined[:, length:]
    return dataclasses.replace(batch, past_values=past, future_values=future)


def with_history(batch: WindowBatch, keep: torch.Tensor) -> WindowBatch:
    """The windows as if each series had begun `keep` (B,) steps before the forecast origin:
    the earlier context steps become padding (unobserved), the targets stay.

    Calibrates intervals for short histories on windows whose real history is long.
    """
    length = batch.past_observed_mask.shape[1]
    steps = torch.arange(length, device=keep.device)
    kept = batch.past_observed_mask & (steps >= length - keep.unsqueeze(-1))  # (B, L)
    return dataclasses.replace(
        batch,
        past_values=torch.where(kept, batch.past_values, torch.zeros_like(batch.past_values)),
        past_observed_mask=kept,
    )
