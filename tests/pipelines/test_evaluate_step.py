"""The evaluate step's table: what `forecaster evaluate` prints and the run's
evaluation/metrics.csv holds."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from pipelines.evaluate import Evaluation


def _evaluation(model: dict[str, float], baseline: dict[str, float]) -> Evaluation:
    return Evaluation(
        model=model, baseline=baseline, n_windows=1, horizon=24, forecasts=pd.DataFrame()
    )


def test_the_table_puts_each_metric_beside_seasonal_naive_with_their_ratio():
    table = _evaluation({"mae": 1.0, "mase": 0.8}, {"mae": 2.0, "mase": 1.0}).table()
    assert list(table.columns) == ["metric", "model", "seasonal_naive", "ratio"]
    assert table["metric"].tolist() == ["mae", "mase"]
    assert table["ratio"].tolist() == pytest.approx([0.5, 0.8])


@pytest.mark.parametrize("naive", [0.0, math.nan, math.inf])
def test_a_ratio_to_a_naive_score_of_zero_or_none_is_not_a_number_not_a_crash(naive):
    """Seasonal naive scores 0 on a series that repeats its season exactly, and has no
    score where it gives no quantiles; the table still prints."""
    table = _evaluation({"mae": 1.0, "coverage_80": 0.8}, {"mae": naive}).table()
    assert table["ratio"].isna().all()
    assert math.isnan(table.loc[table["metric"] == "coverage_80", "seasonal_naive"].item())
