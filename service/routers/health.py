"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from service.deps import BatcherDep, JobStoreDep, ManagerDep, MetricsDep
from service.schemas import HealthOut

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthOut, summary="Alive: the process answers")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=HealthOut,
    responses={
        503: {
            "model": HealthOut,
            "description": "No model loaded yet, or a background task is restarting",
        }
    },
    summary="Ready: a model is loaded and forecasts can be answered",
)
async def readyz(manager: ManagerDep, request: Request) -> JSONResponse:
    """Open to probes without a key, so with keys configured it names no model."""
    served = manager.current
    settings = request.app.state.settings
    if served is None:
        return JSONResponse(
            {"status": "not_ready", "detail": manager.unavailable_reason(), "model": None},
            status_code=503,
        )
    model = None if settings.api_keys else served.identity.info()
    down = request.app.state.supervisor.down()
    if down:
        detail = "; ".join(f"{name} is restarting after {error}" for name, error in down.items())
        return JSONResponse(
            {"status": "not_ready", "detail": detail, "model": model},
            status_code=503,
        )
    return JSONResponse({"status": "ready", "detail": None, "model": model})


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}}},
)
async def metrics(metrics: MetricsDep, batcher: BatcherDep, store: JobStoreDep) -> Response:
    metrics.queue_depth.set(batcher.queue_depth)
    metrics.jobs_pending.set(store.count_pending())
    body, content_type = metrics.render()
    return Response(body, media_type=content_type)
