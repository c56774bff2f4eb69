"""Reading the MLflow Model Registry: resolve a model URI, fetch and load its Forecaster.

The service depends on this module to reach the model (and its attention) directly, without
going through the pyfunc wrapper. A registered version is an MLflow pyfunc whose artifact
named ``forecaster`` is the directory ``Forecaster.save`` wrote (``config.json`` and
``model.safetensors``), so ``<model>/artifacts/forecaster`` loads with ``Forecaster.load``.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import mlflow
import yaml
from mlflow.exceptions import MlflowException

from pipelines import tracking
from pipelines.errors import InvalidModelUriError, ModelNotFoundError, UnloadableModelError

if TYPE_CHECKING:
    from forecaster import Forecaster

DEFAULT_MODEL_NAME = "forecaster"
CHAMPION = "champion"
CHALLENGER = "challenger"
# Name of the pyfunc artifact holding the Forecaster.save directory.
ARTIFACT_NAME = "forecaster"

_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>[^/@]+))$")


@dataclass(frozen=True)
class ModelRef:
    """One registered model version, as a model URI resolved to it."""

    name: str
    version: str
    alias: str | None  # the alias the URI named, when it named one
    run_id: str | None  # the run that trained it
    metrics: dict[str, float] = field(default_factory=dict)  # that run's final metrics
    source_uri: str = ""  # where the registry keeps the model's artifacts
    tags: dict[str, str] = field(default_factory=dict)  # the version's tags

    @property
    def uri(self) -> str:
        """``models:/NAME@alias`` when resolved through an alias, else ``models:/NAME/VERSION``."""
        if self.alias:
            return f"models:/{self.name}@{self.alias}"
        return f"models:/{self.name}/{self.version}"


@dataclass(frozen=True)
class LoadedModel:
    """A Forecaster loaded from the registry, with the version it came from."""

    forecaster: Forecaster
    ref: ModelRef


def parse_model_uri(model_uri: str) -> tuple[str, str | None, str | None]:
    """Split ``models:/NAME@alias`` or ``models:/NAME/VERSION`` into (name, alias, version)."""
    match = _URI.match(model_uri.strip())
    if match is None:
        raise InvalidModelUriError(
            f"model URI: expected 'models:/NAME@alias' or 'models:/NAME/VERSION', got {model_uri!r}"
        )
    if match["version"] is not None and not match["version"].isdigit():
        raise InvalidModelUriError(
            f"model URI: expected a version number after '{match['name']}/', "
            f"got {match['version']!r} in {model_uri!r}"
        )
    return match["name"], match["alias"], match["version"]


def _not_found(exc: MlflowException) -> bool:
    return exc.error_code == "RESOURCE_DOES_NOT_EXIST" or "not found" in str(exc).lower()


def resolve_model(model_uri: str, *, tracking_uri: str | None = None) -> ModelRef:
    """The registered version a model URI points at.

    Raises:
        InvalidModelUriError: the URI is not of a supported form.
        ModelNotFoundError: the model, version or alias does not exist (the message names it).
        TrackingUnavailableError: the tracking server cannot be reached.
    """
    name, alias, version = parse_model_uri(model_uri)
    target = f"{name}@{alias}" if alias else f"{name}/{version}"
    mlflow_client = tracking.client(tracking_uri)
    with tracking.tracking_errors(tracking_uri):
        try:
            if alias:
                model_version = mlflow_client.get_model_version_by_alias(name, alias)
            else:
                model_version = mlflow_client.get_model_version(name, str(version))
        except MlflowException as exc:
            if _not_found(exc):
                raise ModelNotFoundError(
                    f"registered model {target} not found in {tracking.resolve_tracking_uri(tracking_uri)}",
                    model_uri=model_uri,
                ) from exc
            raise
        metrics: dict[str, float] = {}
        if model_version.run_id:
            try:
                metrics = dict(mlflow_client.get_run(model_version.run_id).data.metrics)
            except MlflowException as exc:
                if not _not_found(exc):
                    raise
    return ModelRef(
        name=name,
        version=str(model_version.version),
        alias=alias,
        run_id=model_version.run_id,
        metrics=metrics,
        source_uri=mlflow_client.get_model_version_download_uri(name, str(model_version.version))
        if model_version.source
        else "",
        tags=dict(model_version.tags or {}),
    )


def download_forecaster(
    ref: ModelRef, dst: Path | None = None, *, tracking_uri: str | None = None
) -> Path:
    """Download the version's ``Forecaster.save`` directory and return its local path.

    With ``dst`` given, the files land in ``dst`` (created); a ``dst`` that already holds a
    ``config.json`` is taken as a finished earlier download and returned as is, since the
    download is moved into place only once complete. Without ``dst`` a fresh temporary
    directory is used.
    """
    if dst is not None and (Path(dst) / "config.json").is_file():
        return Path(dst)
    uri = tracking.resolve_tracking_uri(tracking_uri)
    tracking.bound_http_requests()
    with tracking.tracking_errors(uri):
        source = ref.source_uri or tracking.client(uri).get_model_version_download_uri(
            ref.name, ref.version
        )
        if dst is not None:
            Path(dst).parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".download-", dir=Path(dst).parent if dst else None))
        try:
            artifact_path = _forecaster_artifact_path(source, staging, uri)
            local = Path(
                mlflow.artifacts.download_artifacts(
                    artifact_uri=f"{source.rstrip('/')}/{artifact_path}",
                    dst_path=str(staging),
                    tracking_uri=uri,
                )
            )
        except MlflowException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if _not_found(exc) or "No such" in str(exc):
                raise ModelNotFoundError(
                    f"registered model {ref.name}/{ref.version} has no '{ARTIFACT_NAME}' "
                    f"artifact at {source}; was it logged by these pipelines?",
                    model_uri=ref.uri,
                ) from exc
            raise
    if not (local / "config.json").is_file():
        shutil.rmtree(staging, ignore_errors=True)
        raise ModelNotFoundError(
            f"registered model {ref.name}/{ref.version}: '{ARTIFACT_NAME}' artifact at {source} "
            "holds no config.json; was it logged by these pipelines?",
            model_uri=ref.uri,
        )
    if dst is None:
        return local
    dst = Path(dst)
    if dst.exists():
        shutil.rmtree(dst)
    local.rename(dst)
    shutil.rmtree(staging, ignore_errors=True)
    return dst


def _forecaster_artifact_path(source: str, staging: Path, tracking_uri: str) -> str:
    """Path of the ``forecaster`` artifact inside the model, as its MLmodel file records it."""
    mlmodel = mlflow.artifacts.download_artifacts(
        artifact_uri=f"{source.rstrip('/')}/MLmodel",
        dst_path=str(staging),
        tracking_uri=tracking_uri,
    )
    conf = yaml.safe_load(Path(mlmodel).read_text())
    artifacts = (conf.get("flavors", {}).get("python_function", {}) or {}).get("artifacts") or {}
    entry = artifacts.get(ARTIFACT_NAME)
    if not entry or "path" not in entry:
        raise MlflowException(f"No such artifact: '{ARTIFACT_NAME}' in MLmodel at {source}")
    return str(entry["path"])


def load_version(
    ref: ModelRef, *, tracking_uri: str | None = None, device: str | None = None
) -> Forecaster:
    """Download ``ref``'s artifacts to a temporary directory and load them on ``device``.

    ``Forecaster.load`` reads every file into memory, so the directory is removed after.
    Raises ``UnloadableModelError`` when the files are corrupt or were saved by other code.
    """
    from forecaster import Forecaster

    with tempfile.TemporaryDirectory(prefix="forecaster-") as tmp:
        path = download_forecaster(ref, Path(tmp) / "model", tracking_uri=tracking_uri)
        try:
            return Forecaster.load(path, device=device)
        except Exception as exc:  # whatever is wrong with the files, the version is unusable
            raise UnloadableModelError(
                f"{ref.uri} (version {ref.version}): its artifacts cannot be loaded: "
                f"{type(exc).__name__}: {exc}",
                model_uri=ref.uri,
            ) from exc


def load_forecaster(
    model_uri: str, *, tracking_uri: str | None = None, device: str | None = None
) -> LoadedModel:
    """Resolve ``model_uri``, download its artifacts and load the Forecaster on ``device``."""
    ref = resolve_model(model_uri, tracking_uri=tracking_uri)
    return LoadedModel(
        forecaster=load_version(ref, tracking_uri=tracking_uri, device=device), ref=ref
    )
