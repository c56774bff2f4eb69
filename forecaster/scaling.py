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

# Below this standard deviation (relative to the level) a context counts as constant.
_RELATIVE_TOLERANCE = 1e-10


@dataclass(frozen=True)
class InstanceStats:
    """Location and scale of each row's observed context, in the input's dtype."""

    loc: torch.Tensor  # (B, 1)
    scale: torch.Tensor  # (B, 1), > 0


class InstanceScaler(nn.Module):
    """Standardise each row by the mean and std of its observed values; no parameters."""

    def forward(
        self, values: torch.Tensor, observed: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, InstanceStats]:
        """Normalise (B, L) values whose observed steps are True in `observed` (B, L).

        Returns the normalised values in `dtype` (0 at unobserved steps) and the statistics.
        A row with one observed value, or a constant row, is scaled by its level (by 1 when the
        level is 0) instead of a zero standard deviation.
        """
        stats = self.statistics(values, observed)
        normalized = (values - stats.loc) / stats.scale
        normalized = torch.where(observed, normalized, torch.zeros_like(normalized))
        return normalized.to(dtype), stats

    @staticmethod
    def statistics(values: torch.Tensor, observed: torch.Tensor) -> InstanceStats:
        """Mean and std of the observed values of each row (B, L) -> (B, 1) each."""
        # Masked values may be anything (even NaN): select before any arithmetic on them.
        zeros = torch.zeros_like(values)
        count = observed.sum(dim=1, keepdim=True).to(values.dtype).clamp(min=1.0)
        loc = torch.where(observed, values, zeros).sum(dim=1, keepdim=True) / count
        centered = torch.where(observed, values - loc, zeros)
        std = torch.sqrt((centered**2).sum(dim=1, keepdim=True) / count)
        level = loc.abs()
        fallback = torch.where(level > 0, level, torch.ones_like(level))
        degenerate = std <= _RELATIVE_TOLERANCE * (1.0 + level)
        return InstanceStats(loc=loc, scale=torch.where(degenerate, fallback, std))

    @staticmethod
    def denormalize(y: torch.Tensor, stats: InstanceStats) -> torch.Tensor:
        """(B, H) or (B, H, Q) in normalised units -> the input's scale and dtype."""
        extra = (1,) * (y.dim() - 2)
        loc = stats.loc.view(-1, 1, *extra)
        scale = stats.scale.view(-1, 1, *extra)
        return y.to(loc.dtype) * scale + loc
