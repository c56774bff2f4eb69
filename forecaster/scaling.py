"""The one normalisation: a mask-aware instance scaler inside the model.

Each window's context is standardised by the mean and standard deviation of its observed
values (as Hugging Face's `PatchTSTStdScaler` does with `past_observed_mask`), the model works in
that space, and its forecast is mapped back. Unobserved steps (left padding of a short series,
NaNs, missing timestamps) take no part in the statistics and are set to 0 afterwards, so their
values cannot leak into the forecast.

The statistics are computed in the input's dtype: windows arrive as float64, so a series at
1e9 that moves by units keeps its precision; the normalised values are then cast to the model's
dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


def constant_tolerance(dtype: torch.dtype) -> float:
    """Below this standard deviation relative to the level, values count as constant: torch
    sums pairwise, so the mean of n equal values is off by a few eps of the level (below 1e-15
    for float64 contexts of 336 to 10,000 steps), which leaves a std of that order; the bound
    is 100 eps (2.2e-14 in float64). Relative, not absolute: a series in units of 1e-12 that
    moves is not constant, and neither is a reading at 1e12 that moves by 1."""
    return 100 * torch.finfo(dtype).eps


@dataclass(frozen=True)
class InstanceStats:
    """Location and scale of each row's observed context, in the input's dtype."""

    loc: torch.Tensor  # (B, 1)
    scale: torch.Tensor  # (B, 1), > 0
    # (B, 1), >= 1: the unit the intervals' offsets are learned in, in multiples of `scale`
    # (see InstanceScaler.statistics).
    band_unit: torch.Tensor


class InstanceScaler(nn.Module):
    """Standardise each row by the mean and std of its observed values; no parameters.

    `band_season`: a row that has observed fewer steps than this learns its intervals in its
    level's magnitude where that exceeds its std (`InstanceStats.band_unit`); 1: never.
    """

    def __init__(self, band_season: int = 1):
        super().__init__()
        self.band_season = band_season

    def forward(
        self, values: torch.Tensor, observed: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, InstanceStats]:
        """Normalise (B, L) values whose observed steps are True in `observed` (B, L).

        Returns the normalised values in `dtype` (0 at unobserved steps) and the statistics.
        A row whose std is 0 cannot be scaled by it. One that has not moved over at least
        half its context (n >= L / 2 equal observed values: a stuck meter, a fixed fee) is
        scaled by its level / n, so it forecasts flat with a narrow band; by its level, a
        series that had stood at 1e6 got a 0.1-0.9 band of [-4e5, 2e6]. Fewer equal values,
        as a new series' first ones, say little of how it will move and keep the level as the
        scale (docs/model-choices.md). An all-zero row (an intermittent series' quiet weeks)
        is scaled by 1, the unit its counts come in.
        """
        stats = self.statistics(values, observed, self.band_season)
        normalized = (values - stats.loc) / stats.scale
        normalized = torch.where(observed, normalized, torch.zeros_like(normalized))
        return normalized.to(dtype), stats

    @staticmethod
    def statistics(
        values: torch.Tensor, observed: torch.Tensor, band_season: int = 1
    ) -> InstanceStats:
        """Mean and std of the observed values of each row (B, L) -> (B, 1) each.

        The band unit is 1 (the std), except in a row that has observed fewer than
        `band_season` steps and moved less than its level: there the level. A few steps of a
        cycle understate how far it swings, and a short series trains on windows of one step
        of history, then two, then three...: offsets learned in their std are huge, and a
        forecast from a longer history reads them too. On 200 hourly sensors of 18 readings
        (H = 12) the 0.1-0.9 band was 31 times the history's std wide and held 97.5 % of the
        holdout; with this unit 4.4 times and 83 % (README, Short catalogues).
        """
        # Masked values may be anything (even NaN): select before any arithmetic on them.
        zeros = torch.zeros_like(values)
        count = observed.sum(dim=1, keepdim=True).to(values.dtype).clamp(min=1.0)
        loc = torch.where(observed, values, zeros).sum(dim=1, keepdim=True) / count
        centered = torch.where(observed, values - loc, zeros)
        std = torch.sqrt((centered**2).sum(dim=1, keepdim=True) / count)
        level = loc.abs()
        stood_still = 2 * count >= values.shape[1]
        fallback = torch.where(stood_still, level / count, level)
        fallback = torch.where(level > 0, fallback, torch.ones_like(level))
        degenerate = std <= constant_tolerance(values.dtype) * level
        understated = (count < band_season) & ~degenerate & (level > std)
        band_unit = torch.where(understated, level / torch.where(understated, std, 1.0), 1.0)
        return InstanceStats(
            loc=loc, scale=torch.where(degenerate, fallback, std), band_unit=band_unit
        )

    @staticmethod
    def denormalize(y: torch.Tensor, stats: InstanceStats) -> torch.Tensor:
        """(B, H) or (B, H, Q) in normalised units -> the input's scale and dtype."""
        extra = (1,) * (y.dim() - 2)
        loc = stats.loc.view(-1, 1, *extra)
        scale = stats.scale.view(-1, 1, *extra)
        return y.to(loc.dtype) * scale + loc
