"""Dependencies the routes declare with `Annotated[..., Depends(...)]`; tests override them.

All are `async def`: FastAPI runs plain `def` dependencies in a worker thread, and a thread hop
per dependency per request costs more than everything they do.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from service.batcher import MicroBatcher
from service.errors import AuthError, ModelUnavailableError
from service.inference import ItemForecast
from service.job_runner import JobRunner
from service.job_store import JobStore
from service.metrics import ServiceMetrics
from service.model_manager import ModelManager, ServedModel
from service.settings import ServiceSettings

_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, scheme_name="ApiKey")
_bearer = HTTPBearer(auto_error=False, scheme_name="Bearer")


async def get_settings(request: Request) -> ServiceSettings:
    return request.app.state.settings


async def get_manager(request: Request) -> ModelManager:
    return request.app.state.manager


async def get_batcher(request: Request) -> MicroBatcher:
    return request.app.state.batcher


async def get_job_store(request: Request) -> JobStore:
    return request.app.state.job_store


async def get_job_runner(request: Request) -> JobRunner:
    return request.app.state.job_runner


async def get_metrics(request: Request) -> ServiceMetrics:
    return request.app.state.metrics


async def get_on_served(request: Request) -> Callable[[ItemForecast], None]:
    """What takes each online forecast a request was answered with (glitch metrics, the
    forecast log)."""
    return request.app.state.on_served


SettingsDep = Annotated[ServiceSettings, Depends(get_settings)]
ManagerDep = Annotated[ModelManager, Depends(get_manager)]
BatcherDep = Annotated[MicroBatcher, Depends(get_batcher)]
JobStoreDep = Annotated[JobStore, Depends(get_job_store)]
JobRunnerDep = Annotated[JobRunner, Depends(get_job_runner)]
MetricsDep = Annotated[ServiceMetrics, Depends(get_metrics)]
OnServedDep = Annotated[Callable[[ItemForecast], None], Depends(get_on_served)]


async def get_served_model(manager: ManagerDep) -> ServedModel:
    """The model to answer with; 503 naming the NAME@alias the service waits for."""
    served = manager.current
    if served is None:
        raise ModelUnavailableError(manager.unavailable_reason(), headers={"Retry-After": "5"})
    return served


ServedModelDep = Annotated[ServedModel, Depends(get_served_model)]


def _presented_key(api_key: str | None, bearer: HTTPAuthorizationCredentials | None) -> str | None:
    if api_key:
        return api_key
    if bearer is not None and bearer.credentials:
        return bearer.credentials
    return None


def _matches(presented: str, settings: ServiceSettings) -> bool:
    # Compare against every key, always, so timing says nothing about which one matched.
    given = presented.encode()
    found = False
    for key in settings.api_keys:
        found |= hmac.compare_digest(given, key.get_secret_value().encode())
    return found


_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="forecaster", ApiKey header="X-API-Key"'}


# Liveness and readiness probes (ours and MLflow's scoring protocol's): orchestrators and
# load balancers call them without credentials, and they reveal nothing but up or down.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/ping", "/health"})


async def check_api_key(
    request: Request,
    settings: SettingsDep,
    api_key: Annotated[str | None, Security(_api_key_header)] = None,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)] = None,
) -> None:
    """Every route but the probes: a valid key is required when keys are configured.

    `ApiKeyMiddleware` applies the same check before a body is read; this dependency puts the
    schemes in the OpenAPI schema and guards requests that reach a route some other way.
    """
    if not settings.api_keys:
        return
    route = request.scope.get("route")
    if getattr(route, "path", None) in OPEN_PATHS:
        return
    verify_key(_presented_key(api_key, bearer), settings)


def verify_key(presented: str | None, settings: ServiceSettings) -> None:
    """Raise AuthError (401) unless `presented` is one of the configured keys."""
    if presented is None:
        raise AuthError(
            "missing API key: send it in the X-API-Key header or as 'Authorization: Bearer <key>'",
            field="X-API-Key",
            headers=_CHALLENGE,
        )
    if not _matches(presented, settings):
        raise AuthError("invalid API key", field="X-API-Key", headers=_CHALLENGE)


async def require_api_key(
    request: Request,
    settings: SettingsDep,
    api_key: Annotated[str | None, Security(_api_key_header)] = None,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)] = None,
) -> None:
    """Operations that change what is served always need a key, configured or not."""
    if not settings.api_keys:
        raise AuthError(
            "this operation requires an API key, and none is configured: set "
            "FORECASTER_SERVICE_API_KEYS",
            status_code=403,
        )
    await check_api_key(request, settings, api_key, bearer)
