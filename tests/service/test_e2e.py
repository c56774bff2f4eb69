"""End to end over real HTTP: an MLflow tracking server backed by SQLite, `forecaster serve` as
a subprocess, httpx as the client. Online forecast, a batch job to its result, a crash with an
unfinished job that completes after the restart, an alias move picked up while serving, and the
tracking server going away without the service noticing more than a logged error."""

from __future__ import annotations

import io
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pandas as pd
import pytest

from tests.servers import API_KEY, free_port, mlflow_server, start_service, wait_until

HEADERS = {"X-API-Key": API_KEY}

pytestmark = pytest.mark.slow


@pytest.fixture()
def tracking_server(tmp_path):
    store = tmp_path / "mlflow-server"
    with mlflow_server(store, f"sqlite:///{store / 'mlflow.db'}") as (uri, server):
        yield uri, server


def job_status(http: httpx.Client, job_id: str) -> dict:
    return http.get(f"/v1/batch-jobs/{job_id}").json()


def test_end_to_end(tmp_path, tracking_server, registry_at, fitted, training_frame, payload):
    tracking_uri, server = tracking_server
    registry = registry_at(tracking_uri)
    v1 = registry.register(fitted, training_frame)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    service = start_service(tmp_path, port, tracking_uri, run=1)
    http = httpx.Client(base_url=base, headers=HEADERS, timeout=30)
    try:
        wait_until(lambda: http.get("/readyz").status_code == 200, 120, "the service", service.proc)

        # -- online forecast --------------------------------------------------------------
        body = {"horizon": 6, "series": [payload("series_000"), payload("series_001")]}
        response = http.post("/v1/forecast", json=body)
        assert response.status_code == 200, response.text
        out = response.json()
        assert out["model"]["version"] == v1 and out["model"]["alias"] == "champion"
        assert [len(f["mean"]) for f in out["forecasts"]] == [6, 6]
        assert (
            http.post(
                "/v1/forecast", json=body, headers={"X-API-Key": "wrong-key-xxxxxxxxxx"}
            ).status_code
            == 401
        )

        # -- a batch job through to its result ----------------------------------------------
        history = training_frame.groupby("unique_id").tail(60)
        files = {"file": ("history.csv", history.to_csv(index=False).encode(), "text/csv")}
        accepted = http.post("/v1/batch-jobs", files=files, data={"output_format": "parquet"})
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["id"]
        done = wait_until(
            lambda: (j := job_status(http, job_id))["status"] in ("succeeded", "failed") and j,
            60,
            "the batch job",
        )
        assert done["status"] == "succeeded", done
        result = pd.read_parquet(io.BytesIO(http.get(f"/v1/batch-jobs/{job_id}/result").content))
        assert len(result) == history["unique_id"].nunique() * fitted.max_horizon

        # -- a crash with an unfinished job; the restart finishes it --------------------------
        many = []
        for k in range(150):  # 600 series, a few seconds of work in chunks of 4
            part = history.copy()
            part["unique_id"] = part["unique_id"] + f"-{k}"
            many.append(part)
        big = pd.concat(many, ignore_index=True)
        accepted = http.post(
            "/v1/batch-jobs",
            content=big.to_csv(index=False).encode(),
            headers={"content-type": "text/csv"},
        )
        assert accepted.status_code == 202, accepted.text
        big_id = accepted.json()["id"]
        wait_until(
            lambda: (j := job_status(http, big_id))["status"] == "running" and j["rows_done"] > 0,
            60,
            "the big job to start",
        )
        service.stop(signal.SIGKILL)  # no chance to hand the job back: a crash
        assert job_status_offline(tmp_path, big_id) == "running"

        service = start_service(tmp_path, port, tracking_uri, run=2)
        wait_until(lambda: http.get("/readyz").status_code == 200, 120, "the restart", service.proc)
        resumed = wait_until(
            lambda: (j := job_status(http, big_id))["status"] in ("succeeded", "failed") and j,
            120,
            "the resumed job",
            service.proc,
        )
        assert resumed["status"] == "succeeded", resumed
        assert resumed["attempts"] == 2
        csv = http.get(f"/v1/batch-jobs/{big_id}/result?format=csv")
        assert csv.headers["content-type"].startswith("text/csv")
        assert len(pd.read_csv(io.BytesIO(csv.content))) == 600 * fitted.max_horizon

        # -- an alias move the running service picks up ---------------------------------------
        v2 = registry.register(fitted, training_frame, alias=None)
        registry.move_alias(v2)
        wait_until(
            lambda: (http.get("/v1/models").json()["loaded"] or {}).get("version") == v2,
            60,
            "the new champion",
            service.proc,
        )
        out = http.post("/v1/forecast", json=body).json()
        assert out["model"]["version"] == v2

        # -- the tracking server goes away: the loaded model keeps serving -------------------
        server.stop()
        wait_until(
            lambda: "unreachable" in (http.get("/v1/models").json()["last_check_error"] or ""),
            90,
            "the registry error to show",
            service.proc,
        )
        response = http.post("/v1/forecast", json=body)
        assert response.status_code == 200 and response.json()["model"]["version"] == v2
        assert http.get("/readyz").status_code == 200
    except BaseException:
        print(service.tail())
        raise
    finally:
        http.close()
        service.stop()


def job_status_offline(tmp_path: Path, job_id: str) -> str:
    """The job's row as the dead service left it."""
    from service.job_store import JobStore

    job = JobStore(tmp_path / "service-data" / "jobs.db").get(job_id)
    assert job is not None
    return job.status


@pytest.mark.slow
def test_metrics_are_summed_across_workers(tmp_path, registry, fitted, training_frame, payload):
    """`forecaster serve --workers 2`: one scrape counts the requests every worker answered."""
    registry.register(fitted, training_frame)
    port = free_port()
    service = start_service(tmp_path, port, registry.tracking_uri, run=1, workers=2)
    # One directory of this server's own (<host>-<pid>): replicas share the data directory.
    servers = tmp_path / "service-data" / "prometheus"

    def workers_with(kind: str) -> int:
        return len({f.stem.rsplit("_", 1)[-1] for f in servers.glob(f"*/{kind}_*.db")})

    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=HEADERS, timeout=30) as http:
            wait_until(
                lambda: http.get("/readyz").status_code == 200, 180, "the service", service.proc
            )
            # both workers have loaded the model (each sets its model gauge)
            wait_until(lambda: workers_with("gauge_livemax") == 2, 180, "two workers", service.proc)
            body = {"series": [payload("series_000")]}

            def forecast(_) -> int:
                with httpx.Client(
                    base_url=f"http://127.0.0.1:{port}", headers=HEADERS, timeout=30
                ) as one:
                    return one.post("/v1/forecast", json=body).status_code

            sent = 0
            with ThreadPoolExecutor(8) as pool:
                # concurrent fresh connections until both workers have answered some
                while sent < 800 and (sent == 0 or workers_with("counter") < 2):
                    assert set(pool.map(forecast, range(40))) == {200}
                    sent += 40
            assert workers_with("counter") == 2, "both workers answered requests"
            assert len(list(servers.iterdir())) == 1
            line = 'forecaster_http_requests_total{method="POST",route="/v1/forecast",status="200"}'
            for _ in range(4):  # whichever worker answers the scrape reports the same sum
                text = http.get("/metrics").text
                counted = [x for x in text.splitlines() if x.startswith(line)]
                assert counted and float(counted[0].split()[-1]) == sent, counted
    finally:
        service.stop()
