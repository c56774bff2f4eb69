"""The main job on the embedded default (`make demo`): retrain, register, promote, serve.

1. writes bundled synthetic data (8 hourly series with daily and weekly seasonality) to
   `data/demo.csv`;
2. runs `forecaster retrain` on it with `pipelines/demo.yaml`: MLflow in `./mlflow.db` and
   `./mlartifacts`, no server to install; prints the evaluation table and the decision;
3. starts `forecaster serve` on the champion and sends one forecast request, printing the
   equivalent `curl`; the service then keeps running until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from forecaster.synthetic import generate_synthetic
from pipelines.cli import main as pipelines_main


def _abridge(values: list) -> list:
    """The first few values, rounded, for a readable printout."""
    shown = [round(v, 2) if isinstance(v, float) else v for v in values[:6]]
    return shown + ["..."] if len(values) > len(shown) else shown


def _port_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:`port`: another service there would answer the
    demo's requests in its place."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def _wait_ready(base_url: str, process: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"error: the service exited with code {process.returncode}")
        try:
            if httpx.get(f"{base_url}/readyz", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"error: the service at {base_url} was not ready within {timeout:.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--no-serve", action="store_true", help="stop after retrain")
    args = parser.parse_args(argv)
    if not args.no_serve and not _port_free(args.port):
        raise SystemExit(
            f"error: port {args.port} is in use (an earlier demo still running?); stop it, or "
            f"run on another port: make demo PORT=8001"
        )

    data = Path("data/demo.csv")
    data.parent.mkdir(exist_ok=True)
    frame = generate_synthetic(n_series=8, n_steps=24 * 7 * 12, freq="h", seed=0)
    frame.to_csv(data, index=False)
    print(f"wrote {len(frame):,} rows of {frame['unique_id'].nunique()} series to {data}\n")

    code = pipelines_main(["retrain", "--config", "pipelines/demo.yaml", "--data", str(data)])
    if code != 0:
        return code
    print(
        "\nBrowse runs, metrics, plots and registered versions in the MLflow UI:\n"
        "  .venv/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db --port 5000"
        "   # then open http://127.0.0.1:5000\n"
    )
    if args.no_serve:
        return 0

    base_url = f"http://127.0.0.1:{args.port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "service.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(args.port),
        ],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        _wait_ready(base_url, server)
        history = frame[frame["unique_id"] == frame["unique_id"].iloc[0]].tail(24 * 7)
        body = {
            "horizon": 24,
            "quantiles": [0.1, 0.5, 0.9],
            "series": [
                {
                    "id": str(history["unique_id"].iloc[0]),
                    "start": history["ds"].iloc[0].isoformat(),
                    "freq": "h",
                    "values": [round(float(v), 3) for v in history["y"]],
                }
            ],
        }
        response = httpx.post(f"{base_url}/v1/forecast", json=body, timeout=30.0)
        # The body goes to a file so that the printed command runs as it is.
        request = data.with_name("demo_request.json")
        request.write_text(json.dumps(body))
        print(
            f"\n$ curl -s -X POST {base_url}/v1/forecast -H 'content-type: application/json' "
            f"-d @{request}   # one week of hourly values, 24 steps ahead"
        )
        answer = response.json()
        for forecast in answer.get("forecasts", []):
            for key, values in forecast.items():
                if isinstance(values, dict):
                    forecast[key] = {name: _abridge(v) for name, v in values.items()}
                elif isinstance(values, list):
                    forecast[key] = _abridge(values)
        print(json.dumps(answer, indent=1)[:3000])
        print(f"\nThe service is running at {base_url} (docs at {base_url}/docs). Ctrl-C stops it.")
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
