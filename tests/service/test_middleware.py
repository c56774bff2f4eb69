"""The ASGI middleware: body limits at their exact bound, the API key read from its headers,
the arrival count the micro-batcher waits on, and the JSON 500 for anything unexpected."""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import contextmanager

from service.batcher import MicroBatcher
from service.metrics import ServiceMetrics
from service.middleware import ArrivalMiddleware, end_arrival

API_KEY = "test-key-0123456789abcdef"


def _forecast_body(payload) -> bytes:
    return json.dumps({"series": [payload("series_000")]}).encode()


def test_a_body_of_exactly_the_limit_is_accepted_and_one_byte_more_is_not(make_client, payload):
    body = _forecast_body(payload)
    client = make_client(max_body_bytes=len(body))
    headers = {"content-type": "application/json"}
    assert client.post("/v1/forecast", content=body, headers=headers).status_code == 200
    over = client.post("/v1/forecast", content=body + b" ", headers=headers)
    assert over.status_code == 413 and "max_body_bytes" in over.json()["detail"]


def test_a_streamed_body_of_exactly_the_limit_is_accepted_and_one_byte_more_is_not(
    make_client, payload
):
    """Without a Content-Length the limit is applied to the bytes as they arrive."""
    body = _forecast_body(payload)
    client = make_client(max_body_bytes=len(body))
    headers = {"content-type": "application/json"}

    def streamed(content: bytes):
        for start in range(0, len(content), 512):
            yield content[start : start + 512]

    exact = client.post("/v1/forecast", content=streamed(body), headers=headers)
    assert exact.status_code == 200, exact.text
    over = client.post("/v1/forecast", content=streamed(body + b" "), headers=headers)
    assert over.status_code == 413 and "max_body_bytes" in over.json()["detail"]


def test_a_json_batch_job_body_is_held_to_the_body_limit_however_its_type_is_spelled(
    make_client,
):
    """Media types are case-insensitive and may carry parameters: `Application/JSON;
    charset=utf-8` is a JSON body naming a file, not an upload."""
    client = make_client(max_body_bytes=2048, max_upload_bytes=1 << 20)
    body = json.dumps({"path": "inputs/h.csv", "padding": "x" * 4096}).encode()
    for content_type in ("application/json; charset=utf-8", "Application/JSON"):
        response = client.post(
            "/v1/batch-jobs", content=body, headers={"content-type": content_type}
        )
        assert response.status_code == 413, (content_type, response.text)
        assert "max_body_bytes" in response.json()["detail"]


def test_a_body_refused_as_too_large_closes_the_connection(make_client):
    """The rest of the body is never read, so the connection cannot carry another request."""
    client = make_client(max_body_bytes=1024)
    response = client.post(
        "/v1/forecast", content=b" " * 4096, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert response.headers["connection"] == "close"
    assert response.json()["error"] == "payload_too_large"


def test_the_bearer_scheme_is_case_insensitive(make_client, payload):
    """Auth schemes are case-insensitive (RFC 9110); `bearer <key>` is a valid key."""
    client = make_client(api_keys=API_KEY)
    for scheme in ("bearer", "BEARER"):
        response = client.post(
            "/v1/forecast",
            content=_forecast_body(payload),
            headers={"content-type": "application/json", "Authorization": f"{scheme} {API_KEY}"},
        )
        assert response.status_code == 200, (scheme, response.text)


def test_a_key_under_another_scheme_counts_as_none_and_the_body_is_not_read(make_client):
    client = make_client(api_keys=API_KEY, max_body_bytes=1024)
    response = client.post(
        "/v1/forecast",
        content=b"x" * 4096,
        headers={"content-type": "application/json", "Authorization": f"Token {API_KEY}"},
    )
    assert response.status_code == 401, response.text  # not 413: the body was not looked at
    assert "missing API key" in response.json()["detail"]


def test_an_empty_api_key_header_leaves_the_bearer_token_to_be_checked(make_client, payload):
    """A proxy that forwards an empty X-API-Key must not hide the client's bearer token."""
    client = make_client(api_keys=API_KEY)
    response = client.post(
        "/v1/forecast",
        content=_forecast_body(payload),
        headers={
            "content-type": "application/json",
            "X-API-Key": "",
            "Authorization": f"Bearer {API_KEY}",
        },
    )
    assert response.status_code == 200, response.text


def test_a_lone_forecast_is_not_held_for_the_batching_window_even_after_a_refused_one(
    make_client, payload
):
    """The batcher waits only for requests on their way. A request that submitted, and one
    refused before it could (a body that is not JSON), are on their way no more: with a
    batching window longer than the timeout, waiting for either would be a 504."""
    client = make_client(max_batch_wait_ms=10_000, request_timeout_s=8)
    headers = {"content-type": "application/json"}
    assert client.post("/v1/forecast", content=_forecast_body(payload), headers=headers).is_success
    refused = client.post("/v1/forecast", content=b"{not json", headers=headers)
    assert refused.status_code == 422
    after = client.post("/v1/forecast", content=_forecast_body(payload), headers=headers)
    assert after.status_code == 200, after.text


@contextmanager
def _broken_model(client, fitted):
    """Serve a model whose forecast raises something no route expects."""

    class Broken(type(fitted)):
        def forecast(self, inputs):
            raise RuntimeError("boom")

    broken = Broken(fitted.model_config, fitted.train_config)
    broken.model, broken.freq = fitted.model, fitted.freq
    manager = client.app.state.manager
    served = manager.current
    manager.current = type(served)(broken, served.identity, served.loaded_at)
    try:
        yield
    finally:
        manager.current = served


def test_an_unexpected_error_on_invocations_is_in_mlflows_error_shape(client, fitted, history):
    """Clients of `mlflow models serve` read `error_code` and `message`."""
    one = history[history["unique_id"] == "series_000"]
    rows = [[r.unique_id, r.ds.isoformat(), r.y] for r in one.itertuples()]
    body = {"dataframe_split": {"columns": ["unique_id", "ds", "y"], "data": rows}}
    with _broken_model(client, fitted):
        response = client.post("/invocations", json=body)
    assert response.status_code == 500, response.text
    answer = response.json()
    assert answer["error_code"] == "INTERNAL_ERROR"
    assert answer["request_id"] in answer["message"]
    assert response.headers["x-request-id"] == answer["request_id"]


def test_an_unexpected_error_is_logged_once_with_its_traceback_under_its_request_id(
    client, fitted, payload, caplog
):
    """The request id a client quotes is how the operator finds the traceback."""
    caplog.set_level(logging.ERROR, logger="service.middleware")
    with _broken_model(client, fitted):
        response = client.post("/v1/forecast", json={"series": [payload("series_000")]})
    assert response.status_code == 500
    request_id = response.json()["request_id"]
    logged = [r for r in caplog.records if request_id in r.getMessage()]
    assert len(logged) == 1
    assert logged[0].levelno == logging.ERROR and logged[0].exc_info is not None
    assert "boom" in str(logged[0].exc_info[1]) or "boom" in caplog.text


# -- arrivals, through the middleware and a route as the service's are --------------------------
#
# A route reads its body, then ends its arrival and submits (as `service.online` does). Each
# request's body is held back until the test releases it, so the order of events is fixed.


class _Service:
    def __init__(self):
        self.batches: list[list[str]] = []
        self.batcher = MicroBatcher(
            self._process, max_batch_size=8, max_wait_s=60.0, metrics=ServiceMetrics()
        )
        self.app = ArrivalMiddleware(self._route, self.batcher)

    def _process(self, items):
        self.batches.append(list(items))
        return [item.upper() for item in items]

    async def _route(self, scope, receive, send):
        scope["state"]["reading"].set()
        message = await receive()
        if scope["path"] in ("/v1/forecast", "/invocations"):
            end_arrival(scope, self.batcher)
            scope["state"]["submitting"].set()
            answer = await self.batcher.submit(message["body"].decode(), 1)
        else:
            answer = "stored"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": answer.encode()})

    def request(self, path: str, body: str) -> tuple[asyncio.Task, dict]:
        """Start a request; its body arrives when `state["body"]` is set."""
        state = {
            "body": asyncio.Event(),
            "reading": asyncio.Event(),
            "submitting": asyncio.Event(),
        }
        scope = {"type": "http", "method": "POST", "path": path, "headers": [], "state": state}
        sent: list[dict] = []

        async def receive():
            await state["body"].wait()
            return {"type": "http.request", "body": body.encode(), "more_body": False}

        async def send(message):
            sent.append(message)

        async def run():
            await self.app(scope, receive, send)
            return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")

        return asyncio.ensure_future(run()), state

    async def collector_took_it(self, state: dict) -> None:
        """Until the request has submitted and the collector has taken it off the queue."""
        await state["submitting"].wait()
        while self.batcher.queue_depth:
            await asyncio.sleep(0)


def test_requests_arriving_together_share_a_batch_after_earlier_ones_were_answered():
    """The first request to submit is held for one whose body is still arriving. Each answered
    request must leave the count of arrivals where it found it, or later requests stop being
    waited for and every one runs alone."""

    async def main():
        service = _Service()
        service.batcher.start()
        for earlier in ("a", "b"):
            task, state = service.request("/v1/forecast", earlier)
            state["body"].set()
            assert await asyncio.wait_for(task, 10) == earlier.upper().encode()
        first, first_state = service.request("/v1/forecast", "c")
        second, second_state = service.request("/invocations", "d")
        first_state["body"].set()
        await service.collector_took_it(first_state)
        second_state["body"].set()
        answers = await asyncio.wait_for(asyncio.gather(first, second), 10)
        await service.batcher.stop()
        return answers, service.batches

    answers, batches = asyncio.run(main())
    assert answers == [b"C", b"D"]
    assert batches == [["a"], ["b"], ["c", "d"]]


def test_a_forecast_is_not_held_for_a_request_to_another_route():
    """Only forecast routes submit to the batcher: an upload still arriving is no reason to
    wait (here, the whole minute of the batching window)."""

    async def main():
        service = _Service()
        service.batcher.start()
        upload, upload_state = service.request("/v1/batch-jobs", "csv")
        await upload_state["reading"].wait()
        forecast, forecast_state = service.request("/v1/forecast", "x")
        forecast_state["body"].set()
        answer = await asyncio.wait_for(forecast, 10)
        upload_state["body"].set()
        stored = await asyncio.wait_for(upload, 10)
        await service.batcher.stop()
        return answer, stored, service.batches

    assert asyncio.run(main()) == (b"X", b"stored", [["x"]])
