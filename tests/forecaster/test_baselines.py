"""Seasonal naive and the DLinear-style linear baseline."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forecaster import baselines
from forecaster.backtest import backtest
from forecaster.baselines import LinearBaseline, SeasonalNaive
from forecaster.errors import (
    FrequencyInferenceError,
    HorizonTooLongError,
    InvalidConfigError,
    IrregularTimestampsError,
    SeriesTooShortError,
    UnknownQuantileError,
)
from forecaster.synthetic import generate_synthetic


def series(values: dict[str, np.ndarray], freq: str = "h") -> pd.DataFrame:
    return pd.concat(
        [
            pd.DataFrame(
                {
                    "unique_id": sid,
                    "ds": pd.date_range("2024-01-01", periods=len(y), freq=freq),
                    "y": y,
                }
            )
            for sid, y in values.items()
        ],
        ignore_index=True,
    )


def test_seasonal_naive_repeats_the_last_season():
    rng = np.random.default_rng(0)
    df = series({"a": rng.normal(size=100), "b": rng.normal(size=80) + 5})
    model = SeasonalNaive().fit(df)
    assert model.freq == "h" and model.max_horizon == 24 and model.min_history == 1
    out = model.predict(df, horizon=30)
    assert list(out.columns) == ["unique_id", "ds", "mean", "q0.1", "q0.5", "q0.9"]
    for sid, group in df.groupby("unique_id"):
        last_season = group["y"].to_numpy()[-24:]
        forecast = out[out["unique_id"] == sid]
        np.testing.assert_array_equal(
            forecast["mean"].to_numpy(), np.r_[last_season, last_season[:6]]
        )
        assert forecast["ds"].iloc[0] == group["ds"].iloc[-1] + pd.Timedelta("1h")
        # Quantiles are ordered and widen from the second season on (sqrt of seasons ahead).
        width = (forecast["q0.9"] - forecast["q0.1"]).to_numpy()
        assert np.all(width > 0)
        np.testing.assert_allclose(width[24:], width[:6] * np.sqrt(2))


def test_seasonal_naive_explicit_season_and_quantiles():
    df = series({"a": np.tile([1.0, 2.0, 3.0], 5)}, freq="D")
    out = SeasonalNaive(season_length=3).fit(df).predict(df, horizon=4, quantiles=[0.5])
    assert out["mean"].tolist() == [1.0, 2.0, 3.0, 1.0]
    assert list(out.columns) == ["unique_id", "ds", "mean", "q0.5"]
    # A perfectly seasonal history has zero residuals: a zero-width band.
    np.testing.assert_array_equal(out["q0.5"], out["mean"])


def test_seasonal_naive_fills_gaps_and_short_series():
    """A missing value takes the same phase one season earlier (as the model's linear start
    reads it), else the nearest observed value; a series shorter than a season repeats."""
    a = np.tile([1.0, 2.0, 3.0], 5) + np.repeat(np.arange(5.0), 3) * 10  # 1 2 3 11 12 13 ...
    b = np.array([np.nan, 5.0, np.nan, 7.0, 8.0, np.nan])  # phase 2 never seen before its gap
    df = series({"a": a, "b": b, "c": np.array([7.0, 8.0])}, freq="D")
    df = df.drop(index=[10, 13])  # a's 11th and 14th points (32.0 and 42.0) are missing
    out = SeasonalNaive(season_length=3).fit(df).predict(df, horizon=3, quantiles=[0.5])
    assert out["mean"].tolist() == [41.0, 22.0, 43.0, 7.0, 8.0, 8.0, 7.0, 8.0, 7.0]
    assert np.isfinite(out["q0.5"]).all()


def test_baselines_use_the_shared_validation():
    df = series({"a": np.arange(50.0)})
    df.loc[10, "ds"] += pd.Timedelta(minutes=30)
    with pytest.raises(IrregularTimestampsError):
        SeasonalNaive().fit(df)
    with pytest.raises(SeriesTooShortError):
        LinearBaseline(48, 12).fit(series({"a": np.arange(50.0)}))
    with pytest.raises(UnknownQuantileError):
        SeasonalNaive(quantiles=[0.1, 1.5])


def test_linear_baseline_recovers_sine_and_linear_series():
    t = np.arange(400, dtype=float)
    df = series(
        {
            "sine": np.sin(2 * np.pi * t / 24),
            "line": 3.0 + 0.5 * t,
            "both": 50 + 10 * np.sin(2 * np.pi * t / 24 + 1) - 0.2 * t,
        }
    )
    train = df.groupby("unique_id").head(350)
    truth = df.groupby("unique_id").nth(list(range(350, 374)))
    model = LinearBaseline(context_length=72, prediction_length=24).fit(train)
    out = model.predict(train)
    assert model.min_history == 72 and model.max_horizon == 24
    assert out["ds"].tolist() == truth["ds"].tolist()
    np.testing.assert_allclose(out["mean"].to_numpy(), truth["y"].to_numpy(), atol=1e-3)
    # Exact fits leave (almost) no residuals: a narrow band around the mean.
    assert np.all(out["q0.9"] >= out["q0.1"])
    assert (out["q0.9"] - out["q0.1"]).max() < 1e-2


def test_linear_baseline_beats_seasonal_naive_on_noisy_data_and_gives_calibrated_bands():
    df = generate_synthetic(n_series=4, n_steps=24 * 7 * 6, seed=1)
    train = df.groupby("unique_id").head(24 * 7 * 5)
    truth = df.groupby("unique_id").nth(list(range(24 * 7 * 5, 24 * 7 * 5 + 24)))["y"].to_numpy()
    linear = LinearBaseline(context_length=168, prediction_length=24).fit(train).predict(train)
    naive = SeasonalNaive().fit(train).predict(train, horizon=24)
    linear_mae = np.abs(linear["mean"].to_numpy() - truth).mean()
    naive_mae = np.abs(naive["mean"].to_numpy() - truth).mean()
    assert linear_mae < naive_mae
    inside = (truth >= linear["q0.1"].to_numpy()) & (truth <= linear["q0.9"].to_numpy())
    # 96 points of an 80 % band (the closed form holds 0.77; bands twice as wide hold 0.98)
    assert 0.65 <= inside.mean() <= 0.92


def test_linear_baseline_horizon_and_quantile_choices():
    df = series({"a": np.sin(np.arange(200) / 3.0)})
    model = LinearBaseline(context_length=30, prediction_length=10).fit(df)
    out = model.predict(df, horizon=4, quantiles=[0.05, 0.95])
    assert len(out) == 4 and list(out.columns) == ["unique_id", "ds", "mean", "q0.05", "q0.95"]
    with pytest.raises(HorizonTooLongError, match="1..10"):
        model.predict(df, horizon=11)
    with pytest.raises(SeriesTooShortError):
        model.predict(df.head(20))


def test_seasonal_naive_reads_gaps_the_same_in_chunks_of_series(monkeypatch):
    """The look-back for a gap's phase runs in chunks of series to bound memory; chunking must
    not change a forecast."""
    rng = np.random.default_rng(0)
    df = series({f"s{i}": rng.normal(size=int(rng.integers(3, 120))) for i in range(40)})
    df.loc[rng.random(len(df)) < 0.2, "y"] = np.nan
    df = df[df.groupby("unique_id")["y"].transform("count") > 0]
    whole = SeasonalNaive(season_length=24).fit(df).predict(df, horizon=30)
    monkeypatch.setattr(baselines, "_FILL_CHUNK_VALUES", 100)
    chunked = SeasonalNaive(season_length=24).fit(df).predict(df, horizon=30)
    assert np.isfinite(whole["mean"]).all()
    pd.testing.assert_frame_equal(whole, chunked)


def test_quantile_levels_must_lie_strictly_between_0_and_1():
    """A level of 0 or 1 is an infinite quantile, not a band: both models refuse it, whether
    given at construction or to `predict`."""
    df = series({"a": np.arange(48.0)})
    with pytest.raises(UnknownQuantileError):
        SeasonalNaive(quantiles=[0.0, 0.5])
    with pytest.raises(UnknownQuantileError):
        LinearBaseline(8, 4, quantiles=[0.5, 1.0])
    with pytest.raises(UnknownQuantileError):
        SeasonalNaive().fit(df).predict(df, quantiles=[0.0])


def test_quantile_levels_come_back_sorted_and_once_each():
    df = series({"a": np.sin(np.arange(100) / 3.0)})
    for model in (SeasonalNaive(season_length=4), LinearBaseline(12, 4)):
        out = model.fit(df).predict(df, quantiles=[0.9, 0.1, 0.9])
        assert list(out.columns) == ["unique_id", "ds", "mean", "q0.1", "q0.9"]
    assert SeasonalNaive(quantiles=[0.9, 0.5, 0.5]).quantiles == (0.5, 0.9)


def test_settings_out_of_range_are_refused_when_the_model_is_built():
    for build in (
        lambda: SeasonalNaive(season_length=0),
        lambda: SeasonalNaive(horizon=0),
        lambda: LinearBaseline(0, 4),
        lambda: LinearBaseline(8, 2.5),
        lambda: LinearBaseline(8, 4, kernel_size=0),
        lambda: LinearBaseline(8, 4, ridge=-0.5),
    ):
        with pytest.raises(InvalidConfigError):
            build()


def test_a_horizon_below_one_step_is_refused_by_predict():
    df = series({"a": np.sin(np.arange(100) / 3.0)})
    with pytest.raises(InvalidConfigError):
        SeasonalNaive().fit(df).predict(df, horizon=0)
    with pytest.raises(HorizonTooLongError, match="1..4"):
        LinearBaseline(12, 4).fit(df).predict(df, horizon=0)


def test_linear_baseline_refuses_to_predict_before_fit():
    with pytest.raises(InvalidConfigError, match="fit"):
        LinearBaseline(8, 4).predict(series({"a": np.arange(48.0)}))


def test_baselines_refuse_a_frame_of_another_frequency_than_they_were_fit_on():
    """A daily frame given to a model fit on hourly data must not be forecast in days."""
    hourly = series({"a": np.sin(np.arange(100) / 3.0)})
    daily = series({"a": np.sin(np.arange(100) / 3.0)}, freq="D")
    # Both name the series and the frequency it was expected to have, with one error type.
    with pytest.raises(FrequencyInferenceError, match=r"'a'.*'h'"):
        SeasonalNaive().fit(hourly).predict(daily)
    with pytest.raises(FrequencyInferenceError, match=r"'a'.*'h'"):
        LinearBaseline(12, 4).fit(hourly).predict(daily)


def test_seasonal_naive_predicts_its_configured_horizon_by_default():
    df = series({"a": np.arange(100.0), "b": np.arange(100.0)})
    out = SeasonalNaive(horizon=5).fit(df).predict(df)
    assert out.groupby("unique_id").size().tolist() == [5, 5]


def test_seasonal_naive_bands_are_the_seasonal_differences_quantiles_widened_per_season():
    """Steps 1..m ahead (one season) get the empirical quantiles of y(t) - y(t - m) over every
    pair of the history, the first one included; steps m+1..2m get them times sqrt(2)."""
    m = 3
    y = np.array([0.0, 1.0, 2.0, 9.0, 2.0, 3.0, 8.0, 4.0, 4.0, 9.0])
    differences = y[m:] - y[:-m]  # 9, 1, 1, -1, 2, 1, 1
    levels = [0.1, 0.5, 0.9]
    df = series({"a": y}, freq="D")
    out = SeasonalNaive(season_length=m).fit(df).predict(df, horizon=2 * m, quantiles=levels)
    expected = np.quantile(differences, levels)
    for q, spread in zip(levels, expected, strict=True):
        offset = (out[f"q{q}"] - out["mean"]).to_numpy()
        np.testing.assert_allclose(offset[:m], spread)
        np.testing.assert_allclose(offset[m:], spread * np.sqrt(2))


def test_seasonal_naive_gives_a_series_without_a_full_season_a_zero_width_band():
    """No pair one season apart means no observed spread: the band is the forecast itself."""
    df = series({"long": np.sin(np.arange(50.0)), "short": np.array([3.0, 7.0, 5.0])})
    out = SeasonalNaive(season_length=24).fit(df).predict(df, quantiles=[0.1, 0.9])
    short = out[out["unique_id"] == "short"]
    np.testing.assert_array_equal(short["q0.1"], short["mean"])
    np.testing.assert_array_equal(short["q0.9"], short["mean"])
    long = out[out["unique_id"] == "long"]
    assert (long["q0.9"] > long["q0.1"]).all()


def test_seasonal_naive_reads_a_step_before_any_observation_as_the_next_observed_value():
    """Missing steps with nothing observed before them (a series starting with gaps, or an
    outage longer than the 10-season look-back) take the series' next observed value, not 0
    and not a value from before the look-back."""
    leading = series({"a": np.array([np.nan, np.nan, 5.0, 6.0])})
    out = SeasonalNaive(season_length=4).fit(leading).predict(leading, quantiles=[])
    assert out["mean"].tolist() == [5.0, 5.0, 5.0, 6.0]
    outage = np.full(30, np.nan)
    outage[:10] = np.arange(10.0)  # 19 missing steps: more than 10 seasons of 2
    outage[29] = 100.0
    df = series({"a": outage})
    out = SeasonalNaive(season_length=2).fit(df).predict(df, quantiles=[])
    assert out["mean"].tolist() == [100.0, 100.0]


def test_linear_baseline_fits_a_series_exactly_as_long_as_one_window():
    """`fit` asks for context_length + prediction_length points: that many must be enough."""
    df = series({"a": np.sin(np.arange(12.0))})
    out = LinearBaseline(8, 4).fit(df).predict(df)
    assert len(out) == 4 and np.isfinite(out["mean"]).all()


def test_linear_baseline_forecasts_a_flat_series_as_flat():
    """A constant window has no spread to divide by: the forecast is the constant, not NaN."""
    df = series({"flat": np.full(60, 5.0), "zero": np.zeros(60)})
    out = LinearBaseline(12, 4).fit(df).predict(df)
    assert out["mean"].tolist() == [5.0] * 4 + [0.0] * 4
    np.testing.assert_array_equal(out["q0.9"], out["mean"])


def test_linear_baseline_caps_the_moving_average_at_the_context_length():
    df = series({"a": np.sin(np.arange(200) / 3.0) + np.arange(200) / 50})
    capped = LinearBaseline(10, 4, kernel_size=10).fit(df).predict(df)
    wide = LinearBaseline(10, 4, kernel_size=100).fit(df).predict(df)
    pd.testing.assert_frame_equal(wide, capped)


def test_a_strong_ridge_still_follows_a_trend():
    """The ridge shrinks the linear maps, not the bias: with every weight shrunk to nothing a
    straight line still continues (its normalised steps are the same in every window)."""
    df = series({"a": 3.0 + 0.5 * np.arange(100)})
    out = LinearBaseline(24, 6, ridge=1e6).fit(df).predict(df)
    np.testing.assert_allclose(out["mean"], 3.0 + 0.5 * np.arange(100, 106))


def test_the_ridge_penalty_does_not_weaken_with_more_data():
    """`ridge` is relative to the features' scale: fitting on the same series twice (twice the
    windows) regularises the same and forecasts the same."""
    y = np.cumsum(np.random.default_rng(0).normal(size=300))
    one = series({"a": y})
    two = series({"a": y, "b": y})
    once = LinearBaseline(24, 6, ridge=0.1).fit(one).predict(one)
    twice = LinearBaseline(24, 6, ridge=0.1).fit(two).predict(one)
    np.testing.assert_allclose(twice["mean"], once["mean"], rtol=1e-9)


def test_linear_baseline_bands_widen_with_the_horizon_on_a_random_walk():
    """Residual quantiles are kept per horizon step: a random walk's uncertainty grows."""
    y = np.cumsum(np.random.default_rng(0).normal(size=500))
    df = series({"a": y})
    out = LinearBaseline(24, 12).fit(df).predict(df)
    width = (out["q0.9"] - out["q0.1"]).to_numpy()
    assert width[-1] > 2 * width[0]


def test_linear_baseline_bands_come_from_windows_spread_over_the_whole_history(monkeypatch):
    """Residuals are taken from at most _MAX_RESIDUAL_WINDOWS windows, spread evenly over the
    history: a history that turns noisy half-way must not get the band of its quiet start."""
    rng = np.random.default_rng(0)
    y = np.sin(2 * np.pi * np.arange(600) / 24)
    y[300:] += rng.normal(scale=0.5, size=300)
    df = series({"a": y})
    full = LinearBaseline(48, 12).fit(df).predict(df)
    monkeypatch.setattr(baselines, "_MAX_RESIDUAL_WINDOWS", 40)
    sampled = LinearBaseline(48, 12).fit(df).predict(df)
    full_width = (full["q0.9"] - full["q0.1"]).mean()
    sampled_width = (sampled["q0.9"] - sampled["q0.1"]).mean()
    assert 0.5 * full_width < sampled_width < 2 * full_width


def test_predict_returns_the_levels_the_model_was_built_with_when_given_none():
    df = series({"a": np.sin(np.arange(100) / 3.0)})
    for model in (
        SeasonalNaive(season_length=4, quantiles=[0.75, 0.25]),
        LinearBaseline(12, 4, quantiles=[0.75, 0.25]),
    ):
        out = model.fit(df).predict(df)
        assert list(out.columns) == ["unique_id", "ds", "mean", "q0.25", "q0.75"]


@pytest.mark.parametrize("make", [lambda: SeasonalNaive(), lambda: LinearBaseline(12, 4)])
def test_baselines_answer_in_the_callers_id_and_time_types(make):
    """Integer ids and aware timestamps come back as given, as a Forecaster's do: a forecast
    of ids 3 and 7 in text could not be merged back on the caller's frame."""
    df = series({"3": np.sin(np.arange(60) / 3.0), "7": np.cos(np.arange(60) / 3.0)})
    df["unique_id"] = df["unique_id"].astype(int)
    df["ds"] = df["ds"].dt.tz_localize("Europe/Paris")
    out = make().fit(df).predict(df, horizon=4)
    assert out["unique_id"].dtype == np.int64 and out["unique_id"].unique().tolist() == [3, 7]
    assert str(out["ds"].dt.tz) == "Europe/Paris"
    assert (
        out.groupby("unique_id")["ds"].min().tolist() == [df["ds"].max() + pd.Timedelta("1h")] * 2
    )
    # Backtests read the validated frame and give the caller's types back once.
    result = backtest(make().fit(df), df, n_windows=2, horizon=4)
    assert result.forecasts["unique_id"].dtype == np.int64
    assert str(result.forecasts["ds"].dt.tz) == "Europe/Paris"
