"""Which model is served: a real SQLite-backed registry, the alias followed, bad versions refused."""

from __future__ import annotations

import copy
import gc
import json
import time

import pytest
import torch

from forecaster import Forecaster
from service.model_manager import ModelIdentity, smoke_test
from tests.saved_models import reseal

API_KEY = "test-key-0123456789abcdef"
KEY = {"X-API-Key": API_KEY}


def _wait(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_no_model_then_champion_appears_then_alias_moves(
    make_client, registry, fitted, training_frame, payload
):
    client = make_client(source="registry", tracking_uri=registry.tracking_uri, api_keys=API_KEY)
    ready = client.get("/readyz", headers=KEY)
    assert ready.status_code == 503
    assert "waiting for forecaster@champion in the model registry" in ready.json()["detail"]
    response = client.post("/v1/forecast", json={"series": [payload("series_000")]}, headers=KEY)
    assert response.status_code == 503
    assert "forecaster@champion" in response.json()["detail"]
    assert response.headers["retry-after"]
    assert client.get("/ping", headers=KEY).status_code == 404
    models = client.get("/v1/models", headers=KEY).json()
    assert models["ready"] is False and "not found" in models["last_check_error"]
    missing = client.post("/v1/models/reload", headers=KEY).json()
    assert missing["outcome"] == "unavailable" and "not found" in missing["message"]
    assert _registry_errors(client, KEY) >= 2  # the startup check's and the reload's

    v1 = registry.register(fitted, training_frame)
    reload = client.post("/v1/models/reload", headers=KEY)
    assert reload.status_code == 200, reload.text
    assert reload.json()["outcome"] == "loaded"
    assert client.get("/readyz", headers=KEY).status_code == 200
    out = client.post("/v1/forecast", json={"series": [payload("series_000")]}, headers=KEY)
    assert out.status_code == 200
    assert out.json()["model"]["version"] == v1
    loaded = client.get("/v1/models", headers=KEY).json()["loaded"]
    assert loaded["version"] == v1 and loaded["alias"] == "champion"
    assert loaded["run_id"] and loaded["context_length"] == fitted.model_config.context_length

    # A second version registered as challenger changes nothing until champion moves to it.
    v2 = registry.register(fitted, training_frame, alias="challenger")
    assert client.post("/v1/models/reload", headers=KEY).json()["outcome"] == "unchanged"
    registry.move_alias(v2)
    assert client.post("/v1/models/reload", headers=KEY).json()["outcome"] == "loaded"
    out = client.post("/v1/forecast", json={"series": [payload("series_000")]}, headers=KEY)
    assert out.json()["model"]["version"] == v2
    metrics = client.get("/metrics", headers=KEY).text
    assert f"forecaster_model_version {float(v2)}" in metrics
    assert 'forecaster_model_loads_total{outcome="loaded"} 2.0' in metrics


def _registry_errors(client, headers=None) -> float:
    metrics = client.get("/metrics", headers=headers).text
    line = next(x for x in metrics.splitlines() if x.startswith("forecaster_registry_errors_total"))
    return float(line.split()[-1])


class Versions:
    """A model source whose alias the test moves; version '2' cannot forecast."""

    label = "forecaster@champion"
    uri = "models:/forecaster@champion"

    def __init__(self, good: Forecaster):
        self.version = "1"
        self.models = {"1": good, "2": Forecaster(good.model_config, good.train_config)}

    def resolve(self) -> ModelIdentity:
        return ModelIdentity(name="forecaster", version=self.version, alias="champion")

    def load(self, identity: ModelIdentity) -> Forecaster:
        return self.models[identity.version]


def test_a_version_that_cannot_forecast_is_refused_and_the_current_keeps_serving(
    make_client, fitted, payload, caplog
):
    source = Versions(fitted)
    client = make_client(source=source, poll_interval_s=0.2)
    assert client.get("/v1/models").json()["loaded"]["version"] == "1"
    source.version = "2"  # the alias moves to a broken version
    assert _wait(lambda: client.get("/v1/models").json()["refused"])
    state = client.get("/v1/models").json()
    assert state["loaded"]["version"] == "1"
    assert state["refused"][0]["version"] == "2"
    assert "not fitted" in state["refused"][0]["error"]
    assert any("refused forecaster version 2" in r.getMessage() for r in caplog.records)
    out = client.post("/v1/forecast", json={"series": [payload("series_000")]})
    assert out.status_code == 200 and out.json()["model"]["version"] == "1"
    assert 'forecaster_model_loads_total{outcome="refused"} 1.0' in client.get("/metrics").text


def test_a_refused_version_is_tried_again_when_the_alias_moves_away_and_back(
    make_client, fitted, payload
):
    source = Versions(fitted)
    client = make_client(source=source, poll_interval_s=0.2)
    source.version = "2"
    assert _wait(lambda: client.get("/v1/models").json()["refused"])
    source.models["2"] = fitted  # fixed, and registered again under the same number
    source.version = "1"
    seen = client.get("/v1/models").json()["last_check_at"]
    # Two checks later the poller has surely seen the alias on version 1.
    for _ in range(2):
        assert _wait(lambda seen=seen: client.get("/v1/models").json()["last_check_at"] != seen)
        seen = client.get("/v1/models").json()["last_check_at"]
    assert client.get("/v1/models").json()["refused"][0]["version"] == "2"
    source.version = "2"
    assert _wait(lambda: client.get("/v1/models").json()["loaded"]["version"] == "2")
    assert client.get("/v1/models").json()["refused"] == []


def test_artifacts_out_of_reach_are_fetched_again_not_refused(
    make_client, registry, fitted, training_frame, payload, tmp_path
):
    """The artifact store down (here: the files moved away) when the alias moves: the version
    is not the culprit, so it is fetched again once they are back, without a forced reload."""
    registry.register(fitted, training_frame)
    client = make_client(
        source="registry", tracking_uri=registry.tracking_uri, poll_interval_s=0.2, api_keys=API_KEY
    )
    client.headers.update(KEY)
    assert client.get("/v1/models").json()["loaded"]["version"] == "1"
    v2 = registry.register(fitted, training_frame, alias="challenger")
    store, away = tmp_path / "mlartifacts", tmp_path / "away"
    store.rename(away)
    registry.move_alias(v2)
    assert _wait(
        lambda: (
            "could not be fetched" in (client.get("/v1/models").json()["last_check_error"] or "")
        )
    )
    state = client.get("/v1/models").json()
    assert state["loaded"]["version"] == "1" and state["refused"] == []
    out = client.post("/v1/forecast", json={"series": [payload("series_000")]})
    assert out.status_code == 200 and out.json()["model"]["version"] == "1"
    reload = client.post("/v1/models/reload").json()
    assert reload["outcome"] == "unavailable" and "could not be fetched" in reload["message"]
    assert _registry_errors(client) >= 1
    away.rename(store)
    assert _wait(lambda: client.get("/v1/models").json()["loaded"]["version"] == v2)


def test_registry_unreachable_after_startup_keeps_serving(make_client, fitted, payload):
    source = Versions(fitted)
    client = make_client(source=source, poll_interval_s=0.2, api_keys=API_KEY)

    def unreachable() -> ModelIdentity:
        raise ConnectionError("MLflow tracking server at http://127.0.0.1:9 is unreachable")

    source.resolve = unreachable
    assert _wait(lambda: client.get("/v1/models", headers=KEY).json()["last_check_error"])
    assert "unreachable" in client.get("/v1/models", headers=KEY).json()["last_check_error"]
    assert client.get("/readyz", headers=KEY).status_code == 200
    out = client.post("/v1/forecast", json={"series": [payload("series_000")]}, headers=KEY)
    assert out.status_code == 200
    reload = client.post("/v1/models/reload", headers=KEY).json()
    assert reload["outcome"] == "unavailable" and "unreachable" in reload["message"]
    assert _registry_errors(client, KEY) >= 1


def test_a_version_saved_by_code_that_forecasts_differently_is_refused(
    make_client, registry, fitted, training_frame, tmp_path
):
    """Served code = registered code: the reference forecast saved with the weights must
    replay. Here the registered artifact's reference is altered, as if it had been saved by
    code whose forward pass differs from this one."""
    version = registry.register(fitted, training_frame)
    references = list((tmp_path / "mlartifacts").rglob("reference.json"))
    assert len(references) == 1
    saved = json.loads(references[0].read_text())
    saved["mean"] = [[v * 1.05 for v in row] for row in saved["mean"]]
    references[0].write_text(json.dumps(saved))
    reseal(references[0].parent)
    client = make_client(source="registry", tracking_uri=registry.tracking_uri)
    state = client.get("/v1/models").json()
    assert state["loaded"] is None
    assert state["refused"][0]["version"] == version
    assert "ModelCodeMismatchError" in state["refused"][0]["error"]
    assert "reference forecast" in state["refused"][0]["error"]
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert f"is version {version}, which was refused" in ready.json()["detail"]


def test_the_registry_s_metrics_and_realised_tags_are_served_and_refreshed_in_place(
    make_client, registry, fitted, training_frame
):
    """The served version's run metrics and the monitor's realised-accuracy tags come from
    the registry; when the monitor tags the same version again, a check takes the new
    figures without reloading the model."""
    from pipelines import tracking

    version = registry.register(fitted, training_frame)
    mlflow_client = tracking.client(registry.tracking_uri)
    run_id = mlflow_client.get_model_version("forecaster", version).run_id
    mlflow_client.log_metric(run_id, "val_mase", 0.87)
    mlflow_client.set_model_version_tag("forecaster", version, "realised.mase", "0.91")
    client = make_client(source="registry", tracking_uri=registry.tracking_uri, api_keys=API_KEY)
    loaded = client.get("/v1/models", headers=KEY).json()["loaded"]
    assert loaded["metrics"]["val_mase"] == 0.87
    gauge = 'forecaster_model_realised_accuracy{metric="mase"}'
    assert f"{gauge} 0.91" in client.get("/metrics", headers=KEY).text

    mlflow_client.set_model_version_tag("forecaster", version, "realised.mase", "1.25")
    assert client.post("/v1/models/reload", headers=KEY).json()["outcome"] == "unchanged"
    assert f"{gauge} 1.25" in client.get("/metrics", headers=KEY).text
    assert (
        client.get("/v1/models", headers=KEY).json()["loaded"]["loaded_at"] == loaded["loaded_at"]
    )


def test_a_refused_version_is_not_retried_while_the_alias_stays_on_it(make_client, fitted, caplog):
    """The poller does not load a broken version again at every poll (a forced reload does)."""
    source = Versions(fitted)
    loads = []
    load = source.load
    source.load = lambda identity: loads.append(identity.version) or load(identity)
    client = make_client(source=source, poll_interval_s=0.1, api_keys=API_KEY)
    source.version = "2"
    assert _wait(lambda: client.get("/v1/models", headers=KEY).json()["refused"])
    for _ in range(3):  # three more polls, each of which sees the alias on version 2
        seen = client.get("/v1/models", headers=KEY).json()["last_check_at"]
        assert _wait(
            lambda seen=seen: client.get("/v1/models", headers=KEY).json()["last_check_at"] != seen
        )
    assert loads == ["1", "2"]
    refused = [r for r in caplog.records if "refused forecaster version 2" in r.getMessage()]
    assert len(refused) == 1 and "still serving version 1" in refused[0].getMessage()
    assert (
        'forecaster_model_loads_total{outcome="refused"} 1.0'
        in client.get("/metrics", headers=KEY).text
    )
    forced = client.post("/v1/models/reload", headers=KEY).json()
    assert forced["outcome"] == "refused" and loads == ["1", "2", "2"]


def test_readiness_says_the_first_registry_check_is_still_running(make_client, fitted):
    """A registry slow to answer at startup: the service comes up without a model, and its
    readiness says why, until the check ends."""
    import threading

    release = threading.Event()
    source = Versions(fitted)
    resolve = source.resolve
    source.resolve = lambda: release.wait(60) and resolve()
    from service import app as app_module

    startup, app_module.STARTUP_CHECK_S = app_module.STARTUP_CHECK_S, 0.2
    try:
        client = make_client(source=source)
    finally:
        app_module.STARTUP_CHECK_S = startup
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert "first registry check still running" in ready.json()["detail"]
    release.set()
    assert _wait(lambda: client.get("/readyz").status_code == 200)


def test_the_smoke_test_refuses_a_model_whose_forecasts_are_not_finite(fitted):
    """A version whose weights hold a NaN (a diverged training, a damaged file that still
    loads) forecasts NaN for every series: refused before it serves a request."""
    smoke_test(fitted)  # the sound model passes
    broken = copy.deepcopy(fitted)
    with torch.no_grad():
        next(broken.model.parameters()).fill_(float("nan"))
    with pytest.raises(RuntimeError, match="NaN or infinite"):
        smoke_test(broken)


def test_a_reload_not_waited_for_answers_202_and_still_swaps_the_version_in(make_client, fitted):
    """`POST /v1/models/reload?wait=false` answers at once; the check it started runs to its
    end after the answer, though nothing awaits it any more."""
    source = Versions(fitted)
    source.models["3"] = fitted
    client = make_client(source=source, api_keys=API_KEY)  # no poll in the meantime
    assert client.get("/v1/models", headers=KEY).json()["loaded"]["version"] == "1"
    source.version = "3"
    response = client.post("/v1/models/reload", params={"wait": "false"}, headers=KEY)
    assert response.status_code == 202
    assert response.json()["outcome"] == "in_progress"
    gc.collect()
    assert _wait(lambda: client.get("/v1/models", headers=KEY).json()["loaded"]["version"] == "3")
