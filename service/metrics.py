"""Prometheus metrics: one registry per app, so several apps (tests) never share counters.

With `forecaster serve --workers N` (N > 1) the metrics run in prometheus-client's
multiprocess mode: every worker writes its values to files in PROMETHEUS_MULTIPROC_DIR (set by
the CLI before the workers start) and a scrape of any worker reads all of them, so counters
and histograms are summed across workers, queue depths summed over live workers and the model
gauges show the highest value any live worker reports.
"""

from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from forecaster.outputs import ForecastArrays
from pipelines.lock import process_alive

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# The `metric` labels of forecaster_model_realised_accuracy (pipelines.monitor's version tags).
REALISED_METRICS = ("mae", "mase", "coverage", "points")


def multiprocess_mode() -> bool:
    """True in worker processes of a multi-worker server (prometheus-client reads the same)."""
    return bool(os.environ.get(MULTIPROC_ENV))


def mark_worker_dead() -> None:
    """Drop this worker's live gauges from the shared files (at shutdown)."""
    if multiprocess_mode():
        multiprocess.mark_process_dead(os.getpid())


def _forget_dead_workers(directory: Path) -> None:
    """Drop the live gauges of workers that are gone: a worker killed outright (OOM, SIGKILL)
    never ran its shutdown, and its last model and queue values would be reported for ever
    beside its replacement's."""
    pids = {
        int(match.group(1))
        for path in directory.glob("gauge_live*_*.db")
        if (match := re.fullmatch(r"gauge_live\w+?_(\d+)\.db", path.name))
    }
    for pid in pids - {os.getpid()}:
        if not process_alive(pid):
            multiprocess.mark_process_dead(pid, str(directory))


LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class ServiceMetrics:
    """Every metric the service exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "forecaster_http_requests_total",
            "HTTP requests by route template, method and status code.",
            ["route", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "forecaster_http_request_duration_seconds",
            "Time from request start to the end of the response, by route and status.",
            ["route", "method", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_series = Histogram(
            "forecaster_batch_series",
            "Series per forward pass of the online micro-batcher.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batch_requests = Histogram(
            "forecaster_batch_requests",
            "Requests merged into one forward pass by the online micro-batcher.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.inference_seconds = Histogram(
            "forecaster_batch_inference_seconds",
            "Time of one micro-batch in the inference thread (validation, model, outputs).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "forecaster_queue_depth",
            "Online requests waiting for the inference thread.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.model_version = Gauge(
            "forecaster_model_version",
            "Registry version of the loaded model (0 when none is loaded).",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.model_info = Gauge(
            "forecaster_model_info",
            "1 for the loaded model, labelled with its name, version, alias and run id.",
            ["name", "version", "alias", "run_id"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self._model_labels: tuple[str, str, str, str] | None = None
        self.model_loads = Counter(
            "forecaster_model_loads_total",
            "Model versions the service tried to load, by outcome (loaded or refused).",
            ["outcome"],
            registry=r,
        )
        self.registry_errors = Counter(
            "forecaster_registry_errors_total",
            "Registry checks that failed (alias missing or tracking server unreachable).",
            registry=r,
        )
        self.jobs = Counter(
            "forecaster_batch_jobs_total",
            "Batch jobs by event (accepted, succeeded, failed, resumed, cancelled).",
            ["event"],
            registry=r,
        )
        self.job_series = Counter(
            "forecaster_batch_job_series_total",
            "Series forecast by batch jobs.",
            registry=r,
        )
        self.realised = Gauge(
            "forecaster_model_realised_accuracy",
            "Realised accuracy of the served version's logged forecasts, as of the last "
            "monitoring run (MAE, MASE, interval coverage, points scored); NaN before any.",
            ["metric"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.forecast_log_rows = Counter(
            "forecaster_forecast_log_rows_total",
            "Forecast rows appended to the forecast log, by outcome (logged, dropped).",
            ["outcome"],
            registry=r,
        )
        self.glitches = Counter(
            "forecaster_glitches_total",
            "Readings the model read as glitches and did not use, by source (online, batch): "
            "a feed whose rate jumps has started sending bad readings.",
            ["source"],
            registry=r,
        )
        self.jobs_pending = Gauge(
            "forecaster_batch_jobs_pending",
            "Batch jobs queued or running.",
            registry=r,
            multiprocess_mode="livemax",  # every worker sees the one job store
        )

    def count_glitches(self, source: str, arrays: ForecastArrays) -> None:
        """Add the readings `arrays`' forecasts did not use as glitches to `source`'s count."""
        found = sum(len(stamps) for stamps in arrays.glitches)
        if found:
            self.glitches.labels(source).inc(found)

    def set_realised(self, realised: dict[str, float]) -> None:
        for metric in REALISED_METRICS:
            self.realised.labels(metric).set(realised.get(metric, math.nan))

    def set_model(self, name: str, version: str, alias: str | None, run_id: str | None) -> None:
        if self._model_labels is not None:
            # 0 rather than removed: in multiprocess mode a removed label keeps its last value
            self.model_info.labels(*self._model_labels).set(0)
            if not multiprocess_mode():
                self.model_info.remove(*self._model_labels)
        self._model_labels = (name, str(version), alias or "", run_id or "")
        self.model_info.labels(*self._model_labels).set(1)
        try:
            self.model_version.set(float(version))
        except ValueError:
            self.model_version.set(-1)

    def render(self) -> tuple[bytes, str]:
        if multiprocess_mode():
            _forget_dead_workers(Path(os.environ[MULTIPROC_ENV]))
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class MetricsMiddleware:
    """Counts and times every HTTP request by its route template (not its raw path, so ids
    in paths do not explode the label set)."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics):
        self.app = app
        self.metrics = metrics
        # (path regex, template) of the documented routes, read from the OpenAPI document
        # at the first request a middleware answers before routing.
        self._templates: list[tuple[re.Pattern[str], str]] | None = None

    def _route_template(self, scope: Scope) -> str:
        """The template of the route a request is for: the one routing chose, or for one a
        middleware answered before routing (401 without a key, 413 for a body too large) the
        one its path matches; "unmatched" for paths no route has."""
        route: Any = scope.get("route")
        if route is not None:
            return getattr(route, "path", None) or "unmatched"
        if self._templates is None:
            app: Any = scope.get("app")
            paths = app.openapi()["paths"] if app is not None else {}
            self._templates = [(compile_path(path)[0], path) for path in paths]
        path = scope.get("path", "")
        return next(
            (template for regex, template in self._templates if regex.match(path)), "unmatched"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            label = self._route_template(scope)
            method = scope.get("method", "")
            elapsed = time.perf_counter() - start
            self.metrics.requests.labels(label, method, str(status)).inc()
            self.metrics.latency.labels(label, method, str(status)).observe(elapsed)
