"""Rolling-origin backtest: one batched predict per window, forecasts aligned with the truth."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forecaster.backtest import BacktestResult, backtest
from forecaster.baselines import SeasonalNaive
from forecaster.errors import EmptyDataError, InvalidConfigError, SeriesTooShortError
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
