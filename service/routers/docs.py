"""The OpenAPI schema and its documentation pages.

FastAPI's built-in `/openapi.json`, `/docs` and `/redoc` are plain routes that skip the app's
dependencies, so with API keys set they would stay open; declared here, they need a key like
every other route.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel

from service.schemas import ErrorResponse

SCHEMA_PATH = "/openapi.json"
# MLflow's scoring routes, whose errors are MLflow's (`error_code`, `message`).
MLFLOW_PATHS = ("/invocations", "/ping", "/health", "/version")

router = APIRouter(include_in_schema=False)


def with_request_models(
    app: FastAPI, models: Sequence[type[BaseModel]]
) -> Callable[[], dict[str, Any]]:
    """`app.openapi` with the schemas of request bodies that routes parse themselves (in one
    pass from JSON) and reference as `#/components/schemas/<Model>`, and with every error of
    the service's own routes documented as the body it is (`ErrorResponse`), not as FastAPI's
    default validation error."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()  # caches itself in app.openapi_schema
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in (*models, ErrorResponse):
                definition = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(definition.pop("$defs", {}))
                components[model.__name__] = definition
            _document_errors(schema)
            for default in ("HTTPValidationError", "ValidationError"):
                components.pop(default, None)
        return app.openapi_schema

    return openapi


def _document_errors(schema: dict[str, Any]) -> None:
    """Point each error response of the service's own routes at `ErrorResponse`."""
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
    for path, operations in schema.get("paths", {}).items():
        if path in MLFLOW_PATHS:
            continue
        for operation in operations.values():
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                default = "HTTPValidationError" in str(content)
                if status.isdigit() and int(status) >= 400 and (not content or default):
                    response["content"] = body
                    if default:
                        response["description"] = "Bad input; the message names the field"


def _schema_url(request: Request) -> str:
    return request.scope.get("root_path", "").rstrip("/") + SCHEMA_PATH


@router.get(SCHEMA_PATH)
async def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url=_schema_url(request), title="forecaster - Swagger UI")


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url=_schema_url(request), title="forecaster - ReDoc")
