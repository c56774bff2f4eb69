"""The service records what it forecasts (online and batch) in the forecast log, and exports
the served version's realised accuracy as a Prometheus gauge."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from forecaster import Forecaster
from forecaster.outputs import ForecastArrays
from pipelines.forecast_log import read_log, records
from service.forecast_logging import ServiceForecastLog
from service.metrics import ServiceMetrics
from service.model_manager import ModelIdentity, StaticSource
from tests.service.test_batch_jobs import wait_for_job

HORIZON = 12


def test_online_and_batch_forecasts_are_logged(make_client, tmp_path, history, payload):
    client = make_client(forecast_log_flush_s=3600)  # flushed at shutdown
    ids = ["series_000", "series_001"]
    online = client.post("/v1/forecast", json={"series": [payload(sid) for sid in ids]})
    assert online.status_code == 200, online.text
    batch_history = history[history["unique_id"] == "series_002"]
    files = {"file": ("h.csv", batch_history.to_csv(index=False).encode(), "text/csv")}
    job = client.post("/v1/batch-jobs", files=files).json()
    assert wait_for_job(client, job["id"])["status"] == "succeeded"
    client.__exit__(None, None, None)  # shutdown flushes the buffer

    log = read_log(tmp_path / "data" / "forecast_log")
    assert sorted(log["unique_id"].unique()) == ["series_000", "series_001", "series_002"]
    assert set(log["model_version"]) == {"3"}
    assert len(log) == 3 * HORIZON
    rows = client.app.state.metrics.forecast_log_rows
    assert (rows.labels("logged")._value.get(), rows.labels("dropped")._value.get()) == (
        3 * HORIZON,
        0,
    )
    assert log.groupby("unique_id")["step"].apply(list).map(lambda s: s == list(range(1, 13))).all()
    last = history.groupby("unique_id")["ds"].max()
    np.testing.assert_array_equal(
        log["origin"].to_numpy(), last.reindex(log["unique_id"]).to_numpy()
    )
    first = online.json()["forecasts"][0]
    mine = log[log["unique_id"] == first["id"]]
    np.testing.assert_allclose(mine["mean"], first["mean"])
    np.testing.assert_allclose(mine["upper"], first["quantiles"]["0.9"])
    assert [t.isoformat() for t in mine["ds"]] == first["timestamps"]


def test_rows_count_as_logged_once_written_and_as_dropped_when_they_cannot_be(
    make_client, tmp_path, payload, caplog
):
    """The log's directory turned into a file under the running service: nothing is written,
    so nothing counts as logged, and the rows still unwritten at shutdown count as dropped."""
    client = make_client(forecast_log_flush_s=0.1)
    log_dir = tmp_path / "data" / "forecast_log"
    if log_dir.exists():
        log_dir.rmdir()
    log_dir.write_text("not a directory")
    assert client.post("/v1/forecast", json={"series": [payload("series_000")]}).is_success
    rows = client.app.state.metrics.forecast_log_rows
    time.sleep(0.5)  # a few flushes fail
    assert rows.labels("logged")._value.get() == 0
    assert any("could not write" in r.getMessage() for r in caplog.records)
    client.__exit__(None, None, None)
    assert rows.labels("dropped")._value.get() == HORIZON
    assert any("are lost" in r.getMessage() for r in caplog.records)


def test_logging_can_be_switched_off(make_client, tmp_path, payload):
    client = make_client(forecast_log=False)
    assert client.post("/v1/forecast", json={"series": [payload("series_000")]}).is_success
    client.__exit__(None, None, None)
    assert not (tmp_path / "data" / "forecast_log").exists()


def test_forecasts_of_other_horizons_and_quantiles_are_logged_too(make_client, tmp_path, payload):
    """Forecasts are written in groups of one shape; requests that asked for another horizon or
    other quantiles, flushed together, each keep their own rows."""
    client = make_client(forecast_log_flush_s=3600)  # one flush, at shutdown
    bodies = [
        {"series": [payload("series_000")]},
        {"horizon": 5, "series": [payload("series_001")]},
        {"quantiles": [0.5], "series": [payload("series_002")]},
    ]
    for body in bodies:
        assert client.post("/v1/forecast", json=body).is_success
    client.__exit__(None, None, None)
    log = read_log(tmp_path / "data" / "forecast_log")
    steps = log.groupby("unique_id")["step"].max().to_dict()
    assert steps == {"series_000": HORIZON, "series_001": 5, "series_002": HORIZON}
    # One quantile asked for: no interval to log.
    has_interval = log.groupby("unique_id")["upper"].apply(lambda u: bool(u.notna().all()))
    assert has_interval.to_dict() == {"series_000": True, "series_001": True, "series_002": False}
    rows = client.app.state.metrics.forecast_log_rows
    assert rows.labels("logged")._value.get() == 2 * HORIZON + 5


def _one_forecast(fitted: Forecaster, history: pd.DataFrame) -> ForecastArrays:
    """The forecast of one series: HORIZON log rows."""
    one = history[history["unique_id"] == "series_000"]
    return fitted.forecast(fitted.prepare(one, None, HORIZON))


def test_forecasts_past_the_buffer_bound_are_dropped_and_counted_until_a_flush(
    tmp_path, fitted, history, identity
):
    """At most max_pending_rows wait for the next flush (a log that cannot keep up must not
    take the service's memory): a forecast past it is dropped whole with its rows counted, a
    flush makes room again."""
    metrics = ServiceMetrics()
    log = ServiceForecastLog(
        tmp_path / "log", metrics, flush_s=3600, retention_days=1, max_pending_rows=2 * HORIZON
    )
    forecast = _one_forecast(fitted, history)
    rows = metrics.forecast_log_rows
    for _ in range(3):
        log.record(forecast, identity)
    assert rows.labels("dropped")._value.get() == HORIZON  # the third: two fill the buffer
    log.flush()
    log.record(forecast, identity)
    log.flush()
    assert (rows.labels("logged")._value.get(), rows.labels("dropped")._value.get()) == (
        3 * HORIZON,
        HORIZON,
    )
    # read_log keeps one row per series and step of an origin: the files hold every row
    files = (tmp_path / "log").glob("part-*.parquet")
    assert sum(pq.ParquetFile(f).metadata.num_rows for f in files) == 3 * HORIZON


def test_a_batch_job_s_rows_the_log_cannot_take_count_as_dropped(
    tmp_path, fitted, history, identity, caplog
):
    """The log's directory is a file: the job's staged rows stay where they are, reported and
    counted as dropped, not as logged."""
    staged = tmp_path / "staged.parquet"
    table = records(
        _one_forecast(fitted, history), model_name=identity.name, model_version=identity.version
    )
    pq.write_table(table, staged)
    directory = tmp_path / "log"
    directory.write_text("not a directory")
    metrics = ServiceMetrics()
    log = ServiceForecastLog(directory, metrics, flush_s=3600, retention_days=1)
    log.adopt([staged])
    rows = metrics.forecast_log_rows
    assert (rows.labels("logged")._value.get(), rows.labels("dropped")._value.get()) == (
        0,
        HORIZON,
    )
    assert staged.exists()
    assert any("could not add" in r.getMessage() for r in caplog.records)


def _gauge(text: str, metric: str) -> float:
    prefix = f'forecaster_model_realised_accuracy{{metric="{metric}"}}'
    line = next(row for row in text.splitlines() if row.startswith(prefix))
    return float(line.rsplit(" ", 1)[1])


def test_realised_accuracy_of_the_served_version_is_a_gauge(make_client, fitted):
    identity = ModelIdentity(
        name="forecaster", version="4", realised={"mase": 0.91, "mae": 2.5, "points": 480.0}
    )
    client = make_client(source=StaticSource(fitted, identity))
    text = client.get("/metrics").text
    assert _gauge(text, "mase") == 0.91
    assert _gauge(text, "points") == 480
    assert np.isnan(_gauge(text, "coverage"))


def test_identity_reads_realised_tags():
    class Ref:
        name, version, alias, run_id, source_uri = "m", "2", "champion", "r", ""
        metrics: dict = {}
        tags = {"realised.mase": "1.2", "realised.until": "2024-01-01T00:00:00", "x": "1"}

    assert ModelIdentity.from_ref(Ref()).realised == {"mase": 1.2}
