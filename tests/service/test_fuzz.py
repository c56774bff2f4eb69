"""Fuzz every operation from the app's own OpenAPI schema: whatever arrives, never a 5xx."""

from __future__ import annotations

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck
from schemathesis import GenerationMode

from service.app import create_app
from service.model_manager import StaticSource
from service.settings import ServiceSettings

# Schemathesis's own default: enough to find a 500 on a long request path within seconds.
MAX_EXAMPLES = 100


def _operations() -> list[str]:
    """`METHOD path` of every operation; the schema depends on neither model nor settings
    (model_construct: no validation, so collecting creates no data directory)."""
    spec = create_app(ServiceSettings.model_construct()).openapi()
    return [
        f"{method.upper()} {path}"
        for path, item in spec["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    ]


@pytest.fixture(scope="module")
def api_schema(fitted, identity, tmp_path_factory):
    settings = ServiceSettings(
        data_dir=tmp_path_factory.mktemp("fuzz"), poll_interval_s=3600, request_timeout_s=20
    )
    app = create_app(settings, model_source=StaticSource(fitted, identity))
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("operation", _operations())
def test_no_server_errors(api_schema, operation, mode):
    """Positive cases follow the schema (and still break series rules); negative ones break
    the schema itself."""
    method, path = operation.split(" ", 1)
    try:
        strategy = api_schema[path][method].as_strategy(generation_mode=mode)
    except Exception as exc:  # an operation with nothing to negate (no parameters, no body)
        pytest.skip(f"no {mode.value} cases for {operation}: {exc}")

    @hypothesis.given(case=strategy)
    @hypothesis.settings(
        max_examples=MAX_EXAMPLES if mode is GenerationMode.POSITIVE else MAX_EXAMPLES // 2,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case):
        response = case.call()
        assert response.status_code < 500, (
            f"{case.method} {case.formatted_path} -> {response.status_code}: "
            f"{response.text[:500]}\n{case.as_curl_command()}"
        )

    check()
