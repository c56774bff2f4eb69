"""Serving benchmark: `forecaster serve` against `mlflow models serve` for the same model.

    python -m benchmarks.serving [--duration 10] [--concurrency 1,8,32,64]
                                 [--batch-series 10000] [--json benchmarks/results/serving.json]

One command: trains a model with the default architecture (briefly: speed does not depend on
accuracy), registers it as `champion` in a SQLite-backed registry with the pipelines' register
step, measures the in-process `predict` time for the benchmark request (the floor), starts this
service and `mlflow models serve --env-manager local` for the same registered model on loopback,
drives each with the same closed-loop load at each concurrency for a fixed duration, and prints
throughput and p50/p95/p99 side by side. At concurrency 1 it then alternates rounds of the
in-process floor and of each of our routes (a paired measurement: a shared machine's drift
hits both sides), and times a batch job of `--batch-series` series against one in-process
batched `predict` over the same frame, run just before it. Everything is written as JSON.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import torch

from benchmarks.serving.load import encode_request, run_load
from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster.synthetic import generate_synthetic

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def train_and_register(workdir: Path) -> tuple[str, Forecaster, pd.DataFrame]:
    """Fit the default architecture for a few hundred windows and register it as champion."""
    from pipelines import tracking
    from pipelines.register import input_example, register

    data = generate_synthetic(n_series=16, n_steps=24 * 7 * 8, seed=0)
    model = Forecaster(
        ModelConfig(),
        TrainConfig(max_epochs=1, max_windows_per_epoch=512, progress=False, device="cpu"),
    ).fit(data)
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    experiment = tracking.ensure_experiment(
        "serving-benchmark", tracking_uri=uri, artifact_location=str(workdir / "mlartifacts")
    )
    client = tracking.client(uri)
    run = client.create_run(experiment)
    with tracking.tracking_uri_set(uri):
        ref = register(
            model,
            input_example(model, data),
            client=client,
            run_id=run.info.run_id,
            model_name="forecaster",
            tags={"purpose": "serving benchmark"},
        )
    client.set_terminated(run.info.run_id)
    client.set_registered_model_alias("forecaster", "champion", ref.version)
    return uri, model, data


def in_process_floor(model: Forecaster, history: pd.DataFrame, repeats: int = 200) -> dict:
    """Median time of `predict` on the benchmark request's frame, in this process."""
    for _ in range(10):
        model.predict(history)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.predict(history)
        times.append(time.perf_counter() - start)
    ms = np.asarray(times) * 1000
    return {"p50_ms": float(np.median(ms)), "p95_ms": float(np.percentile(ms, 95))}


def paired_overhead(
    model: Forecaster, history: pd.DataFrame, port: int, targets: dict, rounds: int = 7
) -> dict:
    """The service's latency above the in-process floor at concurrency 1, measured in
    alternating rounds (floor, then each route, 2 s each) so that drift of a shared machine
    hits both sides; the medians over rounds of each side's p50 and of the gap."""
    per_round: list[dict] = []
    for _ in range(rounds):
        row = {"floor": in_process_floor(model, history, repeats=150)["p50_ms"]}
        for name, request in targets.items():
            row[name] = run_load(HOST, port, request, 1, 2.0).p50_ms
        per_round.append(row)
    out: dict = {"rounds": per_round}
    for name in ["floor", *targets]:
        out[f"{name} p50_ms"] = float(np.median([r[name] for r in per_round]))
    for name in targets:
        out[f"{name} above floor ms"] = float(np.median([r[name] - r["floor"] for r in per_round]))
    return out


def batch_frame(data: pd.DataFrame, n_series: int, length: int) -> pd.DataFrame:
    """`n_series` series of `length` points: shifted copies of the training series."""
    base = data.groupby("unique_id").tail(length)
    per_copy = base["unique_id"].nunique()
    copies = -(-n_series // per_copy)
    frames = []
    for k in range(copies):
        part = base.copy()
        part["unique_id"] = part["unique_id"] + f"-{k:05d}"
        part["y"] = part["y"] + k % 17
        frames.append(part)
    frame = pd.concat(frames, ignore_index=True)
    keep = pd.unique(frame["unique_id"])[:n_series]
    return frame[frame["unique_id"].isin(keep)].reset_index(drop=True)


class Server:
    def __init__(self, name: str, args: list[str], env: dict, log: Path, port: int, ready: str):
        self.name, self.port, self.ready = name, port, ready
        self.log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            args, env=env, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT
        )

    def wait(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}")
            try:
                if (
                    httpx.get(f"http://{HOST}:{self.port}{self.ready}", timeout=2).status_code
                    == 200
                ):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not become ready in {timeout} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def split_json(history: pd.DataFrame) -> bytes:
    frame = history[["unique_id", "ds", "y"]].copy()
    frame["ds"] = frame["ds"].dt.strftime("%Y-%m-%dT%H:%M:%S")
    return json.dumps(
        {"dataframe_split": {"columns": list(frame.columns), "data": frame.values.tolist()}}
    ).encode()


def forecast_json(history: pd.DataFrame) -> bytes:
    return json.dumps(
        {
            "series": [
                {
                    "id": str(history["unique_id"].iat[0]),
                    "timestamps": history["ds"].dt.strftime("%Y-%m-%dT%H:%M:%S").tolist(),
                    "values": history["y"].tolist(),
                }
            ]
        }
    ).encode()


def check_same_answer(ours: int, mlflow: int, body: bytes) -> None:
    a = httpx.post(f"http://{HOST}:{ours}/invocations", content=body, headers=_JSON).json()
    b = httpx.post(f"http://{HOST}:{mlflow}/invocations", content=body, headers=_JSON).json()
    got, want = pd.DataFrame(a["predictions"]), pd.DataFrame(b["predictions"])
    assert list(got.columns) == list(want.columns), (got.columns, want.columns)
    np.testing.assert_allclose(got["mean"], want["mean"], rtol=1e-4, atol=1e-4)


_JSON = {"content-type": "application/json"}


def run_batch_job(port: int, frame: pd.DataFrame) -> dict:
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    body = buffer.getvalue()
    base = f"http://{HOST}:{port}"
    start = time.perf_counter()
    response = httpx.post(
        f"{base}/v1/batch-jobs?output_format=parquet",
        content=body,
        headers={"content-type": "application/vnd.apache.parquet"},
        timeout=600,
    )
    response.raise_for_status()
    job_id = response.json()["id"]
    accepted = time.perf_counter() - start
    while True:
        job = httpx.get(f"{base}/v1/batch-jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed"):
            break
        time.sleep(0.1)
    done = time.perf_counter() - start
    if job["status"] != "succeeded":
        raise RuntimeError(f"batch job failed: {job['error']}")
    result = httpx.get(f"{base}/v1/batch-jobs/{job_id}/result", timeout=600)
    fetched = time.perf_counter() - start
    rows = len(pd.read_parquet(io.BytesIO(result.content)))
    return {
        "upload_mb": round(len(body) / 1e6, 1),
        "accepted_s": round(accepted, 2),
        "done_s": round(done, 2),
        "with_download_s": round(fetched, 2),
        "result_rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.serving",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per load level")
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--batch-series", type=int, default=10_000)
    parser.add_argument("--json", default="benchmarks/results/serving.json")
    parser.add_argument("--workdir", help="keep registry and logs here (default: a temp dir)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for the floor and for both servers (OMP_NUM_THREADS); default 1",
    )
    args = parser.parse_args(argv)
    # The same thread count everywhere: the floor, this service and MLflow's server.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    levels = [int(c) for c in args.concurrency.split(",")]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="serving-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)

    print(f"training and registering a model in {workdir} ...", flush=True)
    tracking_uri, model, data = train_and_register(workdir)
    from pipelines.registry import load_forecaster

    served = load_forecaster("models:/forecaster@champion", tracking_uri=tracking_uri).forecaster
    history = data[data["unique_id"] == data["unique_id"].iat[0]].tail(served.context_length)
    floor = in_process_floor(served, history)
    print(
        f"in-process predict, 1 series x {served.context_length} points: {floor['p50_ms']:.2f} ms"
    )

    big = batch_frame(data, args.batch_series, served.context_length)

    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": tracking_uri,
        # mlflow models serve runs `uvicorn` from PATH
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    ours_port, mlflow_port = free_port(), free_port()
    ours = Server(
        "forecaster serve",
        [
            sys.executable,
            "-m",
            "service.cli",
            "serve",
            "--host",
            HOST,
            "--port",
            str(ours_port),
            "--tracking-uri",
            tracking_uri,
            "--data-dir",
            str(workdir / "service-data"),
            "--device",
            "cpu",
        ],
        {k: v for k, v in env.items() if not k.startswith("FORECASTER_SERVICE_")},
        workdir / "service.log",
        ours_port,
        "/readyz",
    )
    mlflow = Server(
        "mlflow models serve",
        [
            str(Path(sys.executable).with_name("mlflow")),
            "models",
            "serve",
            "-m",
            "models:/forecaster@champion",
            "--env-manager",
            "local",
            "-h",
            HOST,
            "-p",
            str(mlflow_port),
        ],
        env,
        workdir / "mlflow-serve.log",
        mlflow_port,
        "/ping",
    )
    results: dict = {}
    try:
        ours.wait()
        mlflow.wait()
        invocations = split_json(history)
        check_same_answer(ours_port, mlflow_port, invocations)
        targets = {
            "mlflow /invocations": encode_request(
                HOST, mlflow_port, "/invocations", invocations, "application/json"
            ),
            "ours /invocations": encode_request(
                HOST, ours_port, "/invocations", invocations, "application/json"
            ),
            "ours /v1/forecast": encode_request(
                HOST, ours_port, "/v1/forecast", forecast_json(history), "application/json"
            ),
        }
        for name, request in targets.items():
            port = mlflow_port if name.startswith("mlflow") else ours_port
            run_load(HOST, port, request, 4, 2.0)  # warm up
            results[name] = []
            for c in levels:
                r = run_load(HOST, port, request, c, args.duration)
                results[name].append(r.as_dict())
                print(
                    f"{name:22s} c={c:3d} {r.throughput:8.1f} req/s  p50 {r.p50_ms:7.2f}  "
                    f"p95 {r.p95_ms:7.2f}  p99 {r.p99_ms:7.2f} ms  errors {r.errors}",
                    flush=True,
                )
        mlflow.stop()
        paired = paired_overhead(
            served,
            history,
            ours_port,
            {name: targets[name] for name in ("ours /v1/forecast", "ours /invocations")},
        )
        # The in-process rate right before the job, so both see the machine in the same state.
        start = time.perf_counter()
        served.predict(big)
        in_process_batch_s = time.perf_counter() - start
        print(f"in-process predict, {args.batch_series} series: {in_process_batch_s:.2f} s")
        batch = run_batch_job(ours_port, big)
    finally:
        ours.stop()
        mlflow.stop()

    batch["series"] = args.batch_series
    batch["series_per_s"] = round(args.batch_series / batch["done_s"], 1)
    batch["in_process_s"] = round(in_process_batch_s, 2)
    batch["in_process_series_per_s"] = round(args.batch_series / in_process_batch_s, 1)
    batch["ratio"] = round(batch["series_per_s"] / batch["in_process_series_per_s"], 3)

    print_table(results, levels, floor, batch, served)
    print(
        "\nconcurrency 1, paired rounds (median p50): floor "
        f"{paired['floor p50_ms']:.2f} ms; "
        + "; ".join(
            f"{name} {paired[f'{name} p50_ms']:.2f} ms (+{paired[f'{name} above floor ms']:.2f})"
            for name in ("ours /v1/forecast", "ours /invocations")
        )
    )
    out = {
        "machine": {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "load_average": os.getloadavg(),
        },
        "model": {
            "context_length": served.model_config.context_length,
            "prediction_length": served.model_config.prediction_length,
            "d_model": served.model_config.d_model,
        },
        "duration_s": args.duration,
        "in_process_floor_ms": floor,
        "load": results,
        "concurrency_1_paired": paired,
        "batch_job": batch,
    }
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"\nwrote {path}")
    return 0


def print_table(results: dict, levels: list[int], floor: dict, batch: dict, model) -> None:
    names = list(results)
    print(
        f"\nmodel: context {model.model_config.context_length}, horizon "
        f"{model.max_horizon}, d_model {model.model_config.d_model}; request: 1 series x "
        f"{model.context_length} points; in-process predict floor p50 {floor['p50_ms']:.2f} ms\n"
    )
    header = "| concurrency | " + " | ".join(f"{n} req/s · p50 / p95 / p99 ms" for n in names)
    print(header + " |")
    print("|---" * (len(names) + 1) + "|")
    for i, c in enumerate(levels):
        cells = []
        for n in names:
            r = results[n][i]
            cells.append(
                f"{r['throughput']:.0f} · {r['p50_ms']:.1f} / {r['p95_ms']:.1f} / {r['p99_ms']:.1f}"
            )
        print(f"| {c} | " + " | ".join(cells) + " |")
    print(
        f"\nbatch job, {batch['series']} series: {batch['series_per_s']:.0f} series/s "
        f"({batch['done_s']:.1f} s from upload to done, {batch['upload_mb']} MB Parquet) vs "
        f"in-process predict {batch['in_process_series_per_s']:.0f} series/s "
        f"({batch['in_process_s']:.1f} s): {batch['ratio']:.0%}"
    )


if __name__ == "__main__":
    sys.exit(main())
