"""Fixtures: one tiny model fitted once per session, and apps serving it."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster.synthetic import generate_synthetic
from service.app import create_app
from service.model_manager import ModelIdentity, StaticSource
from service.settings import ServiceSettings


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch):
    """No user or CI service/MLflow settings leak into a test."""
    for key in list(os.environ):
        if key.startswith(("FORECASTER_", "MLFLOW_TRACKING", "MLFLOW_REGISTRY")):
            monkeypatch.delenv(key, raising=False)


CONTEXT = 48
HORIZON = 12
API_KEY = "test-key-0123456789abcdef"


def tiny_config() -> tuple[ModelConfig, TrainConfig]:
    model = ModelConfig(
        context_length=CONTEXT,
        prediction_length=HORIZON,
        patch_length=4,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_encoder_layers=1,
        n_decoder_layers=1,
    )
    train = TrainConfig(
        max_epochs=1, batch_size=64, max_windows_per_epoch=1024, progress=False, device="cpu"
    )
    return model, train


@pytest.fixture(scope="session")
def training_frame() -> pd.DataFrame:
    return generate_synthetic(n_series=4, n_steps=24 * 10, seed=1)


@pytest.fixture(scope="session")
def fitted(training_frame: pd.DataFrame) -> Forecaster:
    model_config, train_config = tiny_config()
    return Forecaster(model_config, train_config).fit(training_frame)


@pytest.fixture(scope="session")
def identity() -> ModelIdentity:
    return ModelIdentity(
        name="forecaster", version="3", alias="champion", run_id="run-abc", metrics={"mae": 1.5}
    )


@pytest.fixture()
def history(training_frame: pd.DataFrame) -> pd.DataFrame:
    """The last 2 * CONTEXT points of every series."""
    return training_frame.groupby("unique_id").tail(2 * CONTEXT).reset_index(drop=True)


def series_payload(history: pd.DataFrame, series_id: str, n: int = CONTEXT) -> dict:
    part = history[history["unique_id"] == series_id].tail(n)
    return {
        "id": series_id,
        "timestamps": [t.isoformat() for t in part["ds"]],
        "values": part["y"].tolist(),
    }


@pytest.fixture()
def payload(history: pd.DataFrame) -> Callable[..., dict]:
    """payload(series_id, n=CONTEXT): the JSON of one series' last n points."""
    return lambda series_id, n=CONTEXT: series_payload(history, series_id, n)


@pytest.fixture()
def make_client(
    tmp_path: Path, fitted: Forecaster, identity: ModelIdentity
) -> Iterator[Callable[..., TestClient]]:
    """Build a running app (lifespan entered); settings overridable. It serves the tiny model,
    or follows the real registry of the settings with source="registry"."""
    clients: list[TestClient] = []

    def make(source=None, **overrides) -> TestClient:
        values = {"data_dir": tmp_path / "data", "poll_interval_s": 3600, **overrides}
        settings = ServiceSettings(_env_file=None, **values)
        if source is None:
            source = StaticSource(fitted, identity)
        elif source == "registry":
            source = None
        app = create_app(settings, model_source=source)
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture()
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


def register_version(
    tracking_uri: str,
    forecaster: Forecaster,
    frame: pd.DataFrame,
    *,
    artifacts: Path | None,
    alias: str | None = "champion",
    name: str = "forecaster",
) -> str:
    """Register `forecaster` with the pipelines' register step; point `alias` at it."""
    from pipelines import tracking
    from pipelines.register import input_example, register

    experiment = tracking.ensure_experiment(
        "service-tests",
        tracking_uri=tracking_uri,
        artifact_location=None if artifacts is None else str(artifacts),
    )
    mlflow_client = tracking.client(tracking_uri)
    run = mlflow_client.create_run(experiment)
    # MLflow 3's registry looks the logged model up through the global tracking URI.
    with tracking.tracking_uri_set(tracking_uri):
        ref = register(
            forecaster,
            input_example(forecaster, frame),
            client=mlflow_client,
            run_id=run.info.run_id,
            model_name=name,
            tags={"purpose": "service tests"},
        )
    mlflow_client.set_terminated(run.info.run_id)
    if alias:
        mlflow_client.set_registered_model_alias(name, alias, ref.version)
    return ref.version


class Registry:
    """An empty SQLite-backed MLflow registry in a temporary directory."""

    def __init__(self, root: Path, tracking_uri: str | None = None):
        # A tracking server decides where artifacts go; a local store keeps them in root.
        self.tracking_uri = tracking_uri or f"sqlite:///{root / 'mlflow.db'}"
        self.artifacts = None if tracking_uri else root / "mlartifacts"

    def register(self, forecaster: Forecaster, frame: pd.DataFrame, alias: str | None = "champion"):
        return register_version(
            self.tracking_uri, forecaster, frame, artifacts=self.artifacts, alias=alias
        )

    def move_alias(self, version: str, alias: str = "champion", name: str = "forecaster"):
        from pipelines import tracking

        tracking.client(self.tracking_uri).set_registered_model_alias(name, alias, version)


@pytest.fixture()
def registry(tmp_path: Path) -> Registry:
    return Registry(tmp_path)


@pytest.fixture()
def registry_at(tmp_path: Path) -> Callable[[str], Registry]:
    """registry_at(tracking_uri): the registry behind a tracking server."""
    return lambda tracking_uri: Registry(tmp_path, tracking_uri)


def glitch_count(client, source: str) -> float:
    """forecaster_glitches_total{source} as /metrics reports it (0 before any)."""
    text = client.get("/metrics").text
    found = re.search(rf'^forecaster_glitches_total{{source="{source}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0
