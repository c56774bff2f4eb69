"""Realised accuracy: logged forecasts scored against data observed later, per version."""

from __future__ import annotations

import dataclasses
import math
import shutil
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from forecaster.outputs import ForecastArrays, no_glitches
from pipelines.forecast_log import read_log, records
from pipelines.monitor import VersionAccuracy, degradation, score
from pipelines.predict import predict_file
from pipelines.retrain import check_champion, retrain
from pipelines.schedule import run_schedule
from tests.pipelines.pipeline_helpers import client_for, make_settings, synthetic

T = pd.date_range("2024-01-01", periods=7, freq="h")


def _log_rows(version: str, sid: str, origin: int, means, lower=None, upper=None) -> pd.DataFrame:
    h = len(means)
    quantiles, levels = np.zeros((1, h, 0)), ()
    if lower is not None:
        quantiles = np.stack([np.asarray(lower, float), np.asarray(upper, float)], axis=-1)[None]
        levels = (0.1, 0.9)
    arrays = ForecastArrays(
        series_ids=np.array([sid], dtype=object),
        origins=T[origin : origin + 1].to_numpy(),
        timestamps=T[origin + 1 : origin + 1 + h].to_numpy()[None],
        mean=np.asarray(means, float)[None],
        quantiles=quantiles,
        levels=levels,
        glitches=no_glitches(1),
    )
    return records(arrays, model_name="forecaster", model_version=version).to_pandas()


def test_scores_match_a_hand_computation():
    actuals = pd.DataFrame(
        {
            "unique_id": ["a"] * 7 + ["b"] * 7,
            "ds": list(T) * 2,
            # t6 of "a" is not observed yet; lag-1 scales: a -> 1, b -> 2
            "y": [0, 1, 2, 3, 5, 2, np.nan, 0, 2, 4, 6, 6, 6, 6],
        }
    )
    log = pd.concat(
        [
            # v1 for a from t3: errors |5-4| = 1, |2-4| = 2, |nan - 4| not scored
            _log_rows("1", "a", 3, [4, 4, 4], lower=[3, 3, 3], upper=[5, 5, 5]),
            # v1 for b from t3: errors 2, 0, 0; b's scale is 2
            _log_rows("1", "b", 3, [8, 6, 6], lower=[7, 5, 5], upper=[9, 7, 7]),
            # v2 for a from t4, no interval: error 0
            _log_rows("2", "a", 4, [2]),
        ],
        ignore_index=True,
    )
    realised = score(log, actuals, season=1)
    v1, v2 = realised.versions["1"], realised.versions["2"]
    assert v1.mae == pytest.approx((1 + 2 + 2 + 0 + 0) / 5)
    assert v1.mase == pytest.approx((1.5 / 1 + (2 / 3) / 2) / 2)  # mean of per-series MASE
    assert v1.coverage == pytest.approx(3 / 5)  # a: 5 in [3, 5]; b: 6 in [5, 7] twice
    assert v1.level == pytest.approx(0.8)
    assert (v1.points, v1.series) == (5, 2)
    assert (v1.first_ds, v1.last_ds) == (T[4], T[6])
    assert (v2.mae, v2.mase, v2.points) == (0.0, 0.0, 1)
    assert math.isnan(v2.coverage)


def test_a_version_is_scaled_by_its_own_history_and_seasonally_only():
    """v2's MASE does not move when v1 forecast the series earlier (its scale came from the
    history before the first forecast of any version: 0.56 became 1.98); a history too short
    for a seasonal difference gives no MASE, not a lag-1 one that reads as degradation."""
    actuals = pd.DataFrame({"unique_id": "a", "ds": T, "y": [0.0, 4, 0, 4, 1, 3, 1]})
    own = _log_rows("2", "a", 4, [2, 2])  # errors 1, 1; season 2 before t5: |0-0|, |4-4|, |1-0|
    alone = score(own, actuals, season=2).versions["2"].mase
    assert alone == pytest.approx(1 / (1 / 3))
    earlier = _log_rows("1", "a", 1, [1])
    beside = score(pd.concat([earlier, own], ignore_index=True), actuals, season=2)
    assert beside.versions["2"].mase == pytest.approx(alone)
    assert math.isnan(beside.versions["1"].mase)  # 2 points before t2: no seasonal difference


def test_a_feed_that_starts_after_the_first_forecast_scales_from_a_season_into_it():
    """A feed that keeps its last days holds no history before a long-serving champion's
    first forecast: its MASE was undefined, and read as "not degraded" however large the
    errors. Forecasts from the first one with a season of history before it are scored."""
    actuals = pd.DataFrame({"unique_id": "a", "ds": T[1:], "y": [4.0, 0, 5, 1, 3, 1]})
    log = _log_rows("2", "a", 0, [4, 0, 5, 4, 4, 4])  # right at t1-t3, then off by 3, 1, 3
    accuracy = score(log, actuals, season=2).versions["2"]
    # Scored from t4, the first with a season and one more point before it; scaled by
    # t1-t3's one seasonal difference, |5 - 4| = 1.
    assert accuracy.mase == pytest.approx((3 + 1 + 3) / 3)
    assert (accuracy.points, accuracy.mae) == (6, pytest.approx(7 / 6))


def test_coverage_is_of_one_nominal_level():
    """Bands logged at two levels blended into one coverage reported at the larger level
    (0.514 'at 0.8', made of 0.715 at 0.8 and 0.313 at 0.4)."""
    actuals = pd.DataFrame({"unique_id": "a", "ds": T, "y": [0.0, 1, 2, 3, 4, 5, 6]})
    # all inside, bounds included: 3 on its lower bound, 4 on its upper one
    wide = _log_rows("1", "a", 2, [3, 4, 5], lower=[3, 3, 4], upper=[4, 4, 6])
    narrow = _log_rows("1", "a", 1, [2], lower=[5], upper=[6]).assign(level=0.4)  # outside
    accuracy = score(pd.concat([wide, narrow], ignore_index=True), actuals, season=1)
    assert accuracy.versions["1"].level == pytest.approx(0.8)
    assert accuracy.versions["1"].coverage == 1.0
    # As many rows at each level: the wider band's coverage is the one reported.
    tied = _log_rows("1", "a", 3, [4, 5, 6], lower=[5, 5, 5], upper=[6, 6, 6]).assign(level=0.4)
    tie = score(pd.concat([wide, tied], ignore_index=True), actuals, season=1).versions["1"]
    assert (tie.level, tie.coverage) == (pytest.approx(0.8), 1.0)


def test_nothing_observed_yet_scores_nothing():
    log = _log_rows("1", "a", 3, [4, 4])
    actuals = pd.DataFrame({"unique_id": ["a"] * 4, "ds": T[:4], "y": [0.0, 1, 2, 3]})
    assert score(log, actuals, season=1).versions == {}


def test_a_forecast_between_observed_timestamps_is_not_scored():
    """A forecast for 01:30 of hourly data (a model of another frequency logging to the same
    directory) has no actual: it must not be joined to the next hour's."""
    actuals = pd.DataFrame({"unique_id": "a", "ds": T, "y": [0.0, 1, 2, 3, 4, 5, 6]})
    log = _log_rows("1", "a", 3, [4, 5])
    half_hours = log.assign(ds=log["ds"] + pd.Timedelta("30min"), model_version="2")
    realised = score(pd.concat([log, half_hours], ignore_index=True), actuals, season=1)
    assert list(realised.versions) == ["1"]
    assert realised.scored_rows == 2 and realised.log_rows == 4


def _accuracy(mase: float, points: int = 100) -> VersionAccuracy:
    return VersionAccuracy("3", 1.0, mase, 0.8, 0.8, points, 5, T[0], T[-1])


@pytest.mark.parametrize(
    ("mase", "points", "degraded"),
    [(1.29, 100, False), (1.31, 100, True), (5.0, 10, False)],
)
def test_degraded_only_past_the_tolerance_with_enough_points(mase, points, degraded):
    verdict, reason = degradation(_accuracy(mase, points), 1.0, tolerance=0.3, min_points=50)
    assert verdict is degraded
    assert "version 3" in reason


def _observed(frame: pd.DataFrame, n_new: int, shift: float = 0.0) -> pd.DataFrame:
    """``frame`` with ``n_new`` more hours per series, continuing it (+ ``shift``)."""
    longer = synthetic(n_steps=frame.groupby("unique_id").size().max() + n_new)
    new = longer.groupby("unique_id").tail(n_new)
    return pd.concat([frame, new.assign(y=new["y"] + shift)], ignore_index=True)


def _log_champion_forecasts(settings, data_csv, out) -> None:
    """`forecaster predict` with the champion on ``data_csv``, logging to the settings' log."""
    predict_file(
        settings.champion_uri,
        data_csv,
        out,
        tracking_uri=settings.resolved_tracking_uri,
        forecast_log=settings.forecast_log,
        progress=False,
    )


def test_retrain_scores_the_champions_logged_forecasts_and_a_shift_is_degradation(
    store, tmp_path, data_csv
):
    settings = make_settings(store, degradation_min_points=10, forecast_log=str(tmp_path / "log"))
    data = pd.read_csv(data_csv, parse_dates=["ds"])
    out = tmp_path / "forecast.csv"
    _log_champion_forecasts(settings, data_csv, out)
    logged = read_log(settings.forecast_log)
    horizon = settings.horizon
    assert len(logged) == data["unique_id"].nunique() * horizon
    assert set(logged["model_version"]) == {"1"}
    assert (logged["origin"] == data["ds"].max()).all()

    # The next hours arrive as expected: the champion is healthy.
    healthy = check_champion(settings, _observed(data, horizon))
    forecast = pd.read_csv(out, parse_dates=["ds"])
    truth = _observed(data, horizon).merge(forecast, on=["unique_id", "ds"])
    assert healthy.champion.mae == pytest.approx(np.mean(np.abs(truth["y"] - truth["mean"])))
    assert healthy.champion.points == len(truth) == len(logged)
    assert not healthy.degraded, healthy.reason
    # Monitoring trains nothing: actuals far shorter than training needs score the same.
    recent = _observed(data, horizon).groupby("unique_id").tail(2 * horizon)
    assert check_champion(settings, recent).champion.mae == pytest.approx(healthy.champion.mae)

    client = client_for(store)
    tags = client.get_model_version("forecaster", "1").tags
    assert float(tags["realised.mae"]) == pytest.approx(healthy.champion.mae, rel=1e-5)
    assert tags["realised.degraded"] == "false"
    # Every step of the horizon was logged: the backtest at those steps, step by step.
    assert len(tags["backtest.mase_by_step"].split(",")) == horizon
    assert "backtest at the logged steps" in healthy.reason

    # A level shift the model has never seen: realised MASE far above the backtest's.
    shifted = _observed(data, horizon, shift=10 * data["y"].std())
    result = retrain(settings, shifted)
    assert result.monitoring is not None and result.monitoring.degraded
    assert "realised MASE" in result.monitoring.reason
    run = client.get_run(result.run_id)
    assert run.data.tags["monitoring.degraded"] == "true"
    assert run.data.tags["monitoring.reason"] == result.monitoring.reason  # the run page's why
    assert run.data.metrics["realised/v1/mase"] == pytest.approx(result.monitoring.champion.mase)
    artifacts = [a.path for a in client.list_artifacts(result.run_id, "monitoring")]
    assert "monitoring/realised_accuracy.png" in artifacts
    assert "monitoring/realised_accuracy.json" in artifacts  # the per-version table
    assert client.get_model_version("forecaster", "1").tags["realised.degraded"] == "true"


class _Clock:
    def __init__(self):
        self.t = datetime(2026, 1, 1, 2, 59, 30).astimezone()

    def now(self) -> datetime:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += timedelta(seconds=seconds)


def test_schedule_on_degradation_retrains_only_a_degraded_champion(store, tmp_path, data_csv):
    settings = make_settings(store, degradation_min_points=10, forecast_log=str(tmp_path / "log"))
    data = pd.read_csv(data_csv, parse_dates=["ds"])
    _log_champion_forecasts(settings, data_csv, tmp_path / "forecast.csv")
    client = client_for(store)
    healthy_data = tmp_path / "healthy.csv"
    _observed(data, settings.horizon).to_csv(healthy_data, index=False)
    clock = _Clock()
    report = run_schedule(
        settings,
        data=healthy_data,
        max_runs=1,
        on_degradation=True,
        now=clock.now,
        sleep=clock.sleep,
    )
    assert (report.healthy, report.succeeded) == (1, 0)
    assert len(client.search_model_versions("name='forecaster'")) == 1

    degraded_data = tmp_path / "degraded.csv"
    _observed(data, settings.horizon, shift=10 * data["y"].std()).to_csv(degraded_data, index=False)
    report = run_schedule(
        settings,
        data=degraded_data,
        max_runs=1,
        on_degradation=True,
        now=clock.now,
        sleep=clock.sleep,
    )
    assert (report.healthy, report.succeeded) == (0, 1)
    assert report.last_result.monitoring.degraded
    assert len(client.search_model_versions("name='forecaster'")) == 2


def test_on_degradation_never_reads_a_champion_without_evidence_as_healthy(
    store, tmp_path, data_csv
):
    """With logging off nothing is ever scored, and a champion whose artifacts cannot be
    loaded serves (and logs) nothing: both read as healthy at every tick, for good."""
    from forecaster.errors import InvalidConfigError

    clock = _Clock()
    schedule = dict(data=data_csv, max_runs=1, on_degradation=True, now=clock.now)
    with pytest.raises(InvalidConfigError, match="expected a forecast_log directory") as error:
        run_schedule(make_settings(store, forecast_log=""), sleep=clock.sleep, **schedule)
    assert error.value.field == "forecast_log"
    off = check_champion(make_settings(store, forecast_log=""), data_csv)
    assert not off.degraded and "forecast logging is off" in off.reason

    # A champion whose weights are cut (a copy: the store's artifacts are shared).
    client = client_for(store)
    broken = tmp_path / "broken-model"
    source = client.get_model_version_download_uri("forecaster", "1")
    shutil.copytree(source.removeprefix("file://"), broken)
    weights = next(broken.rglob("model.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    version = client.create_model_version("forecaster", str(broken), run_id=None).version
    client.set_registered_model_alias("forecaster", "champion", version)
    settings = make_settings(store, forecast_log=str(tmp_path / "log"))
    report = run_schedule(settings, sleep=clock.sleep, **schedule)
    assert (report.healthy, report.succeeded) == (0, 1)
    assert len(client.search_model_versions("name='forecaster'")) == 3


def test_a_log_that_scores_nothing_says_why_and_predict_prunes_nothing(
    store, tmp_path, data_csv, caplog
):
    """A mistyped log directory, or logged rows that match no actual, read as a healthy
    champion with nothing but an INFO line; `forecaster predict` deleted log files past 90
    days whatever retention the service keeps."""
    import os
    import time

    data = pd.read_csv(data_csv, parse_dates=["ds"])
    caplog.set_level("WARNING", logger="pipelines.monitor")
    typo = make_settings(store, forecast_log=str(tmp_path / "no-such-log"))
    check_champion(typo, data)
    assert "does not exist: nothing scored" in caplog.text

    log_dir = tmp_path / "log"
    log_dir.mkdir()
    old = log_dir / "part-old.parquet"
    _log_rows("1", "elsewhere", 1, [1.0]).to_parquet(old)
    ancient = time.time() - 120 * 86400
    os.utime(old, (ancient, ancient))
    settings = make_settings(store, forecast_log=str(log_dir))
    _log_champion_forecasts(settings, data_csv, tmp_path / "forecast.csv")
    assert old.exists()
    caplog.clear()
    check_champion(settings, data)  # the forecasts lie past the data: nothing to match yet
    assert "matches an observed value" in caplog.text


def test_a_champion_not_scored_this_time_keeps_no_earlier_verdict(store, tmp_path, data_csv):
    """An earlier run's realised.degraded=true stayed on the champion (and in the service's
    gauge) after a run that could not score it said not degraded."""
    client = client_for(store)
    client.set_model_version_tag("forecaster", "1", "realised.degraded", "true")
    client.set_model_version_tag("forecaster", "1", "realised.mase", "9.86")
    (tmp_path / "log").mkdir()
    settings = make_settings(store, forecast_log=str(tmp_path / "log"))
    result = check_champion(settings, pd.read_csv(data_csv, parse_dates=["ds"]))
    assert not result.degraded
    tags = client.get_model_version("forecaster", "1").tags
    assert not [k for k in tags if k.startswith("realised.")]


def test_monitor_exits_6_when_the_champion_is_degraded(store, tmp_path, data_csv, capsys):
    """`forecaster monitor` printed DEGRADED and exited 0: nothing for cron to alert on."""
    from pipelines.cli import main
    from tests.pipelines.pipeline_helpers import config_file

    log = tmp_path / "log"
    settings = make_settings(store, forecast_log=str(log))
    _log_champion_forecasts(settings, data_csv, tmp_path / "forecast.csv")
    data = pd.read_csv(data_csv, parse_dates=["ds"])
    horizon = settings.horizon
    cfg = config_file(store, forecast_log=str(log), degradation_min_points=10)
    for name, shift, code in (("ok", 0.0, 0), ("shifted", 10 * data["y"].std(), 6)):
        path = tmp_path / f"{name}.csv"
        _observed(data, horizon, shift=shift).to_csv(path, index=False)
        assert main(["monitor", "--config", str(cfg), "--data", str(path)]) == code
        assert ("DEGRADED" in capsys.readouterr().out) is (code == 6)


def test_short_horizon_traffic_is_held_to_the_backtest_at_its_steps():
    """Realised MASE of horizon-1 forecasts was compared with the backtest's mean over the
    whole horizon: 0.58 read as healthy beside 0.55, though the first step's backtest MASE
    was 0.25."""
    actuals = pd.DataFrame(
        {
            "unique_id": ["a"] * 7 + ["b"] * 7 + ["c"] * 2,
            "ds": list(T) * 2 + list(T[5:]),
            "y": [0.0, 1, 2, 3, 4, 5, 6] * 2 + [0.0, 0],
        }
    )
    log = pd.concat(
        [
            _log_rows("2", "a", 3, [5]),
            _log_rows("2", "a", 4, [6]),
            _log_rows("2", "a", 5, [7]),
            _log_rows("2", "b", 3, [5, 6, 7]).query("step != 2"),
            # c has no scale yet (too little history), so the realised MASE leaves it out
            _log_rows("2", "c", 5, [1]).assign(step=3),
            _log_rows("1", "a", 3, [5, 6]).query("step == 2"),
        ],
        ignore_index=True,
    )
    by_step = (0.25, 0.5, 0.75)
    # a: 0.25; b: (0.25 + 0.75) / 2 = 0.5; the mean over series 0.375 (with c: 0.5; over
    # the rows, where a's three count thrice, 0.35)
    realised = score(log, actuals, season=1, by_step={"2": by_step, "3": by_step})
    assert realised.at_steps == {"2": pytest.approx(0.375)}
    assert realised.versions["2"].mase == pytest.approx(1.0)
    assert score(log, actuals, season=1).at_steps == {}
    verdict, reason = degradation(
        _accuracy(0.58), 0.25, tolerance=0.3, min_points=50, basis="backtest at the logged steps"
    )
    assert verdict and "backtest at the logged steps 0.2500" in reason


@pytest.mark.parametrize("backtest", [None, math.nan])
def test_a_champion_without_a_backtest_mase_is_not_judged(backtest):
    """A version registered without a usable backtest.mase tag has no limit to exceed."""
    verdict, reason = degradation(_accuracy(9.9), backtest, tolerance=0.3, min_points=50)
    assert verdict is False
    assert "version 3 has no backtest MASE to compare with" in reason


@pytest.mark.parametrize(
    ("mase", "points", "degraded"),
    [
        (2.5, 50, False),  # exactly at the limit 2.0 x 1.25: not *more* than the tolerance
        (2.4, 50, False),  # 20 % worse: within a relative tolerance of 25 %
        (2.6, 50, True),  # judged from exactly min_points points
    ],
)
def test_tolerance_is_relative_and_bounds_are_inclusive(mase, points, degraded):
    verdict, reason = degradation(_accuracy(mase, points), 2.0, tolerance=0.25, min_points=50)
    assert verdict is degraded
    assert "limit 2.5000" in reason


def test_a_series_without_a_scale_does_not_void_the_versions_mase():
    """A new series with no season of history yet has no MASE; the version's MASE is that of
    the series that have one, not undefined (which reads as "not degraded")."""
    actuals = pd.DataFrame(
        {
            "unique_id": ["a"] * 7 + ["b"] * 2,
            "ds": list(T) + list(T[5:]),
            "y": [0.0, 1, 2, 3, 4, 5, 6, 10, 10],
        }
    )
    log = pd.concat(
        [_log_rows("1", "a", 4, [7, 8]), _log_rows("1", "b", 4, [12, 12])], ignore_index=True
    )
    accuracy = score(log, actuals, season=1).versions["1"]
    assert accuracy.mase == pytest.approx(2.0)  # a: errors 2, 2 over its lag-1 scale 1
    assert (accuracy.points, accuracy.series) == (4, 2)


def test_each_version_is_reported_under_its_own_name(store, tmp_path, data_csv, monkeypatch):
    """The run's realised/champion/* are the champion's figures, the verdict tag is the
    champion's alone, and versions are listed in numeric order (10 after 2); a version
    deleted from the registry is still scored."""
    from pipelines.forecast_log import ForecastLog

    client = client_for(store)
    source = client.get_model_version_download_uri("forecaster", "1")
    assert str(client.create_model_version("forecaster", source, run_id=None).version) == "2"
    data = pd.read_csv(data_csv, parse_dates=["ds"])
    # Every series forecast 12 steps from its 200th hour, off by 1 (v1), 2 (v2) and 3 (v10).
    ahead = data.groupby("unique_id").nth(list(range(200, 212)))
    ids = np.array(sorted(data["unique_id"].unique()), dtype=object)
    actual = ahead.pivot(index="unique_id", columns="ds", values="y").loc[ids]
    timestamps = np.tile(actual.columns.to_numpy(dtype="datetime64[ns]"), (len(ids), 1))
    log = ForecastLog(tmp_path / "log")
    for version, error in (("1", 1.0), ("2", 2.0), ("10", 3.0)):
        arrays = ForecastArrays(
            series_ids=ids,
            origins=timestamps[:, 0] - np.timedelta64(1, "h"),
            timestamps=timestamps,
            mean=actual.to_numpy() + error,
            quantiles=np.zeros((len(ids), 12, 0)),
            levels=(),
            glitches=no_glitches(len(ids)),
        )
        log.append(records(arrays, model_name="forecaster", model_version=version))
    log.flush()
    settings = make_settings(store, forecast_log=str(tmp_path / "log"))
    result = check_champion(settings, data)
    assert result.champion_version == "1"
    assert result.versions == ["1", "2", "10"]
    assert [result.realised.versions[v].mae for v in result.versions] == pytest.approx([1, 2, 3])

    experiment = client.get_experiment_by_name("forecaster")
    (run,) = client.search_runs(
        [experiment.experiment_id], order_by=["attributes.start_time DESC"], max_results=1
    )
    assert run.data.tags["monitoring.champion_version"] == "1"
    metrics = run.data.metrics
    assert metrics["realised/champion/mae"] == pytest.approx(1.0)
    assert metrics["realised/v2/mae"] == pytest.approx(2.0)
    champion = client.get_model_version("forecaster", "1").tags
    assert champion["realised.degraded"] == "false"
    assert pd.Timestamp(champion["realised.until"]) == timestamps[0, -1]
    other = client.get_model_version("forecaster", "2").tags
    assert float(other["realised.mae"]) == pytest.approx(2.0)
    assert "realised.degraded" not in other

    # A log over PART_ROWS rows is sorted into files under forecast_log_spill_dir, created
    # where it is missing and left empty: the same figures.
    monkeypatch.setattr("pipelines.monitor.PART_ROWS", 50)
    spill = tmp_path / "spill" / "monitor"
    spilled = check_champion(
        make_settings(store, forecast_log=str(tmp_path / "log"), forecast_log_spill_dir=spill),
        data,
    )
    assert [spilled.realised.versions[v].mae for v in spilled.versions] == pytest.approx([1, 2, 3])
    assert spill.is_dir() and not any(spill.iterdir())


@pytest.mark.parametrize("max_rows", [1, 40])
def test_the_log_scored_in_parts_scores_as_the_log_scored_whole(tmp_path, max_rows):
    """A retrain scores the log part by part (a few series at a time) to keep its memory
    flat: every figure must be the one scoring the whole log gives. The log has repeats,
    two interval levels, series the data lacks, gaps and series too short for a scale."""
    from pipelines.forecast_log import ForecastLog, read_log_parts
    from pipelines.monitor import score_parts

    rng = np.random.default_rng(0)
    hours = pd.date_range("2024-01-01", periods=60, freq="h")
    ids = [f"s{i}" for i in range(9)]
    actuals = pd.DataFrame(
        {"unique_id": np.repeat(ids[:8], 60), "ds": np.tile(hours, 8), "y": rng.random(480)}
    )
    actuals.loc[rng.random(480) < 0.1, "y"] = np.nan
    actuals = actuals[~((actuals["unique_id"] == "s7") & (actuals["ds"] < hours[50]))]
    log = ForecastLog(tmp_path / "log", retention_days=None)
    for origin in range(20, 56, 3):
        for version in ("1", "2", "10"):
            chosen = rng.choice(ids, 5, replace=False)
            arrays = ForecastArrays(
                series_ids=chosen.astype(object),
                origins=np.full(5, hours[origin]),
                timestamps=np.tile(hours[origin + 1 : origin + 5].to_numpy(), (5, 1))[:, :4],
                mean=rng.random((5, 4)),
                quantiles=np.sort(rng.random((5, 4, 2)) * 2 - 0.5, axis=-1),
                levels=(0.1, 0.9) if origin % 2 else (0.25, 0.75),
                glitches=no_glitches(5),
            )
            log.append(records(arrays, model_name="forecaster", model_version=version))
            if version == "1":  # asked again: the later forecast counts
                again = dataclasses.replace(arrays, mean=arrays.mean + 0.5)
                log.append(records(again, model_name="forecaster", model_version=version))
        log.flush()
    by_step = {"2": (0.5, 0.6, 0.7, 0.8)}
    whole = score(read_log(tmp_path / "log"), actuals, season=2, by_step=by_step)
    parts = read_log_parts(tmp_path / "log", max_rows=max_rows)
    in_parts = score_parts(parts, actuals, season=2, by_step=by_step)
    assert set(whole.versions) == {"1", "2", "10"}
    for version, accuracy in whole.versions.items():
        assert math.isfinite(accuracy.mase) and math.isfinite(accuracy.coverage)
        assert in_parts.versions[version] == dataclasses.replace(
            accuracy,
            mae=pytest.approx(accuracy.mae),
            mase=pytest.approx(accuracy.mase),
            coverage=pytest.approx(accuracy.coverage),
        )
    assert in_parts.at_steps == pytest.approx(whole.at_steps)
    assert (in_parts.log_rows, in_parts.scored_rows) == (whole.log_rows, whole.scored_rows)
    pd.testing.assert_frame_equal(in_parts.by_origin, whole.by_origin)


def test_the_plot_bins_origins_by_day_only_when_there_are_many():
    """Realised MASE by origin: each origin its own point, averaged over the rows scored; past
    60 origins, a day's origins one point."""
    from pipelines.monitor import _by_origin

    hours = pd.date_range("2024-01-01", periods=72, freq="h")
    sums = pd.DataFrame({"model_version": "1", "origin": hours, "scaled": 2.0, "n": 1})
    sums.loc[0, ["scaled", "n"]] = [9.0, 3]
    hourly = _by_origin(sums.iloc[:60])
    assert len(hourly) == 60 and hourly["value"].iloc[0] == 3.0
    daily = _by_origin(sums)
    assert daily["time"].tolist() == list(pd.date_range("2024-01-01", periods=3, freq="D"))
    assert daily["value"].tolist() == pytest.approx([(9 + 2 * 23) / 26, 2.0, 2.0])
    assert (daily["group"] == "v1").all()
