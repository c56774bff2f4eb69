"""The short-catalogue benchmarks: every series forecast, ahead of naive on its MASE."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from benchmarks import short_catalogue
from forecaster.config import MAX_DEFAULT_CONTEXT


def test_catalogue_is_seeded_and_mostly_short():
    series, history = short_catalogue.make_catalogue()
    again, _ = short_catalogue.make_catalogue()
    assert all(np.array_equal(a, b) for a, b in zip(series, again, strict=True))
    lengths = history.groupby("unique_id").size()
    assert len(lengths) == short_catalogue.N_SERIES
    assert lengths.min() >= 13 and (lengths < MAX_DEFAULT_CONTEXT).mean() > 0.99


def test_tiny_run_beats_naive(tmp_path, capsys):
    out = tmp_path / "catalogue.json"
    tiny = ["model.d_model=8", "model.n_heads=1", "model.d_ff=16", "train.max_epochs=1"]
    argv = ["--json", str(out), "--no-peers", "--set", "train.progress=false"]
    for item in tiny:
        argv += ["--set", item]
    assert short_catalogue.main(argv) == 0
    rows = {row["model"]: row for row in json.loads(out.read_text())["results"]}
    assert set(rows) == {"naive", "drift", "mean", "ours (seed 0)"}
    assert np.isfinite(rows["ours (seed 0)"]["mase"])
    assert rows["ours (seed 0)"]["mase"] < rows["naive"]["mase"]
    assert 0 < rows["ours (seed 0)"]["band_coverage"] < 1  # the band's share of the holdout
    assert "| ours (seed 0) |" in capsys.readouterr().out


def test_weekly_catalogue_has_a_third_shorter_than_context_and_horizon():
    series, history = short_catalogue.make_weekly_catalogue()
    lengths = history.groupby("unique_id").size()
    assert len(lengths) == short_catalogue.WEEKLY_SERIES
    short = (lengths < MAX_DEFAULT_CONTEXT + short_catalogue.WEEKLY_HORIZON).mean()
    assert 0.25 < short < 0.42
    assert pd.infer_freq(history.loc[history["unique_id"] == "W0", "ds"]) == "W-SUN"
    assert all(
        len(y) == n + 13
        for y, n in zip(series, lengths.loc[history["unique_id"].unique()], strict=True)
    )


def test_tiny_weekly_run_forecasts_every_series(tmp_path):
    out = tmp_path / "weekly.json"
    argv = ["--kind", "weekly", "--json", str(out), "--no-peers"]
    tiny = ["model.d_model=8", "model.n_heads=1", "model.d_ff=16", "model.context_length=104"]
    for item in [*tiny, "train.max_epochs=1", "train.max_windows_per_epoch=2048"]:
        argv += ["--set", item]
    assert short_catalogue.main([*argv, "--set", "train.progress=false"]) == 0
    result = json.loads(out.read_text())
    rows = {row["model"]: row for row in result["results"]}
    assert result["kind"] == "weekly"
    assert np.isfinite(rows["ours (seed 0)"]["mase"])
    assert rows["ours (seed 0)"]["patch_length"] == 26  # a weekly season of 52, halved


def test_sensors_are_hourly_histories_shorter_than_a_day_and_all_forecast(tmp_path):
    """Every sensor has 18 hourly readings; each is forecast, ahead of naive, its band a few of
    its history's standard deviations wide rather than dozens."""
    series, history = short_catalogue.make_sensor_catalogue()
    lengths = history.groupby("unique_id", sort=False).size()
    assert len(lengths) == short_catalogue.SENSORS and set(lengths) == {18}
    assert pd.infer_freq(history.loc[history["unique_id"] == lengths.index[0], "ds"]) == "h"
    assert all(
        np.array_equal(y[:18], history.loc[history["unique_id"] == uid, "y"])
        for y, uid in zip(series, lengths.index, strict=True)
    )
    out = tmp_path / "sensors.json"
    argv = ["--kind", "sensors", "--json", str(out), "--no-peers", "--set", "train.progress=false"]
    tiny = ["model.d_model=8", "model.n_heads=1", "model.d_ff=16", "train.max_epochs=2"]
    for item in [*tiny, "train.max_windows_per_epoch=2048"]:
        argv += ["--set", item]
    assert short_catalogue.main(argv) == 0
    rows = {row["model"]: row for row in json.loads(out.read_text())["results"]}
    ours = rows["ours (seed 0)"]
    assert ours["mase"] < rows["naive"]["mase"]
    assert 0 < ours["band_coverage"] < 1
    assert ours["band_width_over_std"] < 10
