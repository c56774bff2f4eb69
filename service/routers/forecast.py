"""`POST /v1/forecast`: online forecasts for a few series, micro-batched."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response

from forecaster.errors import ForecasterInputError, HorizonTooLongError, UnknownQuantileError
from service.deps import BatcherDep, ServedModelDep, SettingsDep
from service.errors import InferenceTimeoutError, LimitExceededError
from service.inference import OnlineItem, name_request_field, render_forecast, request_frames
from service.middleware import end_arrival
from service.model_manager import ServedModel
from service.schemas import ForecastRequest, ForecastResponse
from service.settings import ServiceSettings

router = APIRouter(prefix="/v1", tags=["forecast"])

ERROR_RESPONSES = {
    401: {"description": "API key missing or invalid (when keys are configured)"},
    413: {"description": "Request body over max_body_bytes"},
    422: {"description": "Bad input; the message names the field and the series"},
    503: {"description": "No model loaded; the message names the NAME@alias awaited"},
    504: {"description": "The forecast took longer than request_timeout_s"},
}


def resolve_horizon(served: ServedModel, horizon: int | None) -> int:
    max_horizon = served.forecaster.max_horizon
    if horizon is None:
        return max_horizon
    if not 1 <= horizon <= max_horizon:
        raise HorizonTooLongError(
            f"horizon: expected an integer between 1 and {max_horizon} (what model "
            f"{served.identity.name} version {served.identity.version} forecasts), got {horizon}",
            field="horizon",
        )
    return horizon


def resolve_quantiles(served: ServedModel, quantiles: list[float] | None) -> tuple[float, ...]:
    known = served.forecaster.quantiles
    if quantiles is None:
        return tuple(known)
    chosen = []
    for q in quantiles:
        match = next((k for k in known if abs(k - float(q)) < 1e-9), None)
        if match is None:
            raise UnknownQuantileError(
                f"quantiles: {q} is not one the model was trained for; expected a subset of "
                f"{list(known)}",
                field="quantiles",
            )
        chosen.append(match)
    return tuple(chosen)


def check_limits(body: ForecastRequest, settings: ServiceSettings) -> None:
    if len(body.series) > settings.max_series_per_request:
        raise LimitExceededError(
            f"series: {len(body.series)} series in one request, the limit is "
            f"{settings.max_series_per_request} (setting max_series_per_request); use a batch job",
            field="series",
        )
    for i, s in enumerate(body.series):
        if len(s.values) > settings.max_history_length:
            raise LimitExceededError(
                f"series {s.id!r} (series[{i}].values): {len(s.values)} history points, the "
                f"limit is {settings.max_history_length} (setting max_history_length); the "
                "model reads only the most recent ones, so send fewer",
                field=f"series[{i}].values",
                series_id=s.id,
            )


async def run_online(
    request: Request, batcher: BatcherDep, item: OnlineItem, timeout_s: float
) -> bytes:
    """Queue an item for the micro-batcher and wait for its encoded response."""
    end_arrival(request.scope, batcher)
    try:
        return await asyncio.wait_for(batcher.submit(item, item.n_series), timeout_s)
    except TimeoutError:
        raise InferenceTimeoutError(
            f"the forecast took longer than {timeout_s:g} s (setting request_timeout_s)"
        ) from None


@router.post(
    "/forecast",
    response_model=ForecastResponse,
    responses=ERROR_RESPONSES,
    summary="Forecast a few series from their recent history",
)
async def forecast(
    body: ForecastRequest,
    request: Request,
    served: ServedModelDep,
    batcher: BatcherDep,
    settings: SettingsDep,
) -> Response:
    check_limits(body, settings)
    horizon = resolve_horizon(served, body.horizon)
    quantiles = resolve_quantiles(served, body.quantiles)
    covariates = served.forecaster.model_config.covariates
    include_attention = body.include_attention
    item = OnlineItem(
        model=served,
        horizon=horizon,
        quantiles=quantiles,
        n_series=len(body.series),
        build=lambda: request_frames(body, covariates, horizon, served.forecaster.freq),
        render=lambda forecast: render_forecast(forecast, horizon, include_attention),
    )
    try:
        content = await run_online(request, batcher, item, settings.request_timeout_s)
    except ForecasterInputError as exc:
        name_request_field(exc, body)
        raise
    return Response(content, media_type="application/json")
