"""API keys, configured limits (each a clear 4xx) and the request timeout (504)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

API_KEY = "test-key-0123456789abcdef"


def test_keys_required_on_every_route_when_configured(make_client, payload):
    client = make_client(api_keys=API_KEY)
    body = {"series": [payload("series_000")]}
    for method, path, kwargs in [
        ("post", "/v1/forecast", {"json": body}),
        ("get", "/v1/models", {}),
        ("get", "/v1/batch-jobs", {}),
        ("post", "/invocations", {"json": {"dataframe_records": []}}),
        ("get", "/metrics", {}),
        ("get", "/version", {}),
        ("get", "/openapi.json", {}),
        ("get", "/docs", {}),
        ("get", "/redoc", {}),
    ]:
        response = getattr(client, method)(path, **kwargs)
        assert response.status_code == 401, (path, response.text)
        assert "API key" in response.json().get("detail", response.text)
    schema = client.get("/openapi.json", headers={"X-API-Key": API_KEY})
    assert schema.status_code == 200 and "/v1/forecast" in schema.json()["paths"]
    docs = client.get("/docs", headers={"X-API-Key": API_KEY})
    assert docs.status_code == 200 and "/openapi.json" in docs.text
    wrong = client.post("/v1/forecast", json=body, headers={"X-API-Key": "x" * 24})
    assert wrong.status_code == 401 and "invalid" in wrong.json()["detail"]
    ok = client.post("/v1/forecast", json=body, headers={"X-API-Key": API_KEY})
    assert ok.status_code == 200
    bearer = client.post("/v1/forecast", json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert bearer.status_code == 200


def test_probes_are_open_when_keys_are_configured(make_client):
    """Orchestrators probe without credentials: liveness and readiness answer anyway."""
    client = make_client(api_keys=API_KEY)
    alive = client.get("/healthz")
    assert alive.status_code == 200 and alive.json()["status"] == "ok"
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    assert ready.json()["model"] is None  # open, so it says nothing about what is served
    assert client.get("/ping").status_code == 200
    assert client.get("/health").status_code == 200


def test_the_key_is_checked_before_the_body_is_read(make_client):
    client = make_client(api_keys=API_KEY, max_body_bytes=1024)
    # Neither malformed nor oversized bodies are looked at without a key: 401, not 422/413.
    for content in (b"{not json", b"x" * 4096):
        for path in ("/v1/forecast", "/invocations", "/v1/batch-jobs"):
            response = client.post(
                path, content=content, headers={"content-type": "application/json"}
            )
            assert response.status_code == 401, (path, response.text)
            assert response.headers["www-authenticate"].startswith("Bearer")
    invocations = client.post(
        "/invocations", content=b"{}", headers={"content-type": "application/json"}
    )
    assert invocations.status_code == 401  # in MLflow's error shape on its route
    assert "missing API key" in invocations.json()["message"]
    with_key = client.post(
        "/v1/forecast",
        content=b"{not json",
        headers={"content-type": "application/json", "X-API-Key": API_KEY},
    )
    assert with_key.status_code == 422


def test_reload_always_needs_a_key(make_client):
    open_client = make_client()
    response = open_client.post("/v1/models/reload")
    assert response.status_code == 403
    assert "API_KEYS" in response.json()["detail"]
    keyed = make_client(api_keys=f"{API_KEY},another-key-abcdefghijkl")
    assert keyed.post("/v1/models/reload").status_code == 401
    response = keyed.post("/v1/models/reload", headers={"X-API-Key": "another-key-abcdefghijkl"})
    assert response.status_code == 200, response.text
    assert response.json()["outcome"] == "unchanged"


def test_body_size_limit(make_client, payload):
    client = make_client(max_body_bytes=2048)
    response = client.post("/v1/forecast", json={"series": [payload("series_000", 96)]})
    assert response.status_code == 413
    assert "max_body_bytes" in response.json()["detail"]


def test_streamed_body_over_the_limit(make_client):
    client = make_client(max_body_bytes=2048)

    def chunks():
        for _ in range(10):
            yield b" " * 1024

    response = client.post(
        "/v1/forecast", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert "max_body_bytes" in response.json()["detail"]


def test_upload_size_limit(make_client, history):
    client = make_client(max_upload_bytes=4096)
    response = client.post(
        "/v1/batch-jobs",
        content=history.to_csv(index=False).encode(),
        headers={"content-type": "text/csv"},
    )
    assert response.status_code == 413
    assert "max_upload_bytes" in response.json()["detail"]


def test_a_json_batch_job_body_is_held_to_the_body_limit(make_client):
    """A JSON body names a file on the server: a few hundred bytes, not an upload. It was held
    to the 4 GiB upload limit, and read whole."""
    client = make_client(max_body_bytes=2048, max_upload_bytes=1 << 20)
    body = {"path": "inputs/h.csv", "padding": "x" * 4096}
    response = client.post("/v1/batch-jobs", json=body)
    assert response.status_code == 413, response.text
    assert "max_body_bytes" in response.json()["detail"]


def test_series_and_history_limits(make_client, payload):
    client = make_client(max_series_per_request=2, max_history_length=60)
    three = {"series": [payload(f"series_00{i}") for i in range(3)]}
    response = client.post("/v1/forecast", json=three)
    assert response.status_code == 422
    assert response.json()["field"] == "series"
    assert "max_series_per_request" in response.json()["detail"]
    long = {"series": [payload("series_000"), payload("series_001", 90)]}
    response = client.post("/v1/forecast", json=long)
    assert response.status_code == 422
    assert response.json()["field"] == "series[1].values"
    assert response.json()["series_id"] == "series_001"
    # Each limit is the last value served.
    at_limits = {"series": [payload("series_000", 60), payload("series_001", 60)]}
    response = client.post("/v1/forecast", json=at_limits)
    assert response.status_code == 200, response.text
    response = client.post("/v1/forecast", json={"series": [payload("series_000", 61)]})
    assert response.status_code == 422
    assert response.json()["field"] == "series[0].values"


def test_timeout_is_504_and_its_forecast_is_not_logged(make_client, payload, monkeypatch, tmp_path):
    """The batch in flight still finishes after the 504, but its forecast was never served:
    monitoring must not score it as one (2,800 rows of a 1,000-series request were logged)."""
    from pipelines.forecast_log import read_log

    client = make_client(request_timeout_s=0.2, forecast_log_flush_s=3600)
    batcher = client.app.state.batcher
    original = batcher.process

    def slow(items):
        time.sleep(0.6)
        return original(items)

    monkeypatch.setattr(batcher, "process", slow)
    response = client.post("/v1/forecast", json={"series": [payload("series_000")]})
    assert response.status_code == 504
    assert "request_timeout_s" in response.json()["detail"]
    time.sleep(1.0)  # the slow batch finishes; its result is dropped
    monkeypatch.setattr(batcher, "process", original)
    assert client.post("/v1/forecast", json={"series": [payload("series_001")]}).status_code == 200
    client.__exit__(None, None, None)  # shutdown flushes the log
    log = read_log(tmp_path / "data" / "forecast_log")
    assert log["unique_id"].unique().tolist() == ["series_001"]


def test_invocations_count_reading_the_frame_against_the_timeout(make_client, history, monkeypatch):
    """/v1/forecast reads its series into columns inside the timed part; /invocations read
    its frame before the clock started, and answered 200 long after request_timeout_s."""
    from service.routers import scoring

    client = make_client(request_timeout_s=0.2)
    original = scoring.fast_split_parts

    def slow(decoded):
        time.sleep(0.6)
        return original(decoded)

    monkeypatch.setattr(scoring, "fast_split_parts", slow)
    frame = history[history["unique_id"] == "series_000"]
    split = {
        "columns": ["unique_id", "ds", "y"],
        "data": [[u, t.isoformat(), y] for u, t, y in frame[["unique_id", "ds", "y"]].values],
    }
    response = client.post("/invocations", json={"dataframe_split": split})
    assert response.status_code == 504, response.text
    assert "request_timeout_s" in response.json()["detail"]


@pytest.mark.parametrize(
    ("setting", "value", "needle"),
    [
        ("port", 70000, "less than or equal"),
        ("api_keys", "short", "16 characters"),
        ("model_uri", "forecaster@champion", "models:/NAME@alias"),
        ("device", "quantum", "expected auto, cpu, cuda, cuda:N or mps"),
        ("device", "mps", "MPS is not available here"),  # once refused every version instead
        ("max_batch_size", 0, "greater than or equal"),
        ("log_level", "loud", "expected one of"),
        ("request_timeout_s", float("inf"), "finite number"),  # once crashed the CLI
        ("host", " ", "an address to listen on"),
        ("forecast_log_dir", "/proc/forecast_log", "forecast_log_dir: cannot create"),
        # Accepted, and the service then waited for ever for a registry it could not open.
        ("tracking_uri", "bogus://x", "expected a path or a URI of an MLflow store"),
    ],
)
def test_settings_fail_fast(tmp_path, setting, value, needle):
    from pydantic import ValidationError

    from service.settings import ServiceSettings

    with pytest.raises(ValidationError, match=needle):
        ServiceSettings(data_dir=tmp_path, **{setting: value})


# (setting, values accepted, values refused): each range at its bounds.
SETTING_BOUNDS = [
    ("port", [0, 65535], [-1, 65536]),
    ("workers", [1, 64], [0, 65]),
    ("torch_threads", [None, 1, 256], [0, 257]),
    ("poll_interval_s", [0.001], [0.0]),
    ("max_batch_size", [1], [0]),
    ("max_batch_wait_ms", [0.0, 10_000.0], [-0.001, 10_000.001]),
    ("request_timeout_s", [0.001], [0.0, float("nan")]),
    ("max_body_bytes", [1024], [1023]),
    ("max_series_per_request", [1], [0]),
    ("max_history_length", [1], [0]),
    ("max_upload_bytes", [1024], [1023]),
    ("max_attention_series", [1], [0]),
    ("batch_workers", [1, 64], [0, 65]),
    ("batch_chunk_series", [1], [0]),
    ("batch_partition_bytes", [1024], [1023]),
    ("job_lease_s", [0.001], [0.0]),
    ("job_ttl_hours", [None, "none", " None ", 0.001], [0.0, float("inf")]),
    ("forecast_log_flush_s", [0.001], [0.0]),
    ("forecast_log_retention_days", [0.001], [0.0]),
    ("api_keys", ["k" * 16, "k" * 16 + "," + "j" * 20], ["k" * 15, "k" * 16 + ",short"]),
]


@pytest.mark.parametrize(("setting", "accepted", "refused"), SETTING_BOUNDS)
def test_each_settings_range_holds_its_bounds(tmp_path, setting, accepted, refused):
    from pydantic import ValidationError

    from service.settings import ServiceSettings

    for value in accepted:
        ServiceSettings(data_dir=tmp_path, **{setting: value})
    for value in refused:
        with pytest.raises(ValidationError, match=f"\\n{setting}\\n"):
            ServiceSettings(data_dir=tmp_path, **{setting: value})


def test_directories_are_created_with_their_parents(tmp_path):
    """A fresh volume: data_dir and the directories under it do not exist yet."""
    from service.settings import ServiceSettings

    settings = ServiceSettings(data_dir=tmp_path / "fresh" / "service")
    for path in (settings.data_dir, settings.input_dir, settings.forecast_log_dir):
        assert Path(path).is_dir()


def test_an_empty_environment_variable_means_the_default(tmp_path, monkeypatch):
    """docker-compose passes `${VAR:-}` as an empty value: an empty host once listened on
    every interface."""
    from service.settings import ServiceSettings

    monkeypatch.setenv("FORECASTER_SERVICE_HOST", "")
    monkeypatch.setenv("FORECASTER_SERVICE_REQUEST_TIMEOUT_S", "")
    settings = ServiceSettings(data_dir=tmp_path)
    assert (settings.host, settings.request_timeout_s) == ("127.0.0.1", 30.0)


def test_job_retention_can_be_switched_off_from_the_environment(tmp_path, monkeypatch):
    """job_ttl_hours None keeps finished jobs, but no variable could say None."""
    from service.settings import ServiceSettings

    monkeypatch.setenv("FORECASTER_SERVICE_JOB_TTL_HOURS", "none")
    assert ServiceSettings(data_dir=tmp_path).job_ttl_hours is None


def test_a_bad_shared_device_variable_is_named_as_set(tmp_path, monkeypatch, capsys):
    """FORECASTER_DEVICE=bogus was reported as FORECASTER_SERVICE_DEVICE, a variable the
    operator never set."""
    from service.cli import main

    monkeypatch.setenv("FORECASTER_DEVICE", "bogus")
    monkeypatch.setenv("FORECASTER_SERVICE_DATA_DIR", str(tmp_path))
    with pytest.raises(SystemExit) as exit_info:
        main(["serve"])
    assert exit_info.value.code == 2
    assert "invalid setting FORECASTER_DEVICE:" in capsys.readouterr().err


def test_settings_from_environment(tmp_path, monkeypatch):
    from service.settings import ServiceSettings

    monkeypatch.setenv("FORECASTER_SERVICE_API_KEYS", f"{API_KEY}, second-key-0123456789")
    monkeypatch.setenv("FORECASTER_SERVICE_MODEL_URI", "models:/demand@staging")
    settings = ServiceSettings(data_dir=tmp_path)
    assert [k.get_secret_value() for k in settings.api_keys] == [API_KEY, "second-key-0123456789"]
    assert settings.model_label == "demand@staging"
    assert API_KEY not in repr(settings)


def test_a_misspelled_environment_variable_is_refused_naming_it(tmp_path, monkeypatch):
    """Settings ignore variables that name no setting: FORECASTER_SERVICE_API_KEY (one letter
    short) left the service open to every caller, silently."""
    from pydantic import ValidationError

    from service.settings import ServiceSettings

    monkeypatch.setenv("FORECASTER_SERVICE_API_KEY", API_KEY)
    with pytest.raises(
        ValidationError, match="FORECASTER_SERVICE_API_KEY.*FORECASTER_SERVICE_API_KEYS"
    ):
        ServiceSettings(data_dir=tmp_path)
