"""The service records what it forecasts (online and batch) in the forecast log, and exports
the served version's realised accuracy as a Prometheus gauge."""

from __future__ import annotations

import time

import numpy as np

from pipelines.forecast_log import read_log
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
