"""Split: time-ordered train / validation / test per series, and the backtest windows.

Per series of n points (H the horizon, L the context length):

    [ train ............ | val (val_length) | test (backtest_windows * H) ]

``val`` and ``test`` are handed out with up to L points of history in front, as the
Forecaster reads them. A series needs 2 training points (one training window: a step of
history, then a target; shorter contexts are padded and a horizon past the training part's
end is unobserved), plus its validation and test points. The backtest scores ``backtest_windows`` consecutive horizons of ``test``; the last of
them is the holdout window on which promotion compares challenger and champion. The model
never trains on ``test``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from forecaster import ModelConfig
from forecaster.data import time_split
from forecaster.time_axis import time_label, time_point


@dataclass(frozen=True)
class SplitPlan:
    """How many points each part takes."""

    context_length: int
    horizon: int
    val_length: int
    backtest_windows: int

    @property
    def test_length(self) -> int:
        return self.backtest_windows * self.horizon

    @property
    def min_train_length(self) -> int:
        """Training points a series needs: one point of history and one target after it
        (`forecaster.windows.SeriesPanel.training_origins`)."""
        return 2

    @property
    def min_series_length(self) -> int:
        """Points a series needs: a training window, validation and test."""
        return self.min_train_length + self.val_length + self.test_length

    def describe(self) -> str:
        return (
            f"the configured prediction_length={self.horizon} needs {self.min_train_length} "
            f"training points, plus {self.val_length} validation and {self.test_length} test "
            f"points ({self.backtest_windows} backtest windows): {self.min_series_length} per "
            "series"
        )

    @classmethod
    def from_config(
        cls, model_config: ModelConfig, *, val_length: int, backtest_windows: int
    ) -> SplitPlan:
        """The plan for ``model_config`` resolved for the data (``ModelConfig.for_frequency``)."""
        assert model_config.context_length is not None, "resolve the config for the data first"
        return cls(
            context_length=model_config.context_length,
            horizon=model_config.prediction_length,
            val_length=val_length,
            backtest_windows=backtest_windows,
        )


@dataclass(frozen=True)
class DataSplit:
    """The parts of one validated frame."""

    plan: SplitPlan
    full: pd.DataFrame  # every point: the backtest runs over its end
    train: pd.DataFrame
    val: pd.DataFrame  # L points of history + val_length points
    test: pd.DataFrame  # L points of history + test_length points
    train_end: pd.Timestamp | int  # last training timestamp (over all series; int: steps)
    val_end: pd.Timestamp | int  # last timestamp the model was fitted or early-stopped on

    def as_params(self) -> dict[str, object]:
        return {
            "split.val_length": self.plan.val_length,
            "split.test_length": self.plan.test_length,
            "split.backtest_windows": self.plan.backtest_windows,
            "split.train_rows": len(self.train),
            "split.train_end": time_label(self.train_end),
            "split.val_end": time_label(self.val_end),
        }


def split(frame: pd.DataFrame, plan: SplitPlan) -> DataSplit:
    """Split a validated frame (``IngestResult.frame``) according to ``plan``.

    Raises:
        SeriesTooShortError: a series is shorter than ``plan.min_series_length``.
    """
    parts = time_split(
        frame,
        val_length=plan.val_length,
        test_length=plan.test_length,
        context_length=plan.context_length,
        min_train_length=plan.min_train_length,
    )
    return DataSplit(
        plan=plan,
        full=frame,
        train=parts.train,
        val=parts.val,
        test=parts.test,
        train_end=time_point(parts.train["ds"].max()),
        val_end=time_point(parts.val["ds"].max()),
    )
