"""Background loops are supervised: a crashed one is restarted, and /readyz says so meanwhile."""

from __future__ import annotations

from tests.servers import wait_until


def test_a_crashed_batcher_is_restarted_and_readyz_reports_it(make_client, payload, caplog):
    client = make_client(request_timeout_s=1.0)
    batcher = client.app.state.batcher
    take = batcher._take
    broken = {"on": True}

    def crashing_take():
        if broken["on"]:
            raise RuntimeError("collector bug")
        return take()

    batcher._take = crashing_take
    body = {"series": [payload("series_000")]}
    assert client.post("/v1/forecast", json=body).status_code == 504  # nobody took it
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert "micro-batcher is restarting after RuntimeError: collector bug" in ready.json()["detail"]
    assert sum("background task micro-batcher died" in r.getMessage() for r in caplog.records) >= 1

    broken["on"] = False  # the next restart succeeds
    wait_until(lambda: client.get("/readyz").status_code == 200, 10, "ready again")
    assert client.post("/v1/forecast", json=body).status_code == 200


def test_a_crashed_batch_worker_is_restarted_and_the_job_finishes(make_client, history, caplog):
    from tests.service.test_batch_jobs import wait_for_job

    client = make_client(job_lease_s=1.0)
    runner = client.app.state.job_runner
    run = runner._run
    calls = {"n": 0}

    async def crashing_once(job):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("worker bug")
        await run(job)

    runner._run = crashing_once
    files = {"file": ("h.csv", history.to_csv(index=False).encode(), "text/csv")}
    job = client.post("/v1/batch-jobs", files=files).json()
    # The job the dead worker held is taken again once its lease has expired.
    assert wait_for_job(client, job["id"], timeout=30)["status"] == "succeeded"
    assert calls["n"] >= 2
    assert any("background task batch-worker-0 died" in r.getMessage() for r in caplog.records)
    assert client.app.state.supervisor.restarts >= 1
