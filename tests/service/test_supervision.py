"""Background loops are supervised: a crashed one is restarted, and /readyz says so meanwhile."""

from __future__ import annotations

import time


def _wait(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


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
    assert _wait(lambda: client.get("/readyz").status_code == 200)
    assert client.post("/v1/forecast", json=body).status_code == 200
