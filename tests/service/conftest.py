"""Fixtures: one tiny model fitted once per session, and apps serving it."""

from __future__ import annotations

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

CONTEXT = 48
HORIZON = 12
API_KEY = "test-key-0123456789abcdef"


def tiny_config() -> tuple[ModelConfig, TrainConfig]:
    model = ModelConfig(
        context_length=CONTEXT,
        prediction_length=HORIZON,
        patch_length=8,
        patch_stride=8,
        decoder_patch_length=4,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_encoder_layers=1,
        n_decoder_layers=1,
    )
    train = TrainConfig(max_epochs=1, batch_size=64, progress=False, device="cpu")
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
    """Build a running app (lifespan entered) serving the tiny model; settings overridable."""
    clients: list[TestClient] = []

    def make(source=None, **overrides) -> TestClient:
        values = {"data_dir": tmp_path / "data", "poll_interval_s": 3600, **overrides}
        settings = ServiceSettings(**values)
        app = create_app(settings, model_source=source or StaticSource(fitted, identity))
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
