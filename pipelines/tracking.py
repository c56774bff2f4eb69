"""One place that talks to the MLflow tracking server and registry.

Every pipeline step and the service get their ``MlflowClient`` here so that three policies
hold everywhere:

- the tracking URI is resolved the same way (explicit setting, else ``MLFLOW_TRACKING_URI``
  as MLflow defines it, else the embedded ``sqlite:///mlflow.db``);
- HTTP requests are bounded (MLflow's own default retries for about four minutes), unless the
  user has set MLflow's ``MLFLOW_HTTP_REQUEST_*`` variables themselves;
- an unreachable server surfaces as ``TrackingUnavailableError`` naming the URI, never as a
  traceback from deep inside ``requests``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import mlflow
from filelock import FileLock
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from pipelines.errors import TrackingUnavailableError

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"

# Run tags that let a later run recognise a run killed on this host (`run_tags`).
HOST_TAG, PID_TAG, KIND_TAG = "pipeline.host", "pipeline.pid", "pipeline.kind"
# This process among those that had its pid: a restarted container's pipeline is pid 1 again.
PROCESS_TAG = "pipeline.process"
PROCESS = uuid.uuid4().hex[:12]
# MLflow's tag that nests a run under another in its pages.
PARENT_RUN_TAG = "mlflow.parentRunId"
DEFAULT_ARTIFACT_DIR = "mlartifacts"

# Connection refused fails at once; a black-holed host costs timeout * (retries + 1) plus
# backoff (1 s, 2 s): under a minute with these values instead of MLflow's ~4 minutes.
_CLIENT_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
    # Per-file download bars would interleave with our own progress output and the logs.
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    # MLflow writes "View run ... at: URL" to stdout when a run on a server ends, in the midst
    # of the CLI's summary; the run's URI is logged at its start.
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}


def bound_http_requests() -> None:
    """Cap MLflow's HTTP retries and timeout (and quiet its output) unless the user configured
    them.

    MLflow reads these variables on every request, so setting them once is enough; values the
    user exported are left alone.
    """
    for key, value in _CLIENT_DEFAULTS.items():
        os.environ.setdefault(key, value)


def resolve_tracking_uri(tracking_uri: str | None = None) -> str:
    """The tracking URI to use: the explicit one, else MLflow's env variable, else SQLite."""
    if tracking_uri:
        return tracking_uri
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def is_local_store(tracking_uri: str) -> bool:
    """True for a store on this machine (SQLite or a file path) rather than a server."""
    scheme = urlparse(tracking_uri).scheme
    return scheme in ("", "file", "sqlite") or len(scheme) == 1  # "C:" on Windows


def client(tracking_uri: str | None = None) -> MlflowClient:
    """An ``MlflowClient`` with bounded HTTP requests; the registry follows MLflow's rules."""
    bound_http_requests()
    uri = resolve_tracking_uri(tracking_uri)
    _create_sqlite_tables(uri)
    return MlflowClient(tracking_uri=uri)


_SQLITE_STORES_READY: set[str] = set()


def _create_sqlite_tables(uri: str) -> None:
    """Have a SQLite store's tables created by one process at a time, once per process.

    MLflow creates them when a process first opens the store, and two processes opening a
    fresh store together (a retrain beside a monitor, two working directories sharing one
    file) both ran the creation: one died on "table registered_model_tags already exists".
    The lock is a file beside the database."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix) or uri in _SQLITE_STORES_READY:
        return
    database = Path(uri[len(prefix) :].split("?")[0])
    if str(database) in ("", ":memory:") or not database.parent.is_dir():
        return  # MLflow names what is wrong with the URI
    with FileLock(f"{database}.lock"):
        opened = MlflowClient(tracking_uri=uri, registry_uri=uri)
        opened.search_experiments(max_results=1)  # the tracking store's tables
        opened.search_registered_models(max_results=1)  # the registry's
    _SQLITE_STORES_READY.add(uri)


def _is_connection_failure(exc: MlflowException) -> bool:
    message = str(exc)
    return message.startswith("API request to") and (
        "failed with exception" in message or "timeout" in message
    )


@contextlib.contextmanager
def tracking_errors(tracking_uri: str | None = None) -> Iterator[None]:
    """Turn MLflow's connection failures into ``TrackingUnavailableError`` naming the URI."""
    try:
        yield
    except MlflowException as exc:
        if _is_connection_failure(exc):
            uri = resolve_tracking_uri(tracking_uri)
            # A server that took the request and did not answer in time may have applied it.
            state = (
                "did not answer in time (it may have applied the last request)"
                if "read timed out" in str(exc).lower()
                else "is unreachable"
            )
            raise TrackingUnavailableError(
                f"MLflow tracking server at {uri} {state} "
                f"(MLFLOW_HTTP_REQUEST_TIMEOUT={os.environ.get('MLFLOW_HTTP_REQUEST_TIMEOUT')}s, "
                f"MLFLOW_HTTP_REQUEST_MAX_RETRIES={os.environ.get('MLFLOW_HTTP_REQUEST_MAX_RETRIES')})"
            ) from exc
        raise


def check_reachable(tracking_uri: str | None = None) -> None:
    """Fail fast, before any training, when the tracking server cannot be reached."""
    with tracking_errors(tracking_uri):
        client(tracking_uri).search_experiments(max_results=1)


def ensure_experiment(
    name: str, *, tracking_uri: str | None = None, artifact_location: str | None = None
) -> str:
    """Id of the experiment ``name``, created when missing.

    On a local store new experiments keep their artifacts in ``./mlartifacts`` (or the given
    location) rather than MLflow's ``./mlruns``; a server decides for itself.
    """
    uri = resolve_tracking_uri(tracking_uri)
    mlflow_client = client(uri)
    with tracking_errors(uri):
        experiment = mlflow_client.get_experiment_by_name(name)
        if experiment is not None:
            if experiment.lifecycle_stage == "deleted":
                mlflow_client.restore_experiment(experiment.experiment_id)
            return experiment.experiment_id
        if artifact_location is None and is_local_store(uri):
            artifact_location = DEFAULT_ARTIFACT_DIR
        if artifact_location is not None and "://" not in artifact_location:
            artifact_location = Path(artifact_location).resolve().as_uri()
        try:
            return mlflow_client.create_experiment(name, artifact_location=artifact_location)
        except MlflowException:
            # Another process created it between our lookup and create.
            experiment = mlflow_client.get_experiment_by_name(name)
            if experiment is None:
                raise
            return experiment.experiment_id


@contextlib.contextmanager
def tracking_uri_set(tracking_uri: str | None) -> Iterator[str]:
    """Point the fluent ``mlflow.*`` API at ``tracking_uri`` for the duration of the block."""
    uri = resolve_tracking_uri(tracking_uri)
    bound_http_requests()
    _create_sqlite_tables(uri)
    # MLflow mirrors its global URI into MLFLOW_TRACKING_URI; None unsets both again.
    previous = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield uri
    finally:
        mlflow.set_tracking_uri(previous)


def run_tags(kind: str) -> dict[str, str]:
    """The tags of a pipeline run of `kind` by this process (see `pipelines.retrain`'s
    `mark_stale_runs`, which ends the runs of processes that are gone)."""
    return {
        HOST_TAG: socket.gethostname(),
        PID_TAG: str(os.getpid()),
        PROCESS_TAG: PROCESS,
        KIND_TAG: kind,
    }
