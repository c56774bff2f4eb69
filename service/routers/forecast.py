"""`POST /v1/forecast`: online forecasts for a few series, micro-batched."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from forecaster.errors import ForecasterInputError
from service import rules
from service.deps import BatcherDep, OnServedDep, ServedModelDep, SettingsDep
from service.errors import UnsupportedMediaTypeError
from service.inference import OnlineItem, name_request_field, render_forecast, request_frames
from service.online import run_online
from service.schemas import ForecastRequest, ForecastResponse

router = APIRouter(prefix="/v1", tags=["forecast"])

ERROR_RESPONSES = {
    401: {"description": "API key missing or invalid (when keys are configured)"},
    413: {"description": "Request body over max_body_bytes"},
    415: {"description": "A body that is not JSON, sent under a type that is not JSON"},
    422: {"description": "Bad input; the message names the field and the series"},
    503: {"description": "No model loaded; the message names the NAME@alias awaited"},
    504: {"description": "The forecast took longer than request_timeout_s"},
}


async def read_forecast_request(request: Request) -> ForecastRequest:
    """The body, parsed and validated in one pass by pydantic's JSON parser.

    FastAPI's own body handling decodes the JSON to Python objects and then validates them,
    which costs three times as much on a request of a few hundred points. Errors are FastAPI's
    422 all the same.
    """
    raw = await request.body()
    try:
        return ForecastRequest.model_validate_json(raw)
    except ValidationError as exc:
        # JSON sent under another type (`curl -d` sends a form's) is read all the same; a body
        # that is not JSON either is refused on its type, not as JSON it never claimed to be.
        content_type = request.headers.get("content-type", "")
        media_type = content_type.partition(";")[0].strip().lower()
        is_json_type = media_type in ("", "application/json") or media_type.endswith("+json")
        if not is_json_type and any(e["type"] == "json_invalid" for e in exc.errors()):
            raise UnsupportedMediaTypeError(
                f"content-type {content_type!r}: the body is not JSON; send the request as "
                "application/json",
                field="content-type",
            ) from None
        try:
            decoded = json.loads(raw)  # for the handler to name the series of an error
        except (ValueError, RecursionError):  # nested deeper than Python's stack allows
            decoded = None
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors, body=decoded) from None


# Documented as FastAPI documents a declared body (the schema is added in service.app).
_BODY_SCHEMA = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/ForecastRequest"}}
        },
    }
}


@router.post(
    "/forecast",
    response_model=ForecastResponse,
    responses=ERROR_RESPONSES,
    summary="Forecast a few series from their recent history",
    openapi_extra=_BODY_SCHEMA,
)
async def forecast(
    body: Annotated[ForecastRequest, Depends(read_forecast_request)],
    request: Request,
    served: ServedModelDep,
    batcher: BatcherDep,
    settings: SettingsDep,
    on_served: OnServedDep,
) -> Response:
    series = body.series
    rules.check_limits(
        [s.id for s in series],
        [len(s.values) for s in series],
        settings,
        attention=body.include_attention,
    )
    horizon, quantiles = rules.resolve(served, body.horizon, body.quantiles)
    forecaster = served.forecaster
    covariates = forecaster.model_config.covariates
    size = settings.max_batch_size
    chunks = [
        OnlineItem(
            model=served,
            horizon=horizon,
            quantiles=quantiles,
            n_series=len(series[first : first + size]),
            build=lambda first=first: request_frames(
                series[first : first + size],
                covariates,
                horizon,
                forecaster.freq,
                forecaster.wall_clock,
                first,
                max_horizon=forecaster.max_horizon,
            ),
        )
        for first in range(0, len(series), size)
    ]
    include_attention = body.include_attention
    try:
        content = await run_online(
            request,
            batcher,
            chunks,
            lambda forecast: render_forecast(forecast, horizon, include_attention),
            settings.request_timeout_s,
            on_served,
        )
    except ForecasterInputError as exc:
        name_request_field(exc, body)
        raise
    return Response(content, media_type="application/json")
