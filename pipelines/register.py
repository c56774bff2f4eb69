"""Register: log the Forecaster as an MLflow pyfunc and register it as the `challenger` (a
refit: the `champion`).

The version is created with its tags in one request and only then gets the alias, so a
failure leaves no alias moved; a version whose alias could not be set is deleted again
(best effort: when the server is gone it stays, without any alias, so nothing that loads
``@challenger`` or ``@champion`` ever resolves to it).
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import tempfile
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature, infer_signature
from mlflow.tracking import MlflowClient
from mlflow.types.schema import AnyType, ColSpec, Schema

import forecaster as forecaster_package
from forecaster import Forecaster
from forecaster.data import split_future_rows
from forecaster.errors import MissingValuesError
from pipelines import registry, tracking
from pipelines.registry import ARTIFACT_NAME, CHALLENGER, ModelRef

logger = logging.getLogger(__name__)

PYFUNC_CODE = Path(__file__).with_name("pyfunc_model.py")
# The distributions the model's code (the `forecaster` package and PYFUNC_CODE) imports, which
# an environment built from the model (`mlflow models serve`, `build-docker`) installs;
# `forecaster` itself travels with the model (code_paths). tests/pipelines/test_register_step.py
# keeps this in step with the imports.
_REQUIREMENTS = (
    "mlflow",
    "torch",
    "numpy",
    "pandas",
    "pyarrow",
    "safetensors",
    "tqdm",
    "matplotlib",
)


def _git(root: Path, *args: str) -> str:
    """Standard output of `git args` in `root`; raises when git is missing or fails."""
    done = subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, timeout=5, check=True
    )
    return done.stdout.strip()


def code_version() -> str:
    """The git commit of the working tree when there is one, else the package version."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = _git(root, "rev-parse", "--short=12", "HEAD")
        dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
        if sha:
            return f"git:{sha}{'-dirty' if dirty else ''}"
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return f"forecaster=={metadata.version('forecaster')}"
    except metadata.PackageNotFoundError:
        return "unknown"


def input_example(forecaster: Forecaster, frame: pd.DataFrame, n_series: int = 2) -> pd.DataFrame:
    """The last ``context_length`` points of the first ``n_series`` series of ``frame`` that
    the model can forecast from them (an observed value among them: a series in an outage
    longer than the context is passed over, or registration would fail on it).

    A model with known-future covariates forecasts only with their future values, which the
    pyfunc reads as rows appended with ``y`` empty: its example is the origin one horizon
    before each series' end, the last ``max_horizon`` rows kept as those future rows.
    """
    covariates = list(forecaster.model_config.covariates)
    future = forecaster.max_horizon if covariates else 0
    tails = frame.groupby("unique_id", sort=False).tail(forecaster.context_length + future)
    tails = tails[["unique_id", "ds", "y", *covariates]].reset_index(drop=True)
    from_end = tails.groupby("unique_id", sort=False).cumcount(ascending=False)
    history = from_end >= future
    readable = tails.loc[history & tails["y"].notna(), "unique_id"].unique()[:n_series]
    if not len(readable):
        raise MissingValuesError(
            f"every series ends with more than {forecaster.context_length} steps without an "
            "observed value: the model could forecast none of them",
            field="y",
        )
    chosen = tails["unique_id"].isin(readable)
    example = tails[chosen].reset_index(drop=True)
    if future:
        example["y"] = example["y"].astype("float64").mask(~history[chosen].to_numpy())
    example["unique_id"] = example["unique_id"].astype(object)
    return example


def _pip_requirements() -> list[str]:
    """The model's pins: each package's release as installed, without a local label. A CPU
    build of torch is `2.13.0+cpu`, which only PyTorch's own index serves; `torch==2.13.0`
    matches that build and the CUDA one alike (PEP 440), so a GPU host can serve the model."""
    requirements = []
    for name in _REQUIREMENTS:
        try:
            release = metadata.version(name).split("+")[0]
            requirements.append(f"{name}=={release}")
        except metadata.PackageNotFoundError:
            requirements.append(name)
    return requirements


def log_model(
    forecaster: Forecaster,
    example: pd.DataFrame,
    *,
    run_id: str,
    tracking_uri: str,
    name: str = "model",
) -> mlflow.models.model.ModelInfo:
    """Log ``forecaster`` as a pyfunc model of run ``run_id``."""
    history, future = split_future_rows(example, forecaster.model_config.covariates)
    output = forecaster.predict(history, future_df=future)
    output["unique_id"] = output["unique_id"].astype(object)
    inferred = infer_signature(
        example,
        output,
        params={"horizon": forecaster.max_horizon, "quantiles": list(forecaster.quantiles)},
    )
    # The input columns are named but left untyped: MLflow's strict casts would reject ids
    # read as integers, timestamps sent as strings (all of JSON) or integer targets, which
    # the Forecaster's own validation accepts or rejects with a message naming the series.
    signature = ModelSignature(
        inputs=Schema([ColSpec(AnyType(), str(column)) for column in example.columns]),
        outputs=inferred.outputs,
        params=inferred.params,
    )
    active = mlflow.active_run()
    with tempfile.TemporaryDirectory() as tmp, tracking.tracking_uri_set(tracking_uri):
        saved = forecaster.save(Path(tmp) / ARTIFACT_NAME)
        # Inside the pipeline's own active run log straight into it; starting it again by id
        # would end it (FINISHED) on leaving the block. A refit's run is nested under it.
        run = (
            contextlib.nullcontext()
            if active is not None and active.info.run_id == run_id
            else mlflow.start_run(run_id=run_id, nested=active is not None)
        )
        with run:
            return mlflow.pyfunc.log_model(
                name=name,
                python_model=str(PYFUNC_CODE),
                artifacts={ARTIFACT_NAME: str(saved)},
                code_paths=[str(Path(forecaster_package.__file__).parent)],
                signature=signature,
                input_example=example,
                pip_requirements=_pip_requirements(),
            )


def _withdraw(client: MlflowClient, model_name: str, version: str, alias: str) -> None:
    """Delete the new version whose alias call failed, unless the alias reached it after all
    (the server applied it and the reply was lost to a timeout or a signal): MLflow deletes a
    version's aliases with it, so deleting it would leave no version holding ``alias``, not
    even the champion it replaced. Kept, it is a complete version. When the server cannot
    say, it is kept too: a version without an alias harms nothing."""
    try:
        if alias in client.get_model_version(model_name, version).aliases:
            logger.warning(
                "version %s of %s holds @%s although setting it failed; kept",
                version,
                model_name,
                alias,
            )
            return
        client.delete_model_version(model_name, version)
    except Exception:  # the server that failed the alias may fail this too
        logger.warning("could not withdraw version %s of %s after a failure", version, model_name)


def register(
    forecaster: Forecaster,
    example: pd.DataFrame,
    *,
    client: MlflowClient,
    run_id: str,
    model_name: str,
    tags: Mapping[str, str],
    artifact_name: str = "model",
    alias: str = CHALLENGER,
    run_tag: str = "registered_version",
    description: str = "",
) -> ModelRef:
    """Log the model, register a new version of ``model_name`` with ``tags`` and
    ``description`` (what the registry's pages show first), alias it ``alias`` (a refit goes
    straight to ``champion``), tag the run with the version under ``run_tag``, and return it."""
    info = log_model(
        forecaster, example, run_id=run_id, tracking_uri=client.tracking_uri, name=artifact_name
    )
    try:
        client.create_registered_model(model_name, description="Transformer time-series forecaster")
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    model_version = client.create_model_version(
        model_name,
        source=info.model_uri,
        run_id=run_id,
        tags={k: str(v) for k, v in tags.items()},
        model_id=info.model_id,
        description=description or None,
    )
    version = str(model_version.version)
    try:
        client.set_registered_model_alias(model_name, alias, version)
    except BaseException:  # Ctrl-C too: a version without its alias is half-registered
        _withdraw(client, model_name, version, alias)
        raise
    logger.info("registered %s version %s as @%s", model_name, version, alias)
    client.set_tag(run_id, run_tag, version)
    return registry.resolve_model(
        f"models:/{model_name}/{version}", tracking_uri=client.tracking_uri
    )
