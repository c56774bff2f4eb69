"""Metrics against hand-computed values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forecaster.errors import EmptyDataError, InvalidConfigError, MissingColumnsError
from forecaster.metrics import (
    coverage,
    coverage_by_history,
    evaluate,
    mae,
    mase,
    mase_scale,
    mase_scales,
    metric_by_group,
    mse,
    pinball_loss,
    quantiles_in,
    rmse,
    smape,
)

Y = np.array([1.0, 2.0, 3.0])
Y_HAT = np.array([2.0, 2.0, 5.0])


def test_point_metrics():
    assert mae(Y, Y_HAT) == pytest.approx(1.0)  # (1 + 0 + 2) / 3
    assert mse(Y, Y_HAT) == pytest.approx(5 / 3)  # (1 + 0 + 4) / 3
    assert rmse(Y, Y_HAT) == pytest.approx(np.sqrt(5 / 3))
    # 200/3 * (1/3 + 0 + 2/8)
    assert smape(Y, Y_HAT) == pytest.approx(200 / 3 * (1 / 3 + 0.25))
    assert smape(np.zeros(2), np.zeros(2)) == 0.0


def test_mase():
    insample = np.array([1.0, 3.0, 2.0, 4.0])
    # lag-1 naive MAE = (2 + 1 + 2) / 3 = 5/3; MAE = 1
    assert mase(Y, Y_HAT, insample, season_length=1) == pytest.approx(0.6)
    # lag-2 naive MAE = (1 + 1) / 2 = 1
    assert mase(Y, Y_HAT, insample, season_length=2) == pytest.approx(1.0)
    # Too short for the season: lag 1 instead.
    assert mase(Y, Y_HAT, insample, season_length=24) == pytest.approx(0.6)
    # A constant history has no scale: NaN rather than inf or a ZeroDivisionError.
    assert np.isnan(mase(Y, Y_HAT, np.ones(10), season_length=1))


def test_pinball_and_coverage():
    q_pred = np.stack([Y_HAT - 1, Y_HAT + 1], axis=-1)  # q0.1 = [1, 1, 4], q0.9 = [3, 3, 6]
    # q0.1: errors y - q = [0, 1, -1] -> [0, 0.1, 0.9]; q0.9: [-2, -1, -3] -> [0.2, 0.1, 0.3]
    assert pinball_loss(Y, q_pred, [0.1, 0.9]) == pytest.approx(1.6 / 6)
    assert coverage(Y, q_pred[:, 0], q_pred[:, 1]) == pytest.approx(2 / 3)
    # The median's pinball loss is half the MAE.
    assert pinball_loss(Y, Y_HAT[:, None], [0.5]) == pytest.approx(mae(Y, Y_HAT) / 2)


def test_evaluate_frame():
    forecasts = pd.DataFrame(
        {
            "unique_id": ["a"] * 3 + ["b"] * 3,
            "ds": list(pd.date_range("2024-01-05", periods=3, freq="D")) * 2,
            "y": np.r_[Y, Y],
            "mean": np.r_[Y_HAT, Y],
            "q0.1": np.r_[Y_HAT - 1, Y - 1],
            "q0.5": np.r_[Y_HAT, Y],
            "q0.9": np.r_[Y_HAT + 1, Y + 1],
        }
    )
    history = pd.DataFrame(
        {
            "unique_id": ["a"] * 4 + ["b"] * 4 + ["a"],
            "ds": list(pd.date_range("2024-01-01", periods=4, freq="D")) * 2
            + [pd.Timestamp("2024-01-05")],  # at the forecast start: not in-sample
            "y": [1.0, 3.0, 2.0, 4.0, 1.0, 2.0, 3.0, 4.0, 100.0],
        }
    )
    result = evaluate(forecasts, history, season_length=1)
    assert result["mae"] == pytest.approx(0.5)
    assert result["mse"] == pytest.approx(5 / 6)
    # MASE per series, then averaged: a = 1 / (5/3) = 0.6; b = 0 / 1 = 0.
    assert result["mase"] == pytest.approx(0.3)
    assert result["coverage_80"] == pytest.approx(5 / 6)
    assert set(result) == {"mae", "mse", "rmse", "smape", "mase", "pinball", "coverage_80"}
    only_median = evaluate(forecasts, history, season_length=1, quantiles=[0.5])
    assert "coverage_80" not in only_median and "pinball" in only_median


def test_coverage_by_history_groups_series_as_the_intervals_are_calibrated():
    """Series count in the band of history the model sees: a longer history than the context
    is a whole context, and a history exactly at an edge is in the band below it."""
    y = np.zeros((4, 2))
    lower, upper = np.full_like(y, -1.0), np.full_like(y, 1.0)
    upper[0] = -0.5  # the first series misses both points
    history = np.array([2, 8, 40, 500])  # context 64: edges at 2, 4, 8, 16 and 32 steps
    by_band = coverage_by_history(y, lower, upper, history, context_length=64)
    assert by_band == {
        "up_to_L/32": {"series": 1, "coverage": 0.0},
        "up_to_L/8": {"series": 1, "coverage": 1.0},
        "beyond_L/2": {"series": 2, "coverage": 1.0},
    }


def test_a_missing_value_is_left_out_not_scored_as_perfect_or_as_a_miss():
    """sMAPE once counted a missing truth as a perfect forecast and coverage as a miss, and
    the other metrics turned NaN: every metric now equals its value on the observed points."""
    y = np.array([1.0, np.nan, 3.0, 4.0, np.nan])
    y_hat = np.array([2.0, 9.0, 5.0, 4.5, 1.0])
    lower, upper = y_hat - 1.5, y_hat + 1.5
    seen = ~np.isnan(y)
    for metric in (mae, mse, rmse, smape):
        assert metric(y, y_hat) == pytest.approx(metric(y[seen], y_hat[seen]))
    assert coverage(y, lower, upper) == pytest.approx(coverage(y[seen], lower[seen], upper[seen]))
    q = np.stack([lower, y_hat, upper], axis=-1)
    assert pinball_loss(y, q, [0.1, 0.5, 0.9]) == pytest.approx(
        pinball_loss(y[seen], q[seen], [0.1, 0.5, 0.9])
    )
    history = np.array([1.0, 3.0, np.nan, 4.0, 8.0, 9.0])  # lag-1 differences 2, 4, 1
    assert mase(y, y_hat, history, 1) == pytest.approx(mae(y, y_hat) / (7 / 3))


def test_the_mase_scale_of_a_frame_follows_time_not_row_order():
    history = pd.DataFrame(
        {
            "unique_id": "a",
            "ds": pd.date_range("2024-01-01", periods=6, freq="h"),
            "y": [1.0, 3.0, 2.0, 6.0, 5.0, 9.0],
        }
    )
    forecasts = pd.DataFrame(
        {"unique_id": "a", "ds": [pd.Timestamp("2024-01-01 06:00")], "y": [10.0], "mean": [9.0]}
    )
    in_order = evaluate(forecasts, history, season_length=1)["mase"]
    shuffled = evaluate(forecasts, history.sample(frac=1, random_state=0), season_length=1)
    assert in_order == pytest.approx(1 / 2.4)  # |10 - 9| / mean(2, 1, 4, 1, 4)
    assert shuffled["mase"] == pytest.approx(in_order)


def test_a_history_that_repeats_itself_to_rounding_has_no_mase_scale():
    """An exactly periodic series computed in floats differs from its season by rounding
    (about 1e-10 at a level of 1e6): that is no scale, and dividing by it scored a forecast one
    unit off MASE 2e9. Both the array and the frame paths leave such a series out (NaN)."""
    t = np.arange(24 * 20)
    periodic = 1e6 * (1 + 0.1 * np.sin(2 * np.pi * t / 24))
    assert 0 < np.abs(periodic[24:] - periodic[:-24]).mean() < 1e-9
    assert np.isnan(mase(periodic[:24] + 1, periodic[:24], periodic, season_length=24))
    history = pd.DataFrame(
        {
            "unique_id": "a",
            "ds": pd.date_range("2024-01-01", periods=t.size, freq="h"),
            "y": periodic,
        }
    )
    forecasts = pd.DataFrame(
        {"unique_id": "a", "ds": [pd.Timestamp("2024-01-21")], "y": [1e6 + 1], "mean": [1e6]}
    )
    assert np.isnan(evaluate(forecasts, history, season_length=24)["mase"])
    # A series in small units that moves keeps its scale.
    small = periodic * 1e-12 + 1e-13 * np.random.default_rng(0).normal(size=t.size)
    assert mase(small[:24], small[:24] + 1e-13, small, season_length=24) > 0


def test_the_frame_and_the_array_mase_scales_are_one_definition():
    """Per series, `mase_scales` of a frame equals `mase_scale` of its history's array, a
    missing step included; a series of a season or less is scaled over one step, or has no
    scale when only seasonal figures compare."""
    rng = np.random.default_rng(0)
    histories = {"long": rng.normal(size=30), "short": np.array([1.0, 4.0, 2.0]), "one": [5.0]}
    histories["long"][7] = np.nan
    history = pd.concat(
        pd.DataFrame(
            {"unique_id": sid, "ds": pd.date_range("2024-01-01", periods=len(y), freq="D"), "y": y}
        )
        for sid, y in histories.items()
    )
    forecasts = pd.DataFrame(
        {
            "unique_id": list(histories),
            "ds": [pd.Timestamp("2025-01-01")] * 3,
            "y": 0.0,
            "mean": 0.0,
        }
    )
    scales = mase_scales(forecasts, history.iloc[::-1], season_length=7)
    expected = [mase_scale(np.asarray(y), 7) for y in histories.values()]
    np.testing.assert_allclose(scales, expected)
    assert np.isfinite(scales[:2]).all() and np.isnan(scales[2])
    seasonal = mase_scales(forecasts, history, season_length=7, seasonal_only=True)
    assert seasonal[0] == pytest.approx(scales[0]) and np.isnan(seasonal[1:]).all()


def test_mase_scales_read_each_series_up_to_its_own_first_forecast():
    """Against the definition series by series: the scale reads the history before that
    series' earliest forecast timestamp, in time order whatever the rows' order; a series
    with no history, or none before its first forecast, has no scale."""
    rng = np.random.default_rng(1)
    rows, forecast_rows, expected = [], [], {}
    for k in range(12):
        n = int(rng.integers(0, 60))
        ds = pd.date_range("2024-01-01", periods=n, freq="h")
        y = rng.normal(size=n).round(1)
        rows.append(pd.DataFrame({"unique_id": f"s{k}", "ds": ds, "y": y}))
        first = pd.Timestamp("2024-01-01") + pd.Timedelta(hours=int(rng.integers(0, 70)))
        later = first + pd.to_timedelta(rng.integers(0, 30, 3), "h")
        forecast_rows += [(f"s{k}", t) for t in (*later, first)]
        before = y[ds < first]
        expected[f"s{k}"] = mase_scale(before, 5) if len(before) else np.nan
    forecast_rows.append(("never_seen", pd.Timestamp("2024-02-01")))
    expected["never_seen"] = np.nan
    history = pd.concat(rows).sample(frac=1.0, random_state=0)
    forecasts = pd.DataFrame(forecast_rows, columns=["unique_id", "ds"])
    scales = mase_scales(forecasts, history, season_length=5)
    want = forecasts["unique_id"].map(expected).to_numpy(np.float64)
    np.testing.assert_allclose(scales, want, equal_nan=True)
    assert np.isfinite(scales).sum() > len(scales) // 2  # most series have a scale


def test_smape_is_the_m4_definition_for_negative_values():
    """The denominator is |y| + |y_hat|, not |y + y_hat|: opposite signs are the worst
    forecast (200), not a 0/0 counted as perfect."""
    assert smape(np.array([-1.0]), np.array([3.0])) == pytest.approx(200.0)  # 200 * 4 / 4
    # 200/2 * (4/4 + 1/3)
    assert smape(np.array([-2.0, -1.0]), np.array([2.0, -2.0])) == pytest.approx(100 * 4 / 3)


def test_a_history_of_exactly_one_season_is_scaled_by_its_one_step_differences():
    # Four points, season 4: no seasonal difference, so lag 1: (2 + 1 + 2) / 3.
    assert mase_scale(np.array([1.0, 3.0, 2.0, 4.0]), season_length=4) == pytest.approx(5 / 3)
    # One point more: the one seasonal difference |6 - 1|.
    assert mase_scale(np.array([1.0, 3.0, 2.0, 4.0, 6.0]), season_length=4) == pytest.approx(5.0)


def test_no_mase_scale_for_a_zero_or_a_negative_repeating_history():
    """All zeros has a scale of exactly 0 (NaN, not inf); a series below zero that repeats
    itself to rounding has none either, as its mirror image above zero has none."""
    assert np.isnan(mase_scale(np.zeros(10), season_length=1))
    assert np.isnan(mase(Y, Y_HAT, np.zeros(10), season_length=1))
    t = np.arange(24 * 20)
    periodic = -1e6 * (1 + 0.1 * np.sin(2 * np.pi * t / 24))
    assert 0 < np.abs(periodic[24:] - periodic[:-24]).mean() < 1e-9
    assert np.isnan(mase(periodic[:24] + 1, periodic[:24], periodic, season_length=24))


@pytest.mark.parametrize("season_length", [0, -1])
def test_mase_refuses_a_season_length_below_one(season_length):
    with pytest.raises(
        InvalidConfigError, match=f"season_length: expected >= 1, got {season_length}"
    ):
        mase(Y, Y_HAT, np.array([1.0, 3.0, 2.0, 4.0]), season_length=season_length)


def test_a_point_on_either_bound_is_inside_the_interval():
    y = np.array([1.0, 3.0, 5.0])
    lower, upper = np.array([1.0, 1.0, 1.0]), np.array([3.0, 3.0, 4.0])
    assert coverage(y, lower, upper) == pytest.approx(2 / 3)  # 1 on lower, 3 on upper, 5 out


def _quantile_frame(columns: list[str]) -> pd.DataFrame:
    """Two series of three days, 'a' off by [1, 0, 2] and 'b' exact; 'b' has a constant
    history (no MASE scale), 'a' the lag-1 scale 5/3."""
    values = {
        "q0.1": np.r_[Y_HAT - 1, Y - 1],  # a: [1, 1, 4]; b: [0, 1, 2]
        "q0.5": np.r_[Y_HAT, Y],
        "q0.9": np.r_[Y_HAT + 0.5, Y + 1],  # a: [2.5, 2.5, 5.5]; b: [2, 3, 4]
    }
    frame = pd.DataFrame(
        {
            "unique_id": ["a"] * 3 + ["b"] * 3,
            "ds": list(pd.date_range("2024-01-05", periods=3, freq="D")) * 2,
            "y": np.r_[Y, Y],
            "mean": np.r_[Y_HAT, Y],
        }
    )
    for column in columns:
        frame[column] = values.get(column, 7.0)
    return frame


_QUANTILE_HISTORY = pd.DataFrame(
    {
        "unique_id": ["a"] * 4 + ["b"] * 4,
        "ds": list(pd.date_range("2024-01-01", periods=4, freq="D")) * 2,
        "y": [1.0, 3.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0],
    }
)


def test_quantile_columns_are_read_in_increasing_order_and_only_inside_0_1():
    """Columns out of order, or other columns starting with "q" (a quarter `q1`, `q0`, a
    `qty`, a `q0.50` that is not how a level is named) change nothing."""
    frame = _quantile_frame(["q0.9", "qty", "q0.5", "q1", "q0", "q0.50", "q0.1"])
    assert quantiles_in(frame) == [0.1, 0.5, 0.9]
    expected = evaluate(_quantile_frame(["q0.1", "q0.5", "q0.9"]), _QUANTILE_HISTORY, 1)
    # a covers 2 of 3 (y = 3 is above 2.5), b all 3.
    assert expected["coverage_80"] == pytest.approx(5 / 6)
    assert evaluate(frame, _QUANTILE_HISTORY, 1) == pytest.approx(expected)
    given_backwards = evaluate(frame, _QUANTILE_HISTORY, 1, quantiles=[0.9, 0.5, 0.1])
    assert given_backwards == pytest.approx(expected)


def test_evaluate_averages_mase_over_the_series_with_a_scale():
    """'b' has a constant history: it is left out of MASE, not a NaN mean; 'a' is 1 / (5/3)."""
    result = evaluate(_quantile_frame([]), _QUANTILE_HISTORY, season_length=1)
    assert result["mase"] == pytest.approx(0.6)
    assert set(result) == {"mae", "mse", "rmse", "smape", "mase"}


def test_evaluate_refuses_an_empty_frame():
    empty = _quantile_frame(["q0.1", "q0.9"]).iloc[:0]
    with pytest.raises(EmptyDataError, match="forecasts: no rows to evaluate"):
        evaluate(empty, _QUANTILE_HISTORY, season_length=1)


def test_metric_by_group_values_per_series():
    frame = _quantile_frame(["q0.1", "q0.9"])
    rmse_by_series = metric_by_group(frame, _QUANTILE_HISTORY, 1, "rmse")
    assert rmse_by_series.name == "rmse"
    # a: sqrt((1 + 0 + 4) / 3), the root of the mean, not the mean of absolute errors; b: 0.
    np.testing.assert_allclose(rmse_by_series.loc[["a", "b"]], [np.sqrt(5 / 3), 0.0])
    mase_by_series = metric_by_group(frame, _QUANTILE_HISTORY, 1, "mase")
    assert mase_by_series["a"] == pytest.approx(0.6) and np.isnan(mase_by_series["b"])


def test_metric_by_group_refuses_an_unknown_metric_or_pinball_without_quantiles():
    frame = _quantile_frame([])
    with pytest.raises(InvalidConfigError, match="metric: expected one of mae, .*got 'mape'"):
        metric_by_group(frame, _QUANTILE_HISTORY, 1, "mape")
    with pytest.raises(MissingColumnsError, match="no quantile columns for pinball"):
        metric_by_group(frame, _QUANTILE_HISTORY, 1, "pinball")
