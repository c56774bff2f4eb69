"""The long-term forecasting benchmark: the split, every test window scored, learning curves."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from benchmarks import ltsf
from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster.explain import LABELS, PARTS

TINY = {
    "model": {"d_model": 8, "n_heads": 2, "d_ff": 16, "n_encoder_layers": 1, "quantiles": ()},
    "train": {"max_epochs": 2, "max_windows_per_epoch": 256, "batch_size": 64},
}


@pytest.fixture()
def wide_csv(tmp_path):
    """A date column then two variables, 1,000 hours (not ETT: split 70 / 10 / 20 %)."""
    t = np.arange(1000)
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "date": pd.date_range("2020-01-01", periods=1000, freq="h"),
            "a": np.sin(2 * np.pi * t / 24) + rng.normal(0, 0.1, 1000),
            "b": np.cos(2 * np.pi * t / 24) + rng.normal(0, 0.1, 1000),
        }
    )
    path = tmp_path / "sensors.csv"
    frame.to_csv(path, index=False)
    return path


def test_split_keeps_the_lookback_before_validation_and_test(wide_csv):
    splits = ltsf.load_splits(wide_csv, lookback=48, horizon=24)
    per_series = splits.val.groupby("unique_id").size()
    assert (per_series == (800 - 700) + 48).all()  # [700 - L, 800): L history + validation
    assert splits.n_test_windows == 1000 - 800 - 24 + 1


def test_run_reports_the_learning_curve_and_scores_every_test_window(wide_csv):
    result = ltsf.run_one(wide_csv, 24, 48, seed=0, device="cpu", overrides=TINY)
    assert result["test_windows"] == 177
    assert len(result["train_losses"]) == len(result["val_losses"]) == result["epochs"]
    assert min(result["val_losses"] + [result["initial_val_loss"]]) == pytest.approx(
        result["best_val_loss"], rel=1e-4
    )


def test_run_reports_the_band_before_and_after_its_calibration(wide_csv):
    with_band = {**TINY, "model": {**TINY["model"], "quantiles": (0.1, 0.5, 0.9)}}
    result = ltsf.run_one(wide_csv, 24, 48, seed=0, device="cpu", overrides=with_band)
    # The band is calibrated to hold 80 % of the validation targets (one 5 % step of the
    # factor moves it by a few points on this small set).
    assert abs(result["val_band_coverage"] - 0.8) < 0.05
    # Every test window sees a whole context: the factor of the longest histories applies.
    factor = result["interval_scale"][-1]
    assert factor != 1
    widened = factor > 1
    assert (result["test_band_coverage"] > result["test_band_coverage_uncalibrated"]) == widened


def test_run_scores_validation_with_each_kind_of_attention_uniform(wide_csv):
    result = ltsf.run_one(wide_csv, 24, 48, seed=0, device="cpu", overrides=TINY, attention=True)
    earned = result["attention"]
    for part in PARTS:
        assert np.isfinite(earned[f"uniform {LABELS[part]}"]["val_mae"])
    assert 0 < earned["summary"]["encoder_entropy"] <= 1
    assert ltsf.run_one(wide_csv, 24, 48, seed=0, device="cpu", overrides=TINY)["attention"] is None


def test_scores_summed_batch_by_batch_equal_those_of_all_windows_at_once(wide_csv):
    """The test split is scored a batch at a time (memory: one batch); the figures must be
    those of every window held at once."""
    splits = ltsf.load_splits(wide_csv, lookback=48, horizon=24)
    model = Forecaster(
        ModelConfig(
            context_length=48, prediction_length=24, **TINY["model"] | {"quantiles": (0.1, 0.9)}
        ),
        TrainConfig(max_epochs=1, max_windows_per_epoch=512, progress=False, predict_batch_size=7),
    ).fit(splits.train)
    scores = ltsf._scores(model, splits.test)
    windows = model.forecast_windows(splits.test)
    assert scores["windows"] == len(windows.mean) == 2 * 177
    error = windows.mean - windows.target
    assert scores["mse"] == pytest.approx(np.mean(error**2), rel=1e-12)
    assert scores["mae"] == pytest.approx(np.mean(np.abs(error)), rel=1e-12)
    low, high = windows.quantiles[..., 0], windows.quantiles[..., -1]
    inside = (windows.target >= low) & (windows.target <= high)
    assert scores["band_coverage"] == pytest.approx(inside.mean(), rel=1e-12)


def test_peer_scores_count_every_window_of_neuralforecasts_cross_validation():
    """NeuralForecast's cross-validation frame: one row per (series, cutoff, step)."""
    predicted = pd.DataFrame(
        {
            "unique_id": ["a"] * 4 + ["b"] * 4,
            "cutoff": [0, 0, 1, 1] * 2,
            "y": [1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0],
            "DLinear": [1.0, 2.0, 3.0, 6.0, 1.0, -1.0, 0.0, 0.0],
        }
    )
    scores = ltsf.peer_scores(predicted, "DLinear")
    assert scores == {"mse": 6 / 8, "mae": 4 / 8, "windows": 4}


def test_peers_without_neuralforecast_say_so_and_ours_still_runs(wide_csv, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "neuralforecast", None)  # import fails as uninstalled
    args = ["--data", str(wide_csv), "--horizon", "24", "--lookback", "48", "--peers"]
    overrides = [f"--set=model.{k}={v}" for k, v in TINY["model"].items() if k != "quantiles"]
    overrides += [f"--set=train.{k}={v}" for k, v in TINY["train"].items()]
    assert ltsf.main([*args, *overrides]) == 0
    captured = capsys.readouterr()
    assert "neuralforecast not installed" in captured.err
    assert "| ours (L=48) |" in captured.out
    # ETTh1's published figures are not this data set's: no anchor row beside ours.
    assert not any(name in captured.out for name in ltsf.ANCHORS)
