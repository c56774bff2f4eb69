"""Fuzz every operation from the app's own OpenAPI schema: whatever arrives, never a 5xx."""

from __future__ import annotations

import json

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck
from hypothesis import strategies as st
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


_VALUE = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1e6, max_value=1e6),
)


def test_no_server_errors_on_well_formed_requests_of_any_values(client):
    """The schema-driven cases above almost never form a series the model reads (a freq the
    model has, values as long as their timestamps), so they stop at validation: these do
    reach the model, with any values, lengths, horizons and quantiles, and never a 5xx."""
    statuses: list[int] = []

    @hypothesis.given(
        values=st.lists(_VALUE, max_size=300),
        series_id=st.text(max_size=12),
        horizon=st.one_of(st.none(), st.integers(-2, 40)),
        quantiles=st.one_of(st.none(), st.lists(st.floats(-0.5, 1.5), max_size=3)),
        n_series=st.integers(1, 3),
    )
    @hypothesis.settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(values, series_id, horizon, quantiles, n_series):
        series = [
            {"id": f"{series_id}{k}", "start": "2024-01-01T00:00:00", "freq": "h", "values": values}
            for k in range(n_series)
        ]
        body = {"series": series, "horizon": horizon, "quantiles": quantiles}
        body = {key: value for key, value in body.items() if value is not None}
        # json.dumps writes NaN and Infinity as JavaScript does; the service must refuse them
        # as any other bad value, not fail on them.
        response = client.post(
            "/v1/forecast", content=json.dumps(body), headers={"content-type": "application/json"}
        )
        assert response.status_code < 500, f"{response.status_code}: {response.text[:500]}"
        statuses.append(response.status_code)

    check()
    assert statuses.count(200) >= 10, statuses  # the model was reached, not only validation
