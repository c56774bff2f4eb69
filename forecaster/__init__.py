"""Transformer encoder-decoder forecasting for long-format time series.

Imports neither mlflow nor fastapi: the pipelines and the service build on this package.
"""

from forecaster.config import ModelConfig, TrainConfig
from forecaster.errors import ForecasterInputError
from forecaster.forecaster import Forecaster, WindowForecasts
from forecaster.outputs import AttentionMaps
from forecaster.training import EpochLog, TrainResult

__all__ = [
    "AttentionMaps",
    "EpochLog",
    "Forecaster",
    "ForecasterInputError",
    "ModelConfig",
    "TrainConfig",
    "TrainResult",
    "WindowForecasts",
]
