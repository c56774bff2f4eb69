"""The OpenAPI schema and its documentation pages.

FastAPI's built-in `/openapi.json`, `/docs` and `/redoc` are plain routes that skip the app's
dependencies, so with API keys set they would stay open; declared here, they need a key like
every other route.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

SCHEMA_PATH = "/openapi.json"

router = APIRouter(include_in_schema=False)


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
