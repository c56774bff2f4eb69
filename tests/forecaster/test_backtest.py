"""Rolling-origin backtest: one batched predict per window, forecasts aligned with the truth."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forecaster.backtest import BacktestResult, backtest
from forecaster.baselines import SeasonalNaive
from forecaster.errors import EmptyDataError, InvalidConfigError, SeriesTooShortError
from forecaster.metrics import mase
from forecaster.synthetic import generate_synthetic


class Recorder:
    """Wraps a model and records every predict call."""

    def __init__(self, model):
        self.model = model
        self.calls: list[dict] = []

    @property
    def min_history(self) -> int:
        return self.model.min_history

    @property
    def max_horizon(self) -> int:
        return self.model.max_horizon

    @property
    def freq(self) -> str | None:
        return self.model.freq

    def predict(self, df, horizon=None, quantiles=None, future_df=None):
        self.calls.append({"df": df, "horizon": horizon, "future_df": future_df})
        return self.model.predict(df, horizon=horizon, quantiles=quantiles, future_df=future_df)


class Oracle:
    """Forecasts the truth it is given as future covariates (checks what backtest passes)."""

    min_history = 1
    max_horizon = 5
    freq = None

    def predict(self, df, horizon=None, quantiles=None, future_df=None):
        out = future_df[["unique_id", "ds"]].copy()
        out["mean"] = future_df["y_copy"].to_numpy()
        out["q0.1"] = out["mean"] - 1
        out["q0.9"] = out["mean"] + 1
        # History must end exactly at the cutoff: the step before the first future one.
        last = df.groupby("unique_id")["ds"].max()
        first = future_df.groupby("unique_id")["ds"].min()
        assert ((first - last) == pd.Timedelta("1h")).all()
        return out.sample(frac=1.0, random_state=0)  # order must not matter


def test_one_batched_predict_per_window_aligned_with_truth():
    df = generate_synthetic(n_series=3, n_steps=200, seed=2)
    model = Recorder(SeasonalNaive().fit(df))
    result = backtest(model, df, n_windows=3, horizon=12, step=6)
    assert isinstance(result, BacktestResult)
    assert len(model.calls) == 3 and (result.n_windows, result.horizon) == (3, 12)
    for call in model.calls:
        assert call["df"]["unique_id"].nunique() == 3  # every series in one call
        assert call["horizon"] == 12 and call["future_df"] is None
    # History lengths: the last cutoff is len - horizon, earlier ones step back by `step`.
    lengths = [len(call["df"]) // 3 for call in model.calls]
    assert lengths == [200 - 12 - 12, 200 - 12 - 6, 200 - 12]

    fc = result.forecasts
    assert list(fc.columns[:5]) == ["unique_id", "ds", "cutoff", "y", "mean"]
    assert len(fc) == 3 * 3 * 12
    truth = df.set_index(["unique_id", "ds"])["y"]
    np.testing.assert_array_equal(
        fc["y"].to_numpy(), truth.loc[list(zip(fc["unique_id"], fc["ds"], strict=True))]
    )
    assert (fc["ds"] > fc["cutoff"]).all()
    assert ((fc["ds"] - fc["cutoff"]) <= pd.Timedelta("12h")).all()
    # Seasonal naive: each forecast is the value one season before within the history.
    row = fc.iloc[-1]
    season_before = truth.loc[(row["unique_id"], row["ds"] - pd.Timedelta("24h"))]
    assert row["mean"] == season_before
    assert {"mae", "mse", "rmse", "smape", "mase", "pinball", "coverage_80"} <= set(result.metrics)


def test_covariates_after_the_cutoff_are_passed_as_future_frame():
    df = generate_synthetic(n_series=2, n_steps=50, seed=3)
    df["y_copy"] = df["y"]
    result = backtest(Oracle(), df, n_windows=2, covariates=["y_copy"])
    assert len(result.forecasts) == 2 * 2 * 5
    assert result.metrics["mae"] == pytest.approx(0.0)
    assert result.metrics["coverage_80"] == pytest.approx(1.0)


def test_too_short_for_the_windows():
    df = generate_synthetic(n_series=2, n_steps=60, seed=4)
    with pytest.raises(SeriesTooShortError, match="backtest window") as info:
        backtest(SeasonalNaive().fit(df), df, n_windows=3, horizon=24)
    assert info.value.series_id == "series_000"


@pytest.mark.parametrize("metric", ["mae", "mse", "smape", "mase", "pinball"])
def test_per_series_scores_average_to_the_overall_metric(metric):
    """Equal-length series: the mean of the per-series values is the metric over all rows."""
    df = generate_synthetic(n_series=5, n_steps=24 * 10, freq="h", seed=0)
    result = backtest(SeasonalNaive(horizon=24).fit(df), df, n_windows=3)
    by_series = result.by_series(metric)
    assert sorted(by_series.index) == sorted(df["unique_id"].astype(str).unique())
    assert by_series.mean() == pytest.approx(result.metrics[metric], rel=1e-9)
    by_window = result.by_window(metric)
    assert len(by_window) == 5 * 3  # series x windows
    assert by_window.mean() == pytest.approx(result.metrics[metric], rel=1e-9)


@pytest.mark.parametrize("bad", [{"horizon": 2.5}, {"horizon": True}, {"step": 1.0}])
def test_a_horizon_or_step_that_is_not_a_whole_number_is_refused(bad):
    """Not rounded down to a backtest the caller did not ask for."""
    df = generate_synthetic(n_series=2, n_steps=60, freq="h", seed=0)
    model = SeasonalNaive(horizon=4).fit(df)
    name = next(iter(bad))
    with pytest.raises(InvalidConfigError, match=f"{name}: expected an int") as info:
        backtest(model, df, n_windows=2, **bad)
    assert info.value.field == name


def test_a_series_the_model_cannot_read_at_a_cut_is_left_out_of_that_window(fitted, series):
    """An outage longer than the context before the last cut: that series cannot be forecast
    there (predict refuses it), so it leaves that window; its earlier window and the other
    series are scored. With nothing left to score, the error says why."""
    L, H = fitted.model_config.context_length, fitted.max_horizon
    out = series.copy()
    sid = out["unique_id"].unique()[1]
    rows = out.index[out["unique_id"] == sid]
    out.loc[rows[-(L + H) : -H], "y"] = np.nan  # the context of the last window, all missing
    result = backtest(fitted, out, n_windows=2, step=L + H)  # the first window before the gap
    windows = result.forecasts.groupby("unique_id")["cutoff"].nunique()
    assert windows[sid] == 1 and (windows.drop(sid) == 2).all()
    assert np.isfinite(result.metrics["mae"])
    # A baseline scored beside the model takes its context: the same windows.
    naive = SeasonalNaive(horizon=H).fit(out)
    beside = backtest(naive, out, n_windows=2, step=L + H, context_length=L)
    key = ["unique_id", "cutoff"]
    pd.testing.assert_frame_equal(
        beside.forecasts[key].drop_duplicates().reset_index(drop=True),
        result.forecasts[key].drop_duplicates().reset_index(drop=True),
    )
    gone = out.assign(y=np.where(out.index.isin(out.index[-(L + H) :]), np.nan, out["y"]))
    with pytest.raises(EmptyDataError, match="no observed value to score"):
        backtest(fitted, gone[gone["unique_id"] == out["unique_id"].iloc[-1]], n_windows=1)


def test_mase_by_step_averages_to_the_backtest_mase(fitted, series):
    """Per step, the scaled errors averaged per series and then over series; with every step
    of every window observed, their mean is the backtest's MASE, and errors grow with the
    step (monitoring holds short-horizon traffic to the first steps' accuracy)."""
    result = backtest(fitted, series, n_windows=3)
    by_step = result.mase_by_step()
    assert by_step.shape == (fitted.max_horizon,) and np.isfinite(by_step).all()
    assert by_step.mean() == pytest.approx(result.metrics["mase"])
    assert by_step[:2].mean() < by_step[-2:].mean()


def test_forecasts_come_back_in_the_callers_ids_and_zone(fitted, series):
    """Integer ids and Berlin timestamps: the windows' forecasts carry them as `predict`
    does, so they merge back onto the caller's frame and `ds` and `cutoff` read in the
    history's zone (not naive UTC, an hour early); the metrics are those of the same frame
    given naive with text ids."""
    codes = {sid: k for k, sid in enumerate(series["unique_id"].unique())}
    given = series.assign(
        unique_id=series["unique_id"].map(codes).astype("int64"),
        ds=series["ds"].dt.tz_localize("Europe/Berlin"),
    )
    result = backtest(fitted, given, n_windows=2)
    forecasts = result.forecasts
    assert forecasts["unique_id"].dtype == "int64"
    assert str(forecasts["ds"].dt.tz) == str(forecasts["cutoff"].dt.tz) == "Europe/Berlin"
    merged = forecasts.merge(given, on=["unique_id", "ds"], suffixes=("", "_given"))
    assert len(merged) == len(forecasts)
    np.testing.assert_array_equal(merged["y"], merged["y_given"])
    last = given.groupby("unique_id")["ds"].max()
    assert (forecasts.groupby("unique_id")["ds"].max() == last).all()
    naive = backtest(
        fitted, series.assign(ds=given["ds"].dt.tz_convert("UTC").dt.tz_localize(None)), n_windows=2
    )
    assert result.metrics == pytest.approx(naive.metrics)
    np.testing.assert_allclose(result.by_series("mase"), naive.by_series("mase"))


class Zero:
    """Forecasts 0 after each series of yearly data, recording the history lengths it is
    given; `drop_last` leaves out its last row (a model that forgets a forecast)."""

    max_horizon = 2
    freq = None

    def __init__(self, min_history=1, context_length=None, drop_last=False):
        self.min_history = min_history
        if context_length is not None:
            self.context_length = context_length
        self.drop_last = drop_last
        self.lengths: list[dict[str, int]] = []

    def predict(self, df, horizon=None, quantiles=None, future_df=None):
        self.lengths.append(df.groupby("unique_id").size().to_dict())
        last = df.groupby("unique_id")["ds"].max()
        out = pd.concat(
            pd.DataFrame(
                {
                    "unique_id": sid,
                    "ds": pd.date_range(end, periods=horizon + 1, freq="YS")[1:],
                    "mean": 0.0,
                }
            )
            for sid, end in last.items()
        )
        return out.iloc[:-1] if self.drop_last else out


def _yearly(**values) -> pd.DataFrame:
    return pd.concat(
        pd.DataFrame(
            {
                "unique_id": sid,
                "ds": pd.date_range("2000-01-01", periods=len(y), freq="YS"),
                "y": np.asarray(y, dtype=np.float64),
            }
        )
        for sid, y in values.items()
    ).reset_index(drop=True)


def test_mase_by_step_averages_per_series_first_and_a_missing_truth_is_not_scored():
    """Yearly (season 1), horizon 2, cuts after 4 and 6 points, a zero forecast: a's scale is
    2, b's 4. b's last point is missing: it is forecast but not scored, and b's one error at
    step 2 weighs as much as a's two (per series, then over series)."""
    df = _yearly(a=[0, 2, 0, 2, 2, 2, 4, 6], b=[0, 4, 0, 4, 0, 4, 0, np.nan])
    result = backtest(Zero(), df, n_windows=2, step=2)
    assert result.season_length == 1
    assert len(result.forecasts) == 7 and result.forecasts["y"].notna().all()
    # Scaled errors: a [1, 1 | 2, 3], b [0, 1 | 0, -]; step 1: mean(1.5, 0); step 2: mean(2, 1).
    np.testing.assert_allclose(result.mase_by_step(), [0.75, 1.5])
    assert result.metrics["mase"] == pytest.approx((7 / 4 + 1 / 3) / 2)
    assert result.metrics["mae"] == pytest.approx((2 + 2 + 4 + 6 + 0 + 4 + 0) / 7)


def test_a_series_exactly_long_enough_for_the_windows_after_min_history_is_scored():
    """min_history 4, horizon 2, two windows 3 apart: 4 + 2 + 3 = 9 points are enough, the
    first window reading exactly 4; 8 are not."""
    model = Zero(min_history=4)
    result = backtest(model, _yearly(a=np.arange(9.0)), n_windows=2, step=3)
    assert model.lengths == [{"a": 4}, {"a": 7}]
    assert len(result.forecasts) == 4
    with pytest.raises(SeriesTooShortError, match="after the model's min_history of 4 points"):
        backtest(Zero(min_history=4), _yearly(a=np.arange(8.0)), n_windows=2, step=3)


def test_a_series_is_scored_when_the_oldest_point_of_its_context_is_observed():
    """Context 3 before the cut after 6 points: b's only observed value there is the oldest
    (position 3), which the model can read; c's last observed value is one step older."""
    gap = [np.nan, np.nan, 1.0, 1.0]
    df = _yearly(
        a=np.arange(8.0), b=[1.0, 1.0, 1.0, 1.0, *gap], c=[1.0, 1.0, 1.0, *[np.nan] * 3, 1.0, 1.0]
    )
    result = backtest(Zero(context_length=3), df, n_windows=1)
    assert sorted(result.forecasts["unique_id"].unique()) == ["a", "b"]


def test_a_window_with_nothing_observed_to_score_says_so():
    df = _yearly(a=[1.0, 2.0, 3.0, 4.0, np.nan, np.nan])
    with pytest.raises(EmptyDataError, match="no observed value to score in the last 1") as info:
        backtest(Zero(), df, n_windows=1)
    assert info.value.field == "y"


def test_a_forecast_the_model_does_not_return_is_an_error():
    df = _yearly(a=np.arange(6.0), b=np.arange(6.0))
    with pytest.raises(RuntimeError, match="returned no forecast for series 'b' at 2005-01-01"):
        backtest(Zero(drop_last=True), df, n_windows=1)


@pytest.mark.parametrize("bad", [{"horizon": 0}, {"step": 0}, {"n_windows": 0}])
def test_a_horizon_step_or_window_count_below_one_is_refused(bad):
    name = next(iter(bad))
    with pytest.raises(InvalidConfigError, match=f"{name}: expected an int >= 1, got 0") as info:
        backtest(Zero(), _yearly(a=np.arange(12.0)), **{"n_windows": 2, **bad})
    assert info.value.field == name


def test_the_default_step_is_the_horizon_and_mase_uses_the_frequencys_season():
    """Hourly data: windows do not overlap by default, and MASE is scaled by the 24-step
    seasonal-naive error of each series' history before its first forecast."""
    df = generate_synthetic(n_series=2, n_steps=24 * 5, freq="h", seed=1)
    result = backtest(SeasonalNaive(horizon=6).fit(df), df, n_windows=2)
    assert result.season_length == 24
    fc = result.forecasts
    assert not fc.duplicated(["unique_id", "ds"]).any()
    assert (fc.groupby("unique_id")["cutoff"].unique().map(len) == 2).all()
    cutoffs = np.sort(fc["cutoff"].unique())
    assert cutoffs[1] - cutoffs[0] == np.timedelta64(6, "h")
    expected = []
    for sid, rows in fc.groupby("unique_id"):
        insample = df.loc[(df["unique_id"] == sid) & (df["ds"] < rows["ds"].min()), "y"]
        expected.append(mase(rows["y"], rows["mean"], insample.to_numpy(), season_length=24))
    assert result.metrics["mase"] == pytest.approx(np.mean(expected))
