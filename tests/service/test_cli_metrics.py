"""The `forecaster` CLI's serve command, and what /metrics exports."""

from __future__ import annotations

import subprocess
import sys

import pytest

from service.cli import build_parser, main


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
