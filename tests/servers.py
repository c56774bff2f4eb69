"""Real servers the end-to-end tests start on loopback: MLflow's tracking server, `forecaster
serve`, and PostgreSQL (pgserver's, on a unix socket)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
MLFLOW = str(Path(sys.executable).with_name("mlflow"))
API_KEY = "e2e-key-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str, proc: subprocess.Popen | None = None
) -> Any:
    """Poll `predicate` until it returns something truthy (returned); fail after `timeout`
    seconds, or at once when `proc` exits."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) while waiting for {what}")
        try:
            last = predicate()
            if last:
                return last
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


class Process:
    """A server subprocess whose output goes to a log file (shown when a test fails)."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str], cwd: Path):
        self.log = log
        self.handle = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            args, stdout=self.handle, stderr=subprocess.STDOUT, env=env, cwd=cwd
        )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.handle.close()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def clean_env() -> dict[str, str]:
    """This environment without the user's forecaster or MLflow settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FORECASTER_", "MLFLOW_"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


@contextlib.contextmanager
def mlflow_server(
    root: Path, backend_store_uri: str, *, port: int | None = None, log_name: str = "mlflow.log"
) -> Iterator[tuple[str, Process]]:
    """`mlflow server` on loopback with artifacts under `root`; yields its URI once healthy."""
    port = port or free_port()
    root.mkdir(parents=True, exist_ok=True)
    server = Process(
        [
            MLFLOW,
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            backend_store_uri,
            "--artifacts-destination",
            str(root / "artifacts"),
            "--serve-artifacts",
        ],
        root / log_name,
        env=clean_env(),
        cwd=root,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: httpx.get(f"{uri}/health", timeout=2).status_code == 200,
            120,
            "the MLflow tracking server",
            server.proc,
        )
        yield uri, server
    except BaseException:
        print(server.tail())
        raise
    finally:
        server.stop()


def start_service(
    tmp_path: Path,
    port: int,
    tracking_uri: str,
    run: int | str,
    workers: int = 1,
    data_dir: Path | None = None,
    env: dict[str, str] | None = None,
) -> Process:
    """`forecaster serve` on loopback, logging to `tmp_path/service-<run>.log`."""
    full_env = {
        **clean_env(),
        "FORECASTER_SERVICE_API_KEYS": API_KEY,
        "FORECASTER_SERVICE_POLL_INTERVAL_S": "1",
        # small partitions and chunks: a batch job of a few hundred series runs for seconds
        "FORECASTER_SERVICE_BATCH_PARTITION_BYTES": "65536",
        "FORECASTER_SERVICE_BATCH_CHUNK_SERIES": "4",
        "FORECASTER_SERVICE_LOG_LEVEL": "info",
        **(env or {}),
    }
    return Process(
        [
            sys.executable,
            "-m",
            "service.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--tracking-uri",
            tracking_uri,
            "--data-dir",
            str(data_dir or tmp_path / "service-data"),
            "--workers",
            str(workers),
        ],
        tmp_path / f"service-{run}.log",
        env=full_env,
        cwd=ROOT,
    )


@contextlib.contextmanager
def postgres(root: Path) -> Iterator[str]:
    """A PostgreSQL 16 server of its own in `root` (pgserver: started in about a second,
    listening on a unix socket only); yields its SQLAlchemy URI for psycopg."""
    import pgserver

    server = pgserver.get_server(root, cleanup_mode="stop")
    try:
        yield server.get_uri().replace("postgresql://", "postgresql+psycopg://", 1)
    finally:
        server.cleanup()
