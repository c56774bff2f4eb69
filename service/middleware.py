"""ASGI middleware: request body limits, the arrival count the micro-batcher reads, and the
JSON 500 for anything unexpected."""

from __future__ import annotations

import json
import logging
import uuid

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.batcher import MicroBatcher
from service.deps import OPEN_PATHS, verify_key
from service.errors import AuthError, error_body, respond
from service.settings import ServiceSettings

logger = logging.getLogger(__name__)

UPLOAD_PATHS = ("/v1/batch-jobs",)
BATCHED_PATHS = ("/v1/forecast", "/invocations")


class BodyTooLarge(HTTPException):
    """Raised from `receive` once a streamed body passes the limit. An HTTPException, so the
    app's handler answers 413 even where FastAPI wraps errors raised while reading a body."""

    def __init__(self, limit: int, what: str, setting: str):
        super().__init__(413, f"{what} exceeds the limit of {limit} bytes (setting {setting})")


class BodyLimitMiddleware:
    """413 for bodies over the limit: at once when Content-Length says so, else as soon as
    the streamed body passes it. Uploads to /v1/batch-jobs have their own, larger limit; a JSON
    body there names a file on the server and is held to the body limit."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, max_upload_bytes: int):
        self.app = app
        self.max_body = max_body_bytes
        self.max_upload = max_upload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        content_type = dict(scope.get("headers", ())).get(b"content-type", b"")
        json_body = content_type.split(b";")[0].strip().lower() == b"application/json"
        upload = scope["path"].startswith(UPLOAD_PATHS) and scope["method"] == "POST"
        upload = upload and not json_body
        limit = self.max_upload if upload else self.max_body
        what = "upload" if upload else "request body"
        setting = "max_upload_bytes" if upload else "max_body_bytes"
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > limit:
                    await _reject(send, limit, what, setting)
                    return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit, what, setting)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if started:
                raise
            await _reject(send, limit, what, setting)


async def _reject(send: Send, limit: int, what: str, setting: str) -> None:
    body = json.dumps(
        {
            "detail": f"{what} exceeds the limit of {limit} bytes (setting {setting})",
            "error": "payload_too_large",
            "field": "body",
            "series_id": None,
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class ArrivalMiddleware:
    """Tells the micro-batcher that a forecast request has arrived and will submit soon;
    the route marks it submitted. Lets the batcher wait only when there is someone to wait for."""

    def __init__(self, app: ASGIApp, batcher: MicroBatcher):
        self.app = app
        self.batcher = batcher

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in BATCHED_PATHS:
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state["arrival_open"] = True
        self.batcher.arrival_started()
        try:
            await self.app(scope, receive, send)
        finally:
            if state.get("arrival_open"):
                state["arrival_open"] = False
                self.batcher.arrival_ended()


def end_arrival(scope: Scope, batcher: MicroBatcher) -> None:
    """Called by a route right before it submits (or gives up)."""
    state = scope.get("state", {})
    if state.get("arrival_open"):
        state["arrival_open"] = False
        batcher.arrival_ended()


class UnexpectedErrorMiddleware:
    """Anything a route did not expect becomes a JSON 500 carrying a request id, logged once
    with its traceback under that id; the exception stops here, so the server keeps the
    connection open. (Responses already started cannot be replaced and re-raise.)"""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            if started:
                raise
            request_id = uuid.uuid4().hex
            logger.exception(
                "unexpected error in %s %s (request id %s)",
                scope.get("method"),
                scope.get("path"),
                request_id,
            )
            message = f"internal error; quote request id {request_id} to the operator"
            body = {"detail": message, "error": "internal_error", "field": None, "series_id": None}
            if scope.get("path") == "/invocations":
                body = {"error_code": "INTERNAL_ERROR", "message": message, **body}
            body["request_id"] = request_id
            content = json.dumps(body).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(content)).encode()),
                        (b"x-request-id", request_id.encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": content})


class ApiKeyMiddleware:
    """With API keys configured, a request without a valid one is answered 401 before its
    body is read (FastAPI reads and decodes a body before it runs any dependency, so a 16 MB
    body would otherwise be parsed for nothing). The probes stay open."""

    def __init__(self, app: ASGIApp, settings: ServiceSettings):
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.settings.api_keys and scope["path"] not in OPEN_PATHS:
            headers = {
                k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
            }
            presented = headers.get("x-api-key") or None
            scheme, _, token = headers.get("authorization", "").partition(" ")
            if presented is None and scheme.lower() == "bearer" and token.strip():
                presented = token.strip()
            try:
                verify_key(presented, self.settings)
            except AuthError as exc:
                body = error_body(exc.message, exc.kind, exc.field)
                response = respond(Request(scope), exc.status_code, body, exc.headers)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
