"""Errors the service answers with, and the exception handlers that turn them into responses.

Every error body has the same shape: `detail` (a sentence naming the field and, where there is
one, the series), `error` (a machine-readable kind), `field` and `series_id`. `/invocations`
answers in MLflow's scoring-server shape instead (`error_code`, `message`), so clients of
`mlflow models serve` keep working.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from forecaster.errors import ForecasterInputError
from service.schemas import UNION_TAGS

logger = logging.getLogger(__name__)

MLFLOW_PATHS = ("/invocations",)


class ServiceError(Exception):
    """A request the service refuses; `status_code` is the HTTP status it answers with."""

    status_code = 400
    kind = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        series_id: str | None = None,
        status_code: int | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.field = field
        self.series_id = series_id
        self.headers = headers
        if status_code is not None:
            self.status_code = status_code


class LimitExceededError(ServiceError):
    """A configured limit (series per request, history length, sizes) was exceeded."""

    status_code = 422
    kind = "limit_exceeded"


class PayloadTooLargeError(ServiceError):
    status_code = 413
    kind = "payload_too_large"


class UnsupportedMediaTypeError(ServiceError):
    status_code = 415
    kind = "unsupported_media_type"


class InvalidInputError(ServiceError):
    """Input the service itself rejects before the core sees it (a malformed file, a path)."""

    status_code = 422
    kind = "invalid_input"


class NotFoundError(ServiceError):
    status_code = 404
    kind = "not_found"


class ConflictError(ServiceError):
    status_code = 409
    kind = "conflict"


class ModelUnavailableError(ServiceError):
    """No model is loaded: the registry has none under the configured alias, or it failed."""

    status_code = 503
    kind = "model_unavailable"


class InferenceTimeoutError(ServiceError):
    status_code = 504
    kind = "timeout"


class AuthError(ServiceError):
    status_code = 401
    kind = "unauthorized"


def error_body(
    message: str, kind: str, field: str | None = None, series_id: str | None = None, **extra: Any
) -> dict[str, Any]:
    return {"detail": message, "error": kind, "field": field, "series_id": series_id, **extra}


class SafeJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: a lone surrogate a client sent (in an id, a field name)
    is echoed as its escape instead of failing to encode as UTF-8."""

    def render(self, content: Any) -> bytes:
        return json.dumps(
            content, ensure_ascii=True, allow_nan=False, separators=(",", ":")
        ).encode()


def respond(
    request: Request,
    status: int,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """The error response for `request`: ours, or MLflow's shape on its scoring routes."""
    if request.url.path in MLFLOW_PATHS:
        # MLflow's scoring server answers input problems with 400 BAD_REQUEST.
        code = "BAD_REQUEST" if status < 500 else "INTERNAL_ERROR"
        mlflow_status = 400 if status == 422 else status
        return SafeJSONResponse(
            {"error_code": code, "message": body["detail"], **body},
            status_code=mlflow_status,
            headers=headers,
        )
    return SafeJSONResponse(body, status_code=status, headers=headers)


def describe_input_error(exc: ForecasterInputError) -> str:
    """The core's message, prefixed with the series when the message does not name it."""
    message = exc.message
    if exc.series_id is not None and repr(str(exc.series_id)) not in message:
        message = f"series {str(exc.series_id)!r}: {message}"
    return message


async def _forecaster_input_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ForecasterInputError)
    field = getattr(exc, "request_field", None) or exc.field
    body = error_body(describe_input_error(exc), type(exc).__name__, field, exc.series_id)
    return respond(request, 422, body)


async def _service_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    if exc.status_code >= 500:
        logger.warning("%s %s -> %d: %s", request.method, request.url.path, exc.status_code, exc)
    body = error_body(exc.message, exc.kind, exc.field, exc.series_id)
    return respond(request, exc.status_code, body, exc.headers)


def _series_id_at(body: Any, index: int) -> str | None:
    try:
        value = body["series"][index]["id"]
    except (KeyError, IndexError, TypeError):
        return None
    return str(value) if isinstance(value, str | int) else None


def _loc_to_field(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if item in UNION_TAGS:  # which kind of time a value was read as: no field of its own
            continue
        if isinstance(item, int) and parts:
            parts[-1] = f"{parts[-1]}[{item}]"
        else:
            parts.append(str(item))
    return ".".join(parts)


async def _request_validation_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422 for schema errors, with each message naming its field and series."""
    assert isinstance(exc, RequestValidationError)
    errors = []
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        if loc and loc[0] in ("body", "query", "path", "header", "form"):
            loc = loc[1:]
        series_id = None
        if len(loc) >= 2 and loc[0] == "series" and isinstance(loc[1], int):
            series_id = _series_id_at(exc.body, loc[1])
        field = _loc_to_field(loc) or "body"
        message = str(err.get("msg", "invalid value"))
        where = f"{field} (series {series_id!r})" if series_id is not None else field
        errors.append(
            {
                "field": field,
                "series_id": series_id,
                "message": f"{where}: {message}",
                "type": err.get("type"),
            }
        )
    first = errors[0] if errors else {"field": "body", "series_id": None, "message": "invalid"}
    detail = "; ".join(e["message"] for e in errors[:5])
    if len(errors) > 5:
        detail += f"; and {len(errors) - 5} more"
    body = error_body(detail, "validation_error", first["field"], first["series_id"])
    body["errors"] = errors
    return respond(request, 422, body)


async def _http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    kinds = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
    body = error_body(str(exc.detail), kinds.get(exc.status_code, "http_error"))
    return respond(request, exc.status_code, body, getattr(exc, "headers", None))


def install_error_handlers(app: FastAPI) -> None:
    """One handler per error family, so routes raise and never format errors themselves."""
    app.add_exception_handler(ForecasterInputError, _forecaster_input_error)
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _request_validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_exception)
