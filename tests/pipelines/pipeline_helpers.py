"""Helpers of the pipeline tests: tiny configs, synthetic data, SQLite-backed MLflow stores.

Training is the expensive part, so one session-scoped store holds a trained champion; tests
that change a registry work on a copy of its SQLite file (the artifacts it points to are
only ever added to, never changed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from forecaster.synthetic import generate_synthetic
from pipelines import tracking
from pipelines.settings import PipelineSettings

ROOT = Path(__file__).resolve().parents[2]

TINY_MODEL = {
    "context_length": 48,
    "prediction_length": 12,
    "patch_length": 4,
    "d_model": 16,
    "n_heads": 2,
    "d_ff": 32,
}
TINY_TRAIN = {
    "max_epochs": 2,
    "batch_size": 64,
    "max_windows_per_epoch": 256,
    "progress": False,
    "device": "cpu",
}
N_SERIES, N_STEPS = 4, 24 * 10
# Trained enough (high learning rate, a few epochs) that the champion beats seasonal naive.
PROMOTABLE_TRAIN = {
    "max_epochs": 6,
    "patience": 6,
    "learning_rate": 0.01,
    "batch_size": 64,
    "max_windows_per_epoch": 512,
    "progress": False,
    "device": "cpu",
}


def synthetic(seed: int = 0, n_series: int = N_SERIES, n_steps: int = N_STEPS) -> pd.DataFrame:
    return generate_synthetic(n_series=n_series, n_steps=n_steps, seed=seed)


def store_kwargs(root: Path) -> dict:
    return {
        "tracking_uri": f"sqlite:///{root / 'mlflow.db'}",
        "artifact_location": str(root / "mlartifacts"),
        "lock_file": str(root / "pipeline.lock"),
        "forecast_log": str(root / "forecast_log"),
        # Versions stay one per run here; the refit has its own tests (test_pipeline_refit).
        "refit": False,
    }


def make_settings(root: Path, **overrides) -> PipelineSettings:
    values = {"model": dict(TINY_MODEL), "train": dict(TINY_TRAIN), **store_kwargs(root)}
    for key, value in overrides.items():
        if key in ("model", "train"):
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    return PipelineSettings.load(**values)


def config_file(root: Path, **extra) -> Path:
    """YAML settings for CLI runs against the store in ``root``."""
    import yaml

    content = {"model": TINY_MODEL, "train": TINY_TRAIN, **store_kwargs(root), **extra}
    path = root / "settings.yaml"
    path.write_text(yaml.safe_dump(content))
    return path


def client_for(root: Path):
    return tracking.client(f"sqlite:///{root / 'mlflow.db'}")


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300):
    """``python -m pipelines.cli ARGS`` in a subprocess."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FORECASTER_")}
    full_env.pop("MLFLOW_TRACKING_URI", None)
    full_env["PYTHONPATH"] = str(ROOT)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def noisy_history(df: pd.DataFrame, keep: int) -> pd.DataFrame:
    """``df`` with all but the last ``keep`` points of each series replaced by white noise
    of the same mean and spread: a model trained on it cannot have learned the seasonality,
    while the recent points (context and holdout window) are the real series."""
    df = df.copy()
    position = df.groupby("unique_id").cumcount().to_numpy()
    length = df.groupby("unique_id")["y"].transform("size").to_numpy()
    mean = df.groupby("unique_id")["y"].transform("mean").to_numpy()
    std = df.groupby("unique_id")["y"].transform("std").to_numpy()
    noise = mean + std * np.random.default_rng(1).standard_normal(len(df))
    replace = position < length - keep
    df.loc[replace, "y"] = noise[replace]
    return df
