"""End to end over HTTP: a real `mlflow server`, two retrains, the champion loaded with
mlflow.pyfunc and served by `mlflow models serve`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx
import mlflow
import numpy as np
import pandas as pd
import pytest

from pipelines import tracking
from pipelines.registry import load_forecaster
from tests.pipelines.pipeline_helpers import (
    PROMOTABLE_TRAIN,
    TINY_MODEL,
    noisy_history,
    run_cli,
    synthetic,
)
from tests.servers import MLFLOW, Process, clean_env, free_port, mlflow_server, wait_until

pytestmark = pytest.mark.slow


def test_retrain_twice_over_http_then_pyfunc_and_mlflow_serve(tmp_path):
    server_root = tmp_path / "server"
    with mlflow_server(server_root, f"sqlite:///{server_root / 'server.db'}") as (uri, _):
        work = tmp_path / "work"
        work.mkdir()
        (work / "settings.yaml").write_text(
            json.dumps(
                {"model": TINY_MODEL, "train": PROMOTABLE_TRAIN, "lock_file": str(work / "lock")}
            )
        )
        clean = synthetic()
        clean.to_csv(work / "clean.csv", index=False)
        keep = TINY_MODEL["context_length"] + 3 * TINY_MODEL["prediction_length"]
        noisy_history(clean, keep).to_parquet(work / "noisy.parquet")
        cli_env = {"MLFLOW_TRACKING_URI": uri}

        first = run_cli(
            "retrain", "--config", "settings.yaml", "--data", "clean.csv", cwd=work, env=cli_env
        )
        assert first.returncode == 0, first.stderr
        assert "decision  promoted" in first.stdout
        # the promoted configuration is refit on all the data: version 2, champion
        assert "champion  forecaster v2" in first.stdout
        assert first.stdout.startswith("run ") and "View run" not in first.stdout  # MLflow's
        second = run_cli(
            "retrain", "--config", "settings.yaml", "--data", "noisy.parquet", cwd=work, env=cli_env
        )
        assert second.returncode == 0, second.stderr
        assert "decision  not promoted" in second.stdout
        # Nothing was written locally: the server holds runs, registry and artifacts.
        assert not (work / "mlflow.db").exists() and not (work / "mlartifacts").exists()

        client = tracking.client(uri)
        model = client.get_registered_model("forecaster")
        assert {k: str(v) for k, v in model.aliases.items()} == {
            "champion": "2",
            "challenger": "3",
        }
        refit_tags = client.get_model_version("forecaster", "2").tags
        assert refit_tags["refit.of_version"] == "1"
        assert refit_tags["train.window_end"] == pd.Timestamp(clean["ds"].max()).isoformat()
        tags = client.get_model_version("forecaster", "3").tags
        assert tags["promotion.decision"] == "rejected"
        assert tags["promotion.compared_with"] == "2"
        assert float(tags["promotion.challenger_score"]) > float(tags["promotion.champion_score"])

        # The champion through MLflow's own loader, beside the Forecaster it wraps.
        history = clean.groupby("unique_id").tail(100).reset_index(drop=True)
        mlflow.set_tracking_uri(uri)
        try:
            pyfunc = mlflow.pyfunc.load_model("models:/forecaster@champion")
            forecast = pyfunc.predict(history, params={"horizon": 6, "quantiles": [0.1, 0.9]})
        finally:
            mlflow.set_tracking_uri(None)
        direct = load_forecaster("models:/forecaster@champion", tracking_uri=uri, device="cpu")
        assert direct.ref.version == "2"
        expected = direct.forecaster.predict(history, horizon=6, quantiles=[0.1, 0.9])
        assert list(forecast.columns) == ["unique_id", "ds", "mean", "q0.1", "q0.9"]
        np.testing.assert_allclose(forecast["mean"], expected["mean"], rtol=1e-6)
        last = history.groupby("unique_id")["ds"].max()
        first_step = forecast.groupby("unique_id")["ds"].min()
        assert (first_step - last.reindex(first_step.index) == pd.Timedelta(hours=1)).all()

        # And served unchanged by `mlflow models serve`.
        serve_port = free_port()
        serve_args = [
            MLFLOW,
            "models",
            "serve",
            "-m",
            "models:/forecaster@champion",
            "--env-manager",
            "local",
            "--host",
            "127.0.0.1",
            "-p",
            str(serve_port),
        ]
        # `mlflow models serve --env-manager local` execs `uvicorn` from PATH.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        serve = Process(
            serve_args,
            tmp_path / "serve.log",
            env={**clean_env(), "PATH": path, "MLFLOW_TRACKING_URI": uri},
            cwd=work,
        )
        try:
            wait_until(
                lambda: httpx.get(f"http://127.0.0.1:{serve_port}/ping", timeout=2).is_success,
                180,
                "mlflow models serve",
                serve.proc,
            )
            payload = history.assign(ds=history["ds"].dt.strftime("%Y-%m-%d %H:%M:%S"))
            body = {
                "dataframe_split": json.loads(payload.to_json(orient="split", index=False)),
                "params": {"horizon": 6, "quantiles": [0.1, 0.9]},
            }
            request = urllib.request.Request(
                f"http://127.0.0.1:{serve_port}/invocations",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                served = pd.DataFrame(json.loads(response.read())["predictions"])
        finally:
            serve.stop()
        assert len(served) == len(expected)
        assert served["unique_id"].tolist() == expected["unique_id"].astype(str).tolist()
        np.testing.assert_allclose(served["mean"], expected["mean"], rtol=1e-5)
        np.testing.assert_allclose(served["q0.9"], expected["q0.9"], rtol=1e-5)
        assert pd.to_datetime(served["ds"]).tolist() == expected["ds"].tolist()


def test_tracking_server_lost_mid_training(tmp_path):
    """The server dies while a retrain is training: the CLI exits with a clear error within
    a bounded time, and once the server is back nothing was registered and no alias moved."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server_root = tmp_path / "server"
    store = f"sqlite:///{server_root / 'server.db'}"
    work = tmp_path / "work"
    work.mkdir()
    synthetic().to_csv(work / "data.csv", index=False)
    quick = {**PROMOTABLE_TRAIN, "max_epochs": 1}
    slow = {
        **PROMOTABLE_TRAIN,
        "max_epochs": 500,
        "patience": 500,
        "batch_size": 8,
        "max_windows_per_epoch": 64,
    }
    (work / "quick.yaml").write_text(json.dumps({"model": TINY_MODEL, "train": quick}))
    (work / "slow.yaml").write_text(json.dumps({"model": TINY_MODEL, "train": slow}))
    cli_env = {
        "MLFLOW_TRACKING_URI": uri,
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "3",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    }
    with mlflow_server(server_root, store, port=port):
        first = run_cli(
            "retrain", "--config", "quick.yaml", "--data", "data.csv", cwd=work, env=cli_env
        )
        assert first.returncode == 0, first.stderr
        client = tracking.client(uri)
        experiment = client.get_experiment_by_name("forecaster")
        retrain = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipelines.cli",
                "retrain",
                "--config",
                "slow.yaml",
                "--data",
                "data.csv",
            ],
            cwd=work,
            env={**clean_env(), **cli_env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        training = False
        while time.monotonic() < deadline and not training and retrain.poll() is None:
            runs = client.search_runs(
                [experiment.experiment_id], filter_string="attributes.status = 'RUNNING'"
            )
            training = bool(runs) and bool(
                client.get_metric_history(runs[0].info.run_id, "train_loss")
            )
            time.sleep(0.5)
        assert training
    # The server is gone now (the block stopped it).
    lost = time.monotonic()
    try:
        _, stderr = retrain.communicate(timeout=90)
    finally:
        retrain.kill()
    assert time.monotonic() - lost < 60
    assert retrain.returncode == 4
    assert stderr.strip().splitlines()[-1].startswith(f"error: MLflow tracking server at {uri}")

    with mlflow_server(server_root, store, port=port, log_name="mlflow-2.log"):
        client = tracking.client(uri)
        versions = client.search_model_versions("name='forecaster'")
        # the first run's evaluated version and its refit; nothing from the interrupted run
        assert sorted(str(v.version) for v in versions) == ["1", "2"]
        aliases = client.get_registered_model("forecaster").aliases
        assert {k: str(v) for k, v in aliases.items()} == {"champion": "2", "challenger": "1"}
