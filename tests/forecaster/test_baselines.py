"""Seasonal naive and the DLinear-style linear baseline."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forecaster import baselines
from forecaster.baselines import LinearBaseline, SeasonalNaive
from forecaster.errors import (
    HorizonTooLongError,
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
