"""The `forecaster` CLI's serve command, and what /metrics exports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def test_serve_rejects_bad_settings_with_a_message(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--port", "99999", "--data-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "port" in capsys.readouterr().err


def test_serve_options():
    args = build_parser().parse_args(
        ["serve", "--host", "0.0.0.0", "--port", "9000", "--model-uri", "models:/m@prod"]
    )
    assert (args.host, args.port, args.model_uri) == ("0.0.0.0", 9000, "models:/m@prod")
    assert args.workers is None and args.device is None  # settings decide unless given


def test_pipeline_commands_are_registered():
    sub = build_parser()._subparsers._group_actions[0]
    assert {"serve", "retrain", "predict"} <= set(sub.choices)


def test_module_entry_point_help():
    out = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "--model-uri" in out.stdout


def test_metrics_by_route_and_status(client, payload):
    client.post("/v1/forecast", json={"series": [payload("series_000")]})
    client.post("/v1/forecast", json={"series": []})
    client.get("/v1/batch-jobs/abc")
    text = client.get("/metrics").text
    assert (
        'forecaster_http_requests_total{method="POST",route="/v1/forecast",status="200"} 1.0'
        in text
    )
    assert 'route="/v1/forecast",status="422"' in text
    assert 'route="/v1/batch-jobs/{job_id}",status="404"' in text  # templates, not raw paths
    assert "forecaster_http_request_duration_seconds_bucket" in text
    assert "forecaster_batch_series_count 1.0" in text
    assert "forecaster_queue_depth 0.0" in text
    assert (
        'forecaster_model_info{alias="champion",name="forecaster",run_id="run-abc",version="3"} 1.0'
        in text
    )
    assert "forecaster_model_version 3.0" in text


def test_requests_a_middleware_refuses_are_counted_by_their_route(make_client, payload):
    """401 without a key and 413 for a body too large were counted as route="unmatched",
    like scans of paths that do not exist."""
    key = "k" * 20
    client = make_client(api_keys=key, max_body_bytes=4096)
    client.post("/v1/forecast", json={"series": [payload("series_000")]})  # no key
    big = {"series": [payload("series_000")] * 40}
    client.post("/v1/forecast", json=big, headers={"X-API-Key": key})
    client.get("/no/such/path", headers={"X-API-Key": key})
    text = client.get("/metrics", headers={"X-API-Key": key}).text
    assert 'method="POST",route="/v1/forecast",status="401"' in text
    assert 'method="POST",route="/v1/forecast",status="413"' in text
    assert 'method="GET",route="unmatched",status="404"' in text


def test_a_worker_killed_outright_leaves_no_live_gauges_behind(tmp_path, monkeypatch):
    """--workers N: a worker that dies without its shutdown (OOM, SIGKILL) once kept
    reporting its model beside its replacement's in every scrape."""
    from service.metrics import MULTIPROC_ENV, ServiceMetrics

    worker = (
        "import os; from service.metrics import ServiceMetrics; m = ServiceMetrics(); "
        "m.set_model('forecaster', '1', 'champion', 'run-1'); m.queue_depth.set(3); os._exit(0)"
    )
    env = {**os.environ, MULTIPROC_ENV: str(tmp_path), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", worker], env=env, check=True, timeout=120)
    assert list(tmp_path.glob("gauge_livemax_*.db"))  # what the dead worker left
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    text = ServiceMetrics().render()[0].decode()
    assert 'version="1"' not in text
    assert "forecaster_queue_depth 3.0" not in text
    assert not list(tmp_path.glob("gauge_live*_*.db"))


def test_servers_sharing_a_data_directory_keep_their_metrics_apart(tmp_path, monkeypatch):
    """Replicas share a data directory: a starting server deleted every value file of the
    shared metrics directory (the running one's counts dropped to 0), and both then summed
    each other's. Each server has a directory of its own; a gone server's is removed."""
    import socket

    from service import cli
    from service.metrics import MULTIPROC_ENV

    root = tmp_path / "prometheus"
    host = socket.gethostname()
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        other = root / f"{host}-{running.pid}"  # a running server's values
        other.mkdir(parents=True)
        (other / "counter_1.db").write_bytes(b"values")
        gone = root / f"{host}-999999999"  # a server that is no more
        gone.mkdir()
        monkeypatch.setenv(MULTIPROC_ENV, "")  # so that the test ends with it as it found it
        monkeypatch.delenv(MULTIPROC_ENV)
        cli._prepare_multiprocess_metrics(root)
        mine = root / f"{host}-{os.getpid()}"
        assert os.environ[MULTIPROC_ENV] == str(mine) and mine.is_dir()
        assert (other / "counter_1.db").read_bytes() == b"values"
        assert not gone.exists()
    finally:
        running.kill()
        running.wait()
