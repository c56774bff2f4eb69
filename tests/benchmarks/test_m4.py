"""The M4 benchmark's protocol: holdout, scoring against Naive2, damaged histories, the CLI,
for every M4 group."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks import m4
from forecaster.explain import LABELS, PARTS
from forecaster.metrics import mase_scale

HOURLY = m4.GROUPS["Hourly"]
# An epoch is max_windows_per_epoch windows however few the file holds: keep it short.
QUICK = ["train.max_epochs=1", "train.max_windows_per_epoch=1024", "train.progress=false"]


def write_wide(path: Path, series: list[np.ndarray]) -> Path:
    """`series` in M4's layout: an id column, then values, NaN after each series ends."""
    width = max(len(y) for y in series)
    rows = [[f"S{i}", *y, *[np.nan] * (width - len(y))] for i, y in enumerate(series)]
    columns = ["V1", *[f"V{k}" for k in range(2, width + 2)]]
    pd.DataFrame(rows, columns=columns).to_csv(path, index=False)
    return path


def sets(*items: str) -> list[str]:
    return [a for item in items for a in ("--set", item)]


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
    split = m4.make_split(wide_csv, None, HOURLY)
    assert split.ids == ["H0", "H1", "H2"]
    assert [len(h) for h in split.history] == [352, 252, 202]
    assert split.truth.shape == (3, 48)


def test_naive2_continues_a_multiplicative_season_exactly():
    index = 1 + 0.3 * np.sin(2 * np.pi * np.arange(24) / 24)
    y = 100 * np.tile(index, 20)  # 480 points, a pure multiplicative season
    split = m4.Split(HOURLY, ["s"], [y[:-48]], y[None, -48:], np.ones(1))
    np.testing.assert_allclose(m4.naive2(split), split.truth, rtol=1e-9)
    assert m4.score(split, m4.naive2(split), HOURLY.naive2)["owa"] == pytest.approx(0.0, abs=1e-9)


def test_drift_continues_the_line_through_the_first_and_last_observed_values():
    """Missing points at either end count as steps, not as values; one observed value gives
    the last value."""
    line = np.array([np.nan, 10.0, np.nan, 14.0, 16.0, np.nan])  # 2 a step, last seen at 4
    single = np.array([np.nan, 5.0])
    group = replace(HOURLY, horizon=2)
    split = m4.Split(group, ["a", "b"], [line, single], np.zeros((2, 2)), np.ones(2))
    np.testing.assert_allclose(m4.drift(split), [[20.0, 22.0], [5.0, 5.0]])


def test_naive2_of_a_series_without_season_is_the_last_value():
    y = np.random.default_rng(1).normal(100, 1, 300)  # white noise: no season at lag 24
    split = m4.Split(HOURLY, ["s"], [y[:-48]], y[None, -48:], np.ones(1))
    np.testing.assert_allclose(m4.naive2(split), np.full((1, 48), y[-49]))


def test_short_and_gappy_keeps_two_observed_points_and_the_scale(wide_csv):
    split = m4.make_split(wide_csv, None, HOURLY)
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
            *sets(*QUICK),
            "--json",
            str(out),
        ]
    )
    assert code == 0
    written = json.loads(out.read_text())
    assert written["group"] == "Hourly"
    # Hourly's OWA is against the published Naive2 figures, whatever the split.
    assert written["owa_reference"] == {"smape": 18.383, "mase": 2.395, "source": "published"}
    rows = {r["model"]: r for r in written["results"]}
    assert set(rows) == {
        "naive (same split)",
        "seasonal naive (same split)",
        "drift (same split)",
        "ours (seed 0)",
    }
    assert all(np.isfinite(r["owa"]) for r in rows.values())
    assert set(rows["ours (seed 0)"]["share_below"]) == {"0.1", "0.5", "0.9"}
    assert "| ours (seed 0) |" in capsys.readouterr().out


def test_refit_row_scores_a_model_trained_on_the_validation_tail_too(wide_csv, tmp_path):
    out = tmp_path / "m4.json"
    args = ["--data", str(wide_csv), "--no-peers", "--refit", "--json", str(out)]
    assert m4.main([*args, *sets("model.context_length=48", *QUICK)]) == 0
    rows = {r["model"]: r for r in json.loads(out.read_text())["results"]}
    ours, refit = rows["ours (seed 0)"], rows["ours (seed 0), refit on every window"]
    assert np.isfinite(refit["owa"]) and refit["seconds"] is not None
    assert refit["smape"] != ours["smape"]


def test_cli_refuses_a_missing_file(tmp_path, capsys):
    assert m4.main(["--data", str(tmp_path / "nope.csv")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_bad_set_option_is_refused_with_its_text(wide_csv, capsys):
    with pytest.raises(SystemExit) as exited:
        m4.main(["--data", str(wide_csv), "--set", "d_model=8"])
    assert exited.value.code == 2
    assert "--set d_model=8: expected model.FIELD=VALUE" in capsys.readouterr().err


def test_calibration_counts_the_truth_below_each_quantile_and_inside_the_band():
    truth = np.tile(np.arange(HOURLY.horizon, dtype=float), (2, 1))  # 0 .. 47 for both series
    split = m4.Split(HOURLY, ["a", "b"], [np.ones(100)] * 2, truth, np.ones(2))
    ds = pd.date_range("2000-01-01", periods=HOURLY.horizon, freq="h")
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
    settings = ["model.context_length=48", *QUICK]
    args = ["--data", str(wide_csv), "--no-peers", "--attention", "--json", str(out)]
    assert m4.main(args + [a for s in settings for a in ("--set", s)]) == 0
    rows = {r["model"]: r for r in json.loads(out.read_text())["results"]}
    for part in PARTS:
        assert np.isfinite(rows[f"ours (seed 0), uniform {LABELS[part]}"]["owa"])
    summary = rows["ours (seed 0)"]["attention"]
    assert 0 < summary["cross_entropy"] <= 1


def test_with_glitches_changes_one_observed_reading_of_the_last_context_a_series(wide_csv):
    split = m4.make_split(wide_csv, None, HOURLY)
    split = replace(split, history=[*split.history, np.array([1.0, np.nan])])  # too short
    glitched = m4.with_glitches(split, context_length=48)
    assert list(glitched) == ["x10", "zero"]
    for kind, damaged in glitched.items():
        for clean, h in zip(split.history[:3], damaged.history[:3], strict=True):
            changed = np.flatnonzero(clean != h)
            assert len(changed) == 1 and changed[0] >= len(clean) - 48
            assert h[changed[0]] == (10 * clean[changed[0]] if kind == "x10" else 0.0)
        np.testing.assert_array_equal(damaged.history[3], split.history[3])


def test_dirty_histories_make_about_rate_of_the_readings_glitches_and_keep_the_rest(wide_csv):
    split = m4.make_split(wide_csv, None, HOURLY)
    dirty = m4.with_dirty_histories(split, rate=0.1)
    changed = total = 0
    for clean, h in zip(split.history, dirty.history, strict=True):
        moved = clean != h
        assert np.all((h[moved] == 10 * clean[moved]) | (h[moved] == 0.0))
        changed, total = changed + moved.sum(), total + len(clean)
    assert 0.05 < changed / total < 0.15
    np.testing.assert_array_equal(dirty.truth, split.truth)  # the holdout stays clean
    np.testing.assert_array_equal(dirty.scales, split.scales)


@pytest.mark.parametrize("rate", ["0", "1", "-0.1"])
def test_dirty_training_rate_outside_0_1_exits_2(wide_csv, capsys, rate):
    assert m4.main(["--data", str(wide_csv), "--dirty-training", rate]) == 2
    assert "--dirty-training" in capsys.readouterr().err


def test_cli_scores_glitched_histories_with_and_without_the_rule(wide_csv, tmp_path):
    out = tmp_path / "m4.json"
    args = ["--data", str(wide_csv), "--no-peers", "--glitches", "--json", str(out)]
    assert m4.main(args + sets("model.context_length=48", *QUICK)) == 0
    rows = {r["model"]: r["owa"] for r in json.loads(out.read_text())["results"]}
    for other in ("no glitch rule", "window's glitch test alone"):
        assert rows[f"ours (seed 0), {other}"] == pytest.approx(rows["ours (seed 0)"], rel=1e-3)
    kinds = "ours (seed 0), one {} glitch a series, {}"
    ruled, window, raw = "glitch rule", "window's glitch test alone", "no glitch rule"
    # Each x10 reading is found by the window's test. A zero lies 5 robust deviations from its
    # window's median where the daily cycle swings by 20 around 50, within the window's 12: only
    # the same hour of the days around it finds it.
    assert rows[kinds.format("x10", ruled)] < 0.5 * rows[kinds.format("x10", raw)]
    assert rows[kinds.format("x10", window)] == rows[kinds.format("x10", ruled)]
    assert rows[kinds.format("zero", window)] == rows[kinds.format("zero", raw)]
    assert rows[kinds.format("zero", ruled)] < 0.5 * rows[kinds.format("zero", raw)]


# ------------------------------------------------------------------------------------------
# the other groups

DAILY, MONTHLY, YEARLY = m4.GROUPS["Daily"], m4.GROUPS["Monthly"], m4.GROUPS["Yearly"]


def seasonal_series(lengths: list[int], m: int, seed: int = 0) -> list[np.ndarray]:
    """Positive series with a trend and a cycle of m steps, of the given lengths."""
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(lengths):
        t = np.arange(n)
        out.append(50 + 5 * i + 0.1 * t + 5 * np.sin(2 * np.pi * t / m) + rng.normal(0, 1, n))
    return out


@pytest.fixture()
def daily_csvs(tmp_path):
    """Daily-train.csv and Daily-test.csv (the 14 values after each series), weekly cycles."""
    series = seasonal_series([134, 94, 74], m=7)
    train = write_wide(tmp_path / "Daily-train.csv", [y[:-14] for y in series])
    test = write_wide(tmp_path / "Daily-test.csv", [y[-14:] for y in series])
    return train, test


def test_group_comes_from_the_option_else_the_file_name():
    assert m4.group_of(None, Path("m4/Daily-train.csv")) is DAILY
    assert m4.group_of(None, Path("monthly-test.csv")) is MONTHLY
    assert m4.group_of("Weekly", Path("Daily-train.csv")) is m4.GROUPS["Weekly"]
    assert m4.group_of(None, Path("some.csv")) is None


def test_group_option_is_case_insensitive_and_recorded(tmp_path, capsys):
    data = write_wide(tmp_path / "some.csv", seasonal_series([80, 60, 42], m=12))
    out = tmp_path / "m4.json"
    args = ["--data", str(data), "--group", "monthly", "--no-ours", "--no-peers"]
    assert m4.main([*args, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["group"] == "Monthly"
    assert "some.csv (M4 Monthly protocol), 3 series, horizon 18," in capsys.readouterr().out


def test_a_file_naming_no_group_exits_2_naming_the_valid_ones(tmp_path, capsys):
    data = write_wide(tmp_path / "some.csv", seasonal_series([80], m=12))
    assert m4.main(["--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --data {data}:")
    assert all(name in err for name in ("Yearly", "Quarterly", "Monthly", "Weekly", "Daily"))
    with pytest.raises(SystemExit) as exited:
        m4.main(["--data", str(data), "--group", "fortnightly"])
    assert exited.value.code == 2
    assert "Hourly" in capsys.readouterr().err


def test_horizon_option_holds_out_and_forecasts_another_competitions_horizon(tmp_path, capsys):
    # Tourism Monthly's horizon is 24, M4 Monthly's 18.
    series = seasonal_series([120, 100, 90], m=12)
    data = write_wide(tmp_path / "Tourism-Monthly-train.csv", series)
    out = tmp_path / "m4.json"
    args = ["--data", str(data), "--group", "Monthly", "--horizon", "24", "--no-peers"]
    assert m4.main([*args, "--json", str(out), *sets("model.context_length=36", *QUICK)]) == 0
    written = json.loads(out.read_text())
    assert written["horizon"] == 24
    assert written["owa_reference"]["source"] == "Naive2 on the same split"
    split = m4.make_split(data, None, replace(MONTHLY, horizon=24))
    np.testing.assert_array_equal(split.truth[0], series[0][-24:])
    naive2_errors = m4.errors(split, m4.naive2(split))
    assert (written["owa_reference"]["smape"], written["owa_reference"]["mase"]) == naive2_errors
    assert np.isfinite(next(r for r in written["results"] if r["model"] == "ours (seed 0)")["owa"])
    assert "3 series, horizon 24, scored on the holdout (last 24 points" in capsys.readouterr().out


def test_horizon_option_below_one_exits_2(wide_csv, capsys):
    assert m4.main(["--data", str(wide_csv), "--horizon", "0"]) == 2
    assert capsys.readouterr().err == "error: --horizon 0: expected 1 or more\n"


def test_daily_runs_end_to_end_against_naive2_on_the_same_split(daily_csvs, tmp_path, capsys):
    train, test = daily_csvs
    out = tmp_path / "m4.json"
    args = ["--data", str(train), "--test", str(test), "--no-peers", "--gap-patterns"]
    assert m4.main([*args, "--json", str(out), *sets("model.context_length=28", *QUICK)]) == 0
    written = json.loads(out.read_text())
    assert written["group"] == "Daily"
    assert written["owa_reference"]["source"] == "Naive2 on the same split"
    rows = {r["model"]: r for r in written["results"]}
    assert {
        "ours (seed 0)",
        "seasonal naive, last day missing",
        "ours (seed 0), history cut to 14 points (half the context)",
    } <= set(rows)
    assert all(np.isfinite(r["owa"]) for r in rows.values())
    assert rows["Naive2 (same split)"]["owa"] == 1.0
    # Intervals are scored on damaged histories too, by the band of history they fall in.
    cut = rows["ours (seed 0), history cut to 14 points (half the context)"]
    assert 0 <= cut["band_coverage"]["0.1-0.9"] <= 1
    assert list(cut["band_coverage_by_history"]) == ["up_to_L/2"]
    printed = capsys.readouterr().out
    assert (
        "Daily-train.csv (M4 Daily protocol), 3 series, horizon 14, scored on the test file"
        in printed
    )
    assert "ES-RNN" not in printed  # Hourly's published anchors are Hourly's only


def test_damaged_histories_are_scored_against_naive2_on_the_undamaged_ones(tmp_path):
    # Monthly: Naive2 reads the yearly cycle, which the missing points would hide.
    data = write_wide(tmp_path / "Monthly-train.csv", seasonal_series([140, 120, 100], m=12))
    out = tmp_path / "m4.json"
    assert m4.main(["--data", str(data), "--short-and-gappy", "--no-ours", "--json", str(out)]) == 0
    split = m4.make_split(data, None, MONTHLY)
    smape, mase = m4.errors(split, m4.naive2(split))
    reference = json.loads(out.read_text())["owa_reference"]
    assert (reference["smape"], reference["mase"]) == (smape, mase)


def test_naive2_with_a_season_of_one_step_is_the_last_value():
    y = 100 + np.arange(120.0) + 5 * np.sin(np.arange(120) / 3)  # autocorrelated at lag 1
    split = m4.Split(DAILY, ["s"], [y[:-14]], y[None, -14:], np.ones(1))
    np.testing.assert_array_equal(m4.naive2(split), np.full((1, 14), y[-15]))


def test_gap_patterns_count_in_seasons_of_the_group():
    assert list(m4.gap_patterns(HOURLY)) == [
        "5% of points missing at random",
        "last day missing",
        "one day a week back missing",
        "last three days missing",
    ]

    def missing(group: m4.Group, pattern: str, n: int) -> np.ndarray:
        truth = np.ones((1, group.horizon))
        split = m4.Split(group, ["s"], [np.arange(1.0, n + 1)], truth, np.ones(1))
        return np.flatnonzero(np.isnan(m4.with_gaps(split, pattern).history[0]))

    np.testing.assert_array_equal(missing(HOURLY, "last day missing", 400), np.arange(376, 400))
    np.testing.assert_array_equal(missing(DAILY, "last day missing", 400), [399])
    np.testing.assert_array_equal(missing(DAILY, "one day a week back missing", 400), [393])
    three_years = "last three years missing"
    np.testing.assert_array_equal(missing(MONTHLY, three_years, 100), np.arange(64, 100))
    # A history shorter than the outage keeps its first two points.
    np.testing.assert_array_equal(missing(MONTHLY, three_years, 24), np.arange(2, 24))


def test_gap_patterns_cut_histories_short_of_the_context():
    cuts = [p for p in m4.gap_patterns(HOURLY, context_length=336) if p.startswith("history")]
    assert cuts == [
        "history cut to 335 points (one point short of the context)",
        "history cut to 312 points (one day short of the context)",
        "history cut to 168 points (half the context)",
    ]
    y = np.arange(1.0, 401)
    split = m4.Split(HOURLY, ["s"], [y], np.ones((1, HOURLY.horizon)), np.ones(1))
    cut = m4.with_gaps(split, cuts[1], context_length=336)
    # The most recent points are kept, and MASE's scale is the full history's.
    np.testing.assert_array_equal(cut.history[0], y[-312:])
    np.testing.assert_array_equal(cut.scales, split.scales)
    # Where a season is one step, L - 1 is L - m: one cut. None is shorter than two points.
    assert [p for p in m4.gap_patterns(YEARLY, context_length=24) if p.startswith("history")] == [
        "history cut to 23 points (one point short of the context)",
        "history cut to 12 points (half the context)",
    ]
    assert not [p for p in m4.gap_patterns(YEARLY, context_length=2) if p.startswith("history")]


@pytest.fixture()
def yearly_csv(tmp_path):
    """Yearly-train.csv with one series of 700 years, more than pandas' range holds."""
    return write_wide(tmp_path / "Yearly-train.csv", seasonal_series([700, 40, 20], m=2))


def test_yearly_fits_the_library_on_the_most_recent_points_that_fit(yearly_csv):
    split = m4.make_split(yearly_csv, None, YEARLY)
    frame = m4.long_frame(split)
    lengths = frame.groupby("unique_id", sort=False).size().tolist()
    assert lengths == [579, 34, 14]  # 1678 .. 2262 holds 585 year starts, 6 for the horizon
    last = frame[frame["unique_id"] == "S0"]
    np.testing.assert_array_equal(last["y"], split.history[0][-579:])
    assert pd.Timestamp(last["ds"].max()) + 6 * pd.offsets.YearBegin() <= pd.Timestamp.max
    # MASE's scale keeps the full history (694 points).
    assert split.scales[0] == mase_scale(split.history[0], 1) and len(split.history[0]) == 694


def test_yearly_runs_end_to_end(yearly_csv, tmp_path):
    out = tmp_path / "m4.json"
    args = ["--data", str(yearly_csv), "--no-peers", "--gap-patterns", "--json", str(out)]
    assert m4.main([*args, *sets("model.context_length=24", *QUICK)]) == 0
    rows = {r["model"]: r for r in json.loads(out.read_text())["results"]}
    assert {"ours (seed 0)", "ours (seed 0), last three years missing"} <= set(rows)
    assert all(np.isfinite(r["owa"]) for r in rows.values())
    assert rows["Naive2 (same split)"]["owa"] == 1.0


def test_attention_runs_on_yearly_whose_padded_context_precedes_pandas_range(yearly_csv, tmp_path):
    # The index starts in 1678: a context of 48 years reaches before pandas' first timestamp.
    out = tmp_path / "m4.json"
    args = ["--data", str(yearly_csv), "--no-peers", "--attention", "--json", str(out)]
    assert m4.main([*args, *sets("model.context_length=48", *QUICK)]) == 0
    rows = {r["model"]: r for r in json.loads(out.read_text())["results"]}
    assert 0 < rows["ours (seed 0)"]["attention"]["cross_entropy"] <= 1
