"""All scaling in one place.

Two levels, as in the long-term forecasting literature:
- `SeriesScaler`: one mean/std per series, fitted on the training data and saved with the
  model. Training windows live in this space so every series weighs the same in the loss.
- `RevIN`: reversible instance normalisation inside the model. Each input window is
  standardised by its own mean/std and the forecast is mapped back, which makes the model
  robust to level shifts between training and serving.

Because RevIN removes each window's mean and scale, a forecast does not depend on the
series-level scaling at prediction time; series unseen in training are scaled by their own
history.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


@dataclass
class InstanceStats:
    mean: torch.Tensor  # (B, 1)
    std: torch.Tensor  # (B, 1)


class RevIN(nn.Module):
    """Reversible instance normalisation (Kim et al., ICLR 2022) with a learned affine map."""

    def __init__(self, eps: float = 1e-5, affine: bool = True):
        super().__init__()
        self.eps = eps
        self.affine = affine
        if affine:
            self.weight = nn.Parameter(torch.ones(1))
            self.bias = nn.Parameter(torch.zeros(1))

    def normalize(self, x: torch.Tensor) -> tuple[torch.Tensor, InstanceStats]:
        """x: (B, L) -> normalised (B, L) and the statistics to undo it."""
        mean = x.mean(dim=1, keepdim=True).detach()
        std = torch.sqrt(x.var(dim=1, keepdim=True, unbiased=False) + self.eps).detach()
        x = (x - mean) / std
        if self.affine:
            x = x * self.weight + self.bias
        return x, InstanceStats(mean, std)

    def denormalize(self, y: torch.Tensor, stats: InstanceStats) -> torch.Tensor:
        """y: (B, H) or (B, H, Q) in normalised space -> the input's scale."""
        extra = (1,) * (y.dim() - 2)
        mean = stats.mean.view(-1, 1, *extra)
        std = stats.std.view(-1, 1, *extra)
        if self.affine:
            y = (y - self.bias) / (self.weight + self.eps * self.eps)
        return y * std + mean


@dataclass
class SeriesScaler:
    """Per-series standardisation fitted on training data; JSON-serialisable state."""

    means: dict[str, float]
    stds: dict[str, float]

    @classmethod
    def fit(cls, ids: np.ndarray, values: np.ndarray) -> SeriesScaler:
        """ids, values: flat arrays of one long frame's `unique_id` and `y` columns."""
        means: dict[str, float] = {}
        stds: dict[str, float] = {}
        order = np.argsort(ids, kind="stable")
        sorted_ids, sorted_values = ids[order], values[order]
        boundaries = np.flatnonzero(sorted_ids[1:] != sorted_ids[:-1]) + 1
        for chunk_ids, chunk in zip(
            np.split(sorted_ids, boundaries), np.split(sorted_values, boundaries), strict=True
        ):
            std = float(chunk.std())
            means[str(chunk_ids[0])] = float(chunk.mean())
            stds[str(chunk_ids[0])] = std if std > 1e-8 else 1.0
        return cls(means, stds)

    def stats_for(self, series_id: str, history: np.ndarray) -> tuple[float, float]:
        """Mean/std of a known series, else of the given history (see module docstring)."""
        if series_id in self.means:
            return self.means[series_id], self.stds[series_id]
        std = float(history.std())
        return float(history.mean()), std if std > 1e-8 else 1.0

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {"means": self.means, "stds": self.stds}

    @classmethod
    def from_dict(cls, state: dict[str, dict[str, float]]) -> SeriesScaler:
        return cls(
            {str(k): float(v) for k, v in state["means"].items()},
            {str(k): float(v) for k, v in state["stds"].items()},
        )
