"""The FastAPI application: `create_app` builds it, `lifespan` loads the model and starts the
background work (registry poller, micro-batcher, batch-job workers, forecast-log flusher)."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import torch
from fastapi import Depends, FastAPI

from forecaster.outputs import ForecastArrays
from service.batcher import MicroBatcher
from service.deps import check_api_key
from service.errors import install_error_handlers
from service.forecast_logging import ServiceForecastLog
from service.inference import ItemForecast, predict_items
from service.job_runner import JobRunner
from service.job_store import JobStore
from service.metrics import MetricsMiddleware, ServiceMetrics, mark_worker_dead
from service.middleware import (
    ApiKeyMiddleware,
    ArrivalMiddleware,
    BodyLimitMiddleware,
    UnexpectedErrorMiddleware,
)
from service.model_manager import ModelIdentity, ModelManager, ModelSource, RegistrySource
from service.routers import batch_jobs, docs, forecast, health, models, scoring
from service.schemas import ForecastRequest
from service.settings import ServiceSettings
from service.supervisor import Supervisor

logger = logging.getLogger("service")

API_VERSION = "1.0.0"
GIL_SWITCH_INTERVAL_S = 0.0005
# How long startup waits for the first registry check before serving (not ready) anyway:
# the port stays closed meanwhile, so a registry that hangs kept /healthz unanswered for a
# minute, long enough for an orchestrator's liveness probe to restart the service.
STARTUP_CHECK_S = 10.0


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: ServiceSettings = app.state.settings
    metrics: ServiceMetrics = app.state.metrics
    source: ModelSource = app.state.model_source or RegistrySource(settings)
    manager = ModelManager(source, metrics, poll_interval_s=settings.poll_interval_s)
    forecast_log = ServiceForecastLog.from_settings(settings, metrics)

    def on_online_forecast(forecast: ItemForecast) -> None:
        metrics.count_glitches("online", forecast.arrays)
        if forecast_log is not None:
            forecast_log.record_item(forecast)

    def on_batch_forecast(arrays: ForecastArrays, identity: ModelIdentity) -> None:
        metrics.count_glitches("batch", arrays)

    def predict_in_inference_mode(items: list) -> list:
        with torch.inference_mode():
            return predict_items(items)

    batcher = MicroBatcher(
        predict_in_inference_mode,
        max_batch_size=settings.max_batch_size,
        max_wait_s=settings.max_batch_wait_ms / 1000,
        metrics=metrics,
    )
    store = JobStore(settings.jobs_db or Path(settings.data_dir) / "jobs.db")
    runner = JobRunner(
        store,
        Path(settings.data_dir) / "jobs",
        manager,
        metrics,
        workers=settings.batch_workers,
        chunk_series=settings.batch_chunk_series,
        partition_bytes=settings.batch_partition_bytes,
        lease_s=settings.job_lease_s,
        ttl_s=None if settings.job_ttl_hours is None else settings.job_ttl_hours * 3600,
        on_forecast=on_batch_forecast,
        # A job's forecasts are logged once its result is committed, not chunk by chunk: a
        # cancelled job, or one restarted under another version, served none of them.
        publish_log=forecast_log.adopt if forecast_log is not None else None,
    )
    app.state.manager = manager
    app.state.batcher = batcher
    app.state.on_served = on_online_forecast
    app.state.job_store = store
    app.state.job_runner = runner

    # The event loop and the inference thread share the GIL; a shorter switch interval lets
    # the loop take in the next requests while a batch runs, so batches fill up under load
    # (measured: about +20% throughput at concurrency 32 on 2 cores).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    supervisor = Supervisor()
    app.state.supervisor = supervisor
    supervisor.start("micro-batcher", batcher.run)
    supervisor.start("model-poller", manager.run_poller)
    if not await manager.wait_first_check(STARTUP_CHECK_S):
        logger.warning("first registry check still running; serving without a model meanwhile")
    if manager.current is None:
        logger.warning("no model loaded: %s", manager.unavailable_reason())
    runner.start(supervisor)
    if forecast_log is not None:
        supervisor.start("forecast-log-flusher", forecast_log.run_flusher)
    try:
        yield
    finally:
        await runner.stop()
        await supervisor.stop("model-poller", "micro-batcher")
        await batcher.stop()  # finishes the batch in flight
        await supervisor.stop()  # the flusher last: it writes what the others logged
        store.close()
        mark_worker_dead()


def _configure_logging(settings: ServiceSettings) -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=settings.log_level.upper() if settings.log_level != "trace" else "DEBUG",
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )


def create_app(
    settings: ServiceSettings | None = None, *, model_source: ModelSource | None = None
) -> FastAPI:
    """Build the app. `model_source` replaces the registry (tests, embedding a local model)."""
    settings = settings or ServiceSettings()
    _configure_logging(settings)
    if settings.torch_threads is not None:
        torch.set_num_threads(settings.torch_threads)
    app = FastAPI(
        title="forecaster",
        version=API_VERSION,
        summary="Online and batch time-series forecasts from the MLflow Model Registry.",
        lifespan=lifespan,
        dependencies=[Depends(check_api_key)],
        # Served by the docs router instead, behind the API key (see service/routers/docs.py).
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.metrics = ServiceMetrics()
    app.state.model_source = model_source
    install_error_handlers(app)
    for module in (forecast, batch_jobs, models, scoring, health, docs):
        app.include_router(module.router)
    app.openapi = docs.with_request_models(app, [ForecastRequest])  # type: ignore[method-assign]
    # Innermost first: metrics see every response (the JSON 500s included), the body limit
    # runs before any parsing.
    app.add_middleware(UnexpectedErrorMiddleware)
    app.add_middleware(_LazyArrival)
    app.add_middleware(
        BodyLimitMiddleware,
        max_body_bytes=settings.max_body_bytes,
        max_upload_bytes=settings.max_upload_bytes,
    )
    app.add_middleware(ApiKeyMiddleware, settings=settings)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app


class _LazyArrival:
    """ArrivalMiddleware bound to the batcher the lifespan creates."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        batcher = getattr(scope["app"].state, "batcher", None) if "app" in scope else None
        if batcher is None:
            await self.app(scope, receive, send)
            return
        await ArrivalMiddleware(self.app, batcher)(scope, receive, send)
