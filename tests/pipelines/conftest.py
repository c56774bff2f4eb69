"""Fixtures of the pipeline tests: SQLite-backed MLflow stores with a trained champion.

Training is the expensive part, so one session-scoped store holds a trained champion; tests
that change a registry work on a copy of its SQLite file (the artifacts it points to are
only ever added to, never changed).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.pipelines.pipeline_helpers import make_settings, synthetic


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch):
    """No user or CI MLflow/forecaster settings leak into a test."""
    for key in list(os.environ):
        if key.startswith(("FORECASTER_", "MLFLOW_TRACKING", "MLFLOW_REGISTRY")):
            monkeypatch.delenv(key, raising=False)


@pytest.fixture(scope="session")
def data_csv(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "series.csv"
    synthetic().to_csv(path, index=False)
    return path


@pytest.fixture(scope="session")
def champion_store(tmp_path_factory, data_csv):
    """A store in which one retrain registered version 1 and made it champion."""
    from pipelines.retrain import retrain

    root = tmp_path_factory.mktemp("champion-store")
    result = retrain(make_settings(root), data_csv)
    assert result.decision.promoted
    return root, result


@pytest.fixture
def store(tmp_path, champion_store) -> Path:
    """A private copy of the champion store's registry, in ``tmp_path``."""
    root, _ = champion_store
    shutil.copy(root / "mlflow.db", tmp_path / "mlflow.db")
    return tmp_path
