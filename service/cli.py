"""`forecaster` command line: the pipeline commands plus `serve`."""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from pipelines.cli import register_commands
from pipelines.lock import process_alive
from service.metrics import MULTIPROC_ENV
from service.settings import DEFAULT_MODEL_URI, ServiceSettings, settings_env


def serve_overrides(args: argparse.Namespace) -> dict[str, object]:
    """The settings `forecaster serve`'s options set; the environment supplies the rest."""
    overrides = {
        "host": args.host,
        "port": args.port,
        "workers": args.workers,
        "model_uri": args.model_uri,
        "device": args.device,
        "tracking_uri": args.tracking_uri,
        "data_dir": args.data_dir,
    }
    return {k: v for k, v in overrides.items() if v is not None}


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    overrides = serve_overrides(args)
    try:
        settings = ServiceSettings(**overrides)
    except ValidationError as exc:
        for err in exc.errors():
            field = _variable_set(".".join(str(p) for p in err["loc"])) or "settings"
            print(f"forecaster serve: invalid setting {field}: {err['msg']}", file=sys.stderr)
        return 2
    # Worker processes rebuild the settings from the environment, so the overrides travel there.
    os.environ.update(settings_env(overrides))
    if settings.workers > 1:
        _prepare_multiprocess_metrics(settings.data_dir / "prometheus")
    uvicorn.run(
        "service.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=settings.log_level,
        timeout_graceful_shutdown=int(settings.request_timeout_s) + 1,
    )
    return 0


def _variable_set(name: str) -> str:
    """The environment variable the operator set, where pydantic names a setting that takes
    several by the first of them (FORECASTER_SERVICE_DEVICE for FORECASTER_DEVICE=bogus)."""
    for field in ServiceSettings.model_fields.values():
        choices = getattr(field.validation_alias, "choices", None) or []
        if name in choices:
            return next((c for c in choices if isinstance(c, str) and c in os.environ), name)
    return name


def _prepare_multiprocess_metrics(root: Path) -> None:
    """Point prometheus-client's multiprocess mode at an empty directory of this server's
    own before the workers start (they inherit the variable), so /metrics sums every worker's
    counters and no other server's: `root/<host>-<pid>`. Replicas share a data directory, and
    with one directory for all a starting server deleted the others' values, then reported
    their traffic as its own. Directories of this host's servers that are gone are removed."""
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        directory = Path(given)  # the operator's choice: one server's, emptied at its start
    else:
        host = socket.gethostname()
        for old in root.glob(f"{host}-*"):
            pid = old.name.rsplit("-", 1)[1]
            if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
                shutil.rmtree(old, ignore_errors=True)
        directory = root / f"{host}-{os.getpid()}"
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):  # values of a previous server are not ours
        stale.unlink()
    os.environ[MULTIPROC_ENV] = str(directory)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the forecasting HTTP service (uvicorn)",
        description="Serve online and batch forecasts from the model registry. Options "
        "override the FORECASTER_SERVICE_* environment settings.",
    )
    serve.add_argument("--host", help="interface to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default 8000)")
    serve.add_argument("--workers", type=int, help="uvicorn worker processes (default 1)")
    serve.add_argument(
        "--model-uri", help=f"registry URI of the model to serve (default {DEFAULT_MODEL_URI})"
    )
    serve.add_argument("--device", help="torch device, e.g. cpu or cuda (default: auto)")
    serve.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI)")
    serve.add_argument("--data-dir", help="directory for batch-job files and the job database")
    serve.set_defaults(handler=_serve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forecaster", description="Transformer time-series forecasting."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register_commands(sub)
    _add_serve(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sys.exit(args.handler(args))


if __name__ == "__main__":
    main()
