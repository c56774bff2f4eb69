"""The register step's input example and code version, without a registry: what a version's
page shows as its example, and what it says about the code that trained it."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import forecaster as forecaster_package
from forecaster import Forecaster, ModelConfig
from forecaster.errors import MissingValuesError
from pipelines import register as register_module
from pipelines.register import PYFUNC_CODE, code_version, input_example

CONTEXT, HORIZON = 8, 3


def _model(*covariates: str) -> Forecaster:
    config = ModelConfig(
        context_length=CONTEXT, prediction_length=HORIZON, patch_length=4, covariates=covariates
    )
    return Forecaster(config)


def _frame(ids=("b", "a", "c"), n: int = 20, **columns) -> pd.DataFrame:
    """Series given in the order of `ids` (not sorted), y = 100 * series index + step."""
    parts = []
    for k, sid in enumerate(ids):
        part = pd.DataFrame(
            {
                "unique_id": sid,
                "ds": pd.date_range("2024-01-01", periods=n, freq="h"),
                "y": 100.0 * k + np.arange(n),
                "extra": "ignored",
            }
        )
        for name, value in columns.items():
            part[name] = value
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def test_the_example_is_the_first_series_last_context_in_the_data_s_order():
    example = input_example(_model(), _frame())
    assert list(example.columns) == ["unique_id", "ds", "y"]
    assert example["unique_id"].tolist() == ["b"] * CONTEXT + ["a"] * CONTEXT
    assert example["y"].tolist() == [*range(12, 20), *range(112, 120)]
    assert example.index.tolist() == list(range(2 * CONTEXT))
    assert example["unique_id"].dtype == object  # MLflow's signature of string ids


def test_a_series_without_an_observed_value_in_its_context_is_passed_over():
    frame = _frame()
    frame.loc[(frame["unique_id"] == "b") & (frame["ds"] >= "2024-01-01 12:00"), "y"] = np.nan
    example = input_example(_model(), frame)
    assert example["unique_id"].unique().tolist() == ["a", "c"]
    # One observed value among the context is enough.
    frame.loc[(frame["unique_id"] == "b") & (frame["ds"] == "2024-01-01 19:00"), "y"] = 7.0
    assert input_example(_model(), frame)["unique_id"].unique().tolist() == ["b", "a"]


def test_no_series_the_model_can_forecast_is_an_error_naming_y():
    frame = _frame()
    frame.loc[frame["ds"] >= "2024-01-01 12:00", "y"] = np.nan
    with pytest.raises(MissingValuesError, match=f"more than {CONTEXT} steps") as caught:
        input_example(_model(), frame)
    assert caught.value.field == "y"


def test_with_covariates_the_last_horizon_rows_are_future_rows_without_y():
    """A model with known-future covariates forecasts only with their future values: the
    example ends one horizon early, its last `HORIZON` rows carrying covariates, y empty."""
    frame = _frame(promo=1.0)
    example = input_example(_model("promo"), frame)
    assert list(example.columns) == ["unique_id", "ds", "y", "promo"]
    for sid, offset in (("b", 0), ("a", 100)):
        rows = example[example["unique_id"] == sid]
        assert len(rows) == CONTEXT + HORIZON
        expected = [offset + t for t in range(20 - CONTEXT - HORIZON, 20 - HORIZON)]
        assert rows["y"].iloc[:CONTEXT].tolist() == expected
        assert rows["y"].iloc[CONTEXT:].isna().all()
        assert rows["ds"].iloc[-1] == pd.Timestamp("2024-01-01 19:00")
    assert example["promo"].notna().all()


def test_with_covariates_a_series_observed_only_in_its_future_rows_is_passed_over():
    frame = _frame(promo=1.0)
    b = frame["unique_id"] == "b"
    frame.loc[b & (frame["ds"] < "2024-01-01 17:00"), "y"] = np.nan  # only the last 3 seen
    example = input_example(_model("promo"), frame)
    assert example["unique_id"].unique().tolist() == ["a", "c"]


def _git(*args: str, cwd) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_the_code_version_is_the_commit_and_says_whether_the_tree_was_dirty(tmp_path, monkeypatch):
    """Read from the repository the pipelines run from; edits to tracked files mark it dirty,
    untracked files (data, outputs) do not."""
    package = tmp_path / "pipelines"
    package.mkdir()
    (package / "register.py").write_text("")
    _git("init", "-q", cwd=tmp_path)
    _git("add", ".", cwd=tmp_path)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x", cwd=tmp_path)
    sha = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=tmp_path, capture_output=True, text=True
    ).stdout.strip()
    monkeypatch.setattr(register_module, "__file__", str(package / "register.py"))
    (tmp_path / "outputs.csv").write_text("untracked")
    assert code_version() == f"git:{sha}"
    (package / "register.py").write_text("# edited")
    assert code_version() == f"git:{sha}-dirty"


def test_outside_a_repository_the_code_version_is_the_installed_package(tmp_path, monkeypatch):
    monkeypatch.setattr(register_module, "__file__", str(tmp_path / "pipelines" / "register.py"))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert code_version().startswith("forecaster==")


def test_the_model_pins_every_distribution_its_code_imports():
    """An environment built from a registered model (`mlflow models serve`, `build-docker`)
    installs its requirements and nothing else: a package the model's code imports and the
    list leaves out fails the model's load there (tqdm was left out), whatever this
    environment has."""
    code = [*Path(forecaster_package.__file__).parent.glob("*.py"), PYFUNC_CODE]
    imported = set()
    for path in code:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"forecaster", "pipelines"}
    pinned = {line.split("==")[0] for line in register_module._pip_requirements()}
    # A module may come from several distributions (mlflow from mlflow and mlflow-skinny).
    provided_by = metadata.packages_distributions()
    unpinned = sorted(name for name in third_party if not pinned & set(provided_by[name]))
    assert not unpinned, f"imported by the model's code but not in its requirements: {unpinned}"
