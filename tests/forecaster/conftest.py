"""Fixtures shared by the forecaster tests: a tiny configuration and small synthetic data."""

import pandas as pd
import pytest

from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster.synthetic import generate_synthetic

TINY_MODEL = dict(
    context_length=32,
    prediction_length=8,
    patch_length=4,
    d_model=16,
    n_heads=2,
    n_encoder_layers=1,
    n_decoder_layers=1,
    d_ff=32,
    dropout=0.0,
)
# 16 steps of 64 windows per epoch (an epoch is max_windows_per_epoch windows, whatever the
# data holds).
TINY_TRAIN = dict(
    max_epochs=2, batch_size=64, max_windows_per_epoch=1024, progress=False, device="cpu", seed=0
)


@pytest.fixture
def tiny_config() -> ModelConfig:
    return ModelConfig(**TINY_MODEL)


@pytest.fixture(scope="session")
def series() -> pd.DataFrame:
    return generate_synthetic(n_series=4, n_steps=24 * 14, freq="h", seed=0)


@pytest.fixture(scope="session")
def fitted(series) -> Forecaster:
    """A tiny model fitted once per session; tests must not mutate it."""
    return Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN)).fit(series)
