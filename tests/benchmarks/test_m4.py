"""The M4 benchmark's protocol: holdout, scoring against Naive2, damaged histories, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from benchmarks import m4
from forecaster.explain import LABELS, PARTS


@pytest.fixture()
def wide_csv(tmp_path):
    """M4's layout: an id column, then values; series of different lengths end early (NaN)."""
    rng = np.random.default_rng(0)
    t = np.arange(400)
    rows = []
    for i, n in enumerate([400, 300, 250]):
        y = 50 + 10 * np.sin(2 * np.pi * t / 24) + rng.normal(0, 1, 400) + 5 * i
        rows.append([f"H{i}", *y[:n], *[np.nan] * (400 - n)])
    path = tmp_path / "Hourly-train.csv"
    pd.DataFrame(rows, columns=["V1", *[f"V{k}" for k in range(2, 402)]]).to_csv(path, index=False)
    return path


def test_holdout_is_the_last_48_points(wide_csv):
    split = m4.make_split(wide_csv, None)
    assert split.ids == ["H0", "H1", "H2"]
    assert [len(h) for h in split.history] == [352, 252, 202]
    assert split.truth.shape == (3, 48)


def test_naive2_continues_a_multiplicative_season_exactly():
    index = 1 + 0.3 * np.sin(2 * np.pi * np.arange(24) / 24)
    y = 100 * np.tile(index, 20)  # 480 points, a pure multiplicative season
    split = m4.Split(["s"], [y[:-48]], y[None, -48:], np.ones(1))
    np.testing.assert_allclose(m4.naive2(split), split.truth, rtol=1e-9)
    assert m4.score(split, m4.naive2(split))["owa"] == pytest.approx(0.0, abs=1e-9)


def test_naive2_of_a_series_without_season_is_the_last_value():
    y = np.random.default_rng(1).normal(100, 1, 300)  # white noise: no season at lag 24
    split = m4.Split(["s"], [y[:-48]], y[None, -48:], np.ones(1))
    np.testing.assert_allclose(m4.naive2(split), np.full((1, 48), y[-49]))


def test_short_and_gappy_keeps_two_observed_points_and_the_scale(wide_csv):
    split = m4.make_split(wide_csv, None)
    damaged = m4.short_and_gappy(split, context_length=48, seed=3)
    for h in damaged.history:
        assert np.isfinite(h).sum() >= 2 and np.isfinite(h[-1])
    np.testing.assert_array_equal(damaged.scales, split.scales)
    assert np.isfinite(m4.seasonal_naive(damaged)).all()


def test_cli_scores_every_series_and_writes_json(wide_csv, tmp_path, capsys):
    out = tmp_path / "m4.json"
    code = m4.main(
        [
            "--data",
            str(wide_csv),
            "--no-peers",
            "--short-and-gappy",
            "--set",
            "model.context_length=48",
            "--set",
            "train.max_epochs=1",
            "--set",
            "train.progress=false",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    rows = {r["model"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"naive (same split)", "seasonal naive (same split)", "ours (seed 0)"}
    assert all(np.isfinite(r["owa"]) for r in rows.values())
    assert set(rows["ours (seed 0)"]["share_below"]) == {"0.1", "0.5", "0.9"}
    assert "| ours (seed 0) |" in capsys.readouterr().out


def test_cli_refuses_a_missing_file(tmp_path, capsys):
    assert m4.main(["--data", str(tmp_path / "nope.csv")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_bad_set_option_is_refused_with_its_text(wide_csv, capsys):
    with pytest.raises(SystemExit) as exited:
        m4.main(["--data", str(wide_csv), "--set", "d_model=8"])
    assert exited.value.code == 2
    assert "--set d_model=8: expected model.FIELD=VALUE" in capsys.readouterr().err


def test_calibration_counts_the_truth_below_each_quantile_and_inside_the_band():
    truth = np.tile(np.arange(m4.HORIZON, dtype=float), (2, 1))  # 0 .. 47 for both series
    split = m4.Split(["a", "b"], [np.ones(100)] * 2, truth, np.ones(2))
    ds = pd.date_range("2000-01-01", periods=m4.HORIZON, freq="h")
    predicted = pd.concat(
        pd.DataFrame({"unique_id": sid, "ds": ds, "q0.1": 4.5, "q0.5": 24.0, "q0.9": 43.5})
        for sid in ("a", "b")
    )
    got = m4.calibration(split, predicted, (0.1, 0.5, 0.9), context_length=336)
    assert got["share_below"] == {"0.1": 5 / 48, "0.5": 24 / 48, "0.9": 44 / 48}
    assert got["band_coverage"] == {"0.1-0.9": 39 / 48}
    # 100 points of history, a context of 336: the band of history up to L/2.
    assert got["band_coverage_by_history"] == {"up_to_L/2": {"series": 2, "coverage": 39 / 48}}


def test_cli_scores_the_model_again_with_each_kind_of_attention_uniform(wide_csv, tmp_path):
    out = tmp_path / "m4.json"
    settings = ["model.context_length=48", "train.max_epochs=1", "train.progress=false"]
    args = ["--data", str(wide_csv), "--no-peers", "--attention", "--json", str(out)]
    assert m4.main(args + [a for s in settings for a in ("--set", s)]) == 0
    rows = {r["model"]: r for r in json.loads(out.read_text())["results"]}
    for part in PARTS:
        assert np.isfinite(rows[f"ours (seed 0), uniform {LABELS[part]}"]["owa"])
    summary = rows["ours (seed 0)"]["attention"]
    assert 0 < summary["cross_entropy"] <= 1
