"""Which model is served, and how a new registry version replaces it.

The manager follows the configured alias: a background poller (and `POST /v1/models/reload`)
asks the registry which version the alias points at; a new version is downloaded, loaded and
smoke-tested in a worker thread while the current one keeps serving, then swapped in with one
reference assignment. A version that fails to load or predict is refused (and not retried by the
poller until the alias moves away and back, or a forced reload); the registry or the artifact
store being unreachable changes nothing: the version is fetched again at the next poll.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from forecaster import Forecaster
from forecaster.time_axis import steps_after, synthetic_range
from service.metrics import ServiceMetrics
from service.settings import ServiceSettings

logger = logging.getLogger(__name__)


class ArtifactsUnavailableError(RuntimeError):
    """A version's artifacts could not be fetched (store down, files not there yet): nothing
    is known to be wrong with the version itself, so it is tried again at the next poll."""


@dataclass(frozen=True)
class ModelIdentity:
    """Where a served model came from (the registry's `ModelRef`, reduced to what we report)."""

    name: str
    version: str
    alias: str | None = None
    run_id: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    source_uri: str | None = None
    # Realised accuracy the last monitoring run tagged the version with ("mase" -> 0.91).
    realised: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_ref(cls, ref: Any) -> ModelIdentity:
        return cls(
            name=str(ref.name),
            version=str(ref.version),
            alias=getattr(ref, "alias", None),
            run_id=getattr(ref, "run_id", None),
            metrics={k: float(v) for k, v in (getattr(ref, "metrics", None) or {}).items()},
            source_uri=getattr(ref, "source_uri", None),
            realised=_realised(getattr(ref, "tags", None) or {}),
        )

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "alias": self.alias,
            "run_id": self.run_id,
        }


def _realised(tags: dict[str, str]) -> dict[str, float]:
    from pipelines.monitor import REALISED_PREFIX

    values = {}
    for key, value in tags.items():
        if key.startswith(REALISED_PREFIX):
            try:
                values[key.removeprefix(REALISED_PREFIX)] = float(value)
            except ValueError:  # "until", "degraded": not numbers
                continue
    return values


@dataclass(frozen=True)
class ServedModel:
    """A loaded model and its identity; immutable, so a request keeps the one it started with."""

    forecaster: Forecaster
    identity: ModelIdentity
    loaded_at: datetime


class ModelSource(Protocol):
    """Where models come from: the MLflow registry in production."""

    label: str  # NAME@alias (or NAME/version) for messages
    uri: str  # the model URI followed

    def resolve(self) -> ModelIdentity:
        """The version the configured URI points at now. Raises LookupError if there is none."""
        ...

    def load(self, identity: ModelIdentity) -> Forecaster:
        """Download and load that version."""
        ...


class RegistrySource:
    """The MLflow Model Registry, through the pipelines' registry helpers."""

    def __init__(self, settings: ServiceSettings):
        self.model_uri = settings.model_uri
        self.tracking_uri = settings.tracking_uri
        self.device = settings.device
        self.download_root = Path(settings.data_dir) / "models"
        self.label = settings.model_label
        self.uri = settings.model_uri
        self._refs: dict[str, Any] = {}

    def resolve(self) -> ModelIdentity:
        from pipelines.registry import ModelNotFoundError, resolve_model

        try:
            ref = resolve_model(self.model_uri, tracking_uri=self.tracking_uri)
        except ModelNotFoundError as exc:
            raise LookupError(str(exc)) from exc
        identity = ModelIdentity.from_ref(ref)
        self._refs[identity.version] = ref
        return identity

    def load(self, identity: ModelIdentity) -> Forecaster:
        from pipelines.registry import download_forecaster

        ref = self._refs[identity.version]
        self.download_root.mkdir(parents=True, exist_ok=True)
        # Forecaster.load reads everything into memory, so the download can go right after.
        with tempfile.TemporaryDirectory(dir=self.download_root) as tmp:
            try:
                path = download_forecaster(
                    ref, Path(tmp) / "forecaster", tracking_uri=self.tracking_uri
                )
            except Exception as exc:  # whatever the store says, the files are not here
                raise ArtifactsUnavailableError(
                    f"version {identity.version}'s artifacts could not be fetched: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            return Forecaster.load(path, device=self.device)


class StaticSource:
    """One fixed, already loaded model (tests, and embedding the app around a local model)."""

    def __init__(self, forecaster: Forecaster, identity: ModelIdentity):
        self.forecaster = forecaster
        self.identity = identity
        self.label = f"{identity.name}/{identity.version}"
        self.uri = f"models:/{self.label}"

    def resolve(self) -> ModelIdentity:
        return self.identity

    def load(self, identity: ModelIdentity) -> Forecaster:
        return self.forecaster


def smoke_test(forecaster: Forecaster) -> None:
    """Forecast two synthetic series end to end; raise if the model cannot or gives non-finite
    output. Runs before a model is swapped in, so a broken version never serves a request."""
    mc = forecaster.model_config
    length = forecaster.context_length
    freq = forecaster.freq or "h"
    ds = synthetic_range("2024-01-01", length, freq)
    t = np.arange(length, dtype=np.float64)
    frames = []
    for k, sid in enumerate(("smoke-a", "smoke-b")):
        frame = pd.DataFrame({"unique_id": sid, "ds": ds, "y": 10 + np.sin(t / 7 + k) + 0.01 * t})
        for name in mc.covariates:
            frame[name] = 0.0
        frames.append(frame)
    history = pd.concat(frames, ignore_index=True)
    future = None
    if mc.covariates:
        future_ds = steps_after(ds[-1:], freq, forecaster.max_horizon)[0].astype(ds.dtype)
        future = pd.concat(
            [
                pd.DataFrame(
                    {"unique_id": sid, "ds": future_ds, **dict.fromkeys(mc.covariates, 0.0)}
                )
                for sid in ("smoke-a", "smoke-b")
            ],
            ignore_index=True,
        )
    out = forecaster.predict(history, future_df=future)
    expected_rows = 2 * forecaster.max_horizon
    if len(out) != expected_rows:
        raise RuntimeError(f"smoke test: expected {expected_rows} forecast rows, got {len(out)}")
    numeric = out.drop(columns=["unique_id", "ds"]).to_numpy(dtype=np.float64)
    if not np.isfinite(numeric).all():
        raise RuntimeError("smoke test: the model produced NaN or infinite forecasts")


@dataclass
class CheckOutcome:
    outcome: str  # loaded | unchanged | refused | unavailable
    message: str


@dataclass
class _Refusal:
    version: str
    error: str
    at: datetime


class ModelManager:
    """Holds the served model and swaps in new registry versions."""

    def __init__(
        self,
        source: ModelSource,
        metrics: ServiceMetrics,
        *,
        poll_interval_s: float = 30.0,
        validate: Callable[[Forecaster], None] = smoke_test,
    ):
        self.source = source
        self.metrics = metrics
        self.poll_interval_s = poll_interval_s
        self.validate = validate
        self.current: ServedModel | None = None
        self.last_check_at: datetime | None = None
        self.last_check_error: str | None = None
        self.refused: dict[str, _Refusal] = {}
        self._resolved: str | None = None  # the version the alias named at the last check
        self.bind()

    def bind(self) -> None:
        """Fresh asyncio primitives for the event loop about to run the app."""
        self._lock = asyncio.Lock()
        self._first_check = asyncio.Event()
        # Checks started for a request that is answered before they end: the loop holds
        # tasks weakly, so without a reference one could be collected half way.
        self._background: set[asyncio.Task[CheckOutcome]] = set()

    @property
    def label(self) -> str:
        return self.source.label

    @property
    def checking(self) -> bool:
        return self._lock.locked()

    def unavailable_reason(self) -> str:
        """Why no model is served, naming the NAME@alias the service waits for."""
        refusal = self.refused.get(self._resolved or "")
        if refusal is not None:
            return (
                f"no model is loaded: {self.label} is version {refusal.version}, which was "
                f"refused ({refusal.error}); waiting for the alias to move"
            )
        reason = f"no model is loaded: waiting for {self.label} in the model registry"
        if self.last_check_error:
            reason += f" ({self.last_check_error})"
        elif not self._first_check.is_set():
            reason += " (first registry check still running)"
        return reason

    async def check(self, *, force: bool = False) -> CheckOutcome:
        """Ask the registry for the alias's version; load, test and swap it in if new.

        `force` retries a version refused before (the poller does not).
        """
        async with self._lock:
            try:
                return await self._check(force)
            finally:
                self._first_check.set()

    async def _check(self, force: bool) -> CheckOutcome:
        self.last_check_at = datetime.now(UTC)
        try:
            identity = await asyncio.to_thread(self.source.resolve)
        except LookupError as exc:
            self.last_check_error = f"not found: {exc}"
            self.metrics.registry_errors.inc()
            logger.warning("model %s not found in the registry: %s", self.label, exc)
            return CheckOutcome("unavailable", self.last_check_error)
        except Exception as exc:  # a tracking server down must never stop the service
            self.last_check_error = f"registry unreachable: {type(exc).__name__}: {exc}"
            self.metrics.registry_errors.inc()
            logger.warning("model registry check for %s failed: %s", self.label, exc)
            return CheckOutcome("unavailable", self.last_check_error)
        self.last_check_error = None
        moved, self._resolved = identity.version != self._resolved, identity.version
        current = self.current
        if current is not None and current.identity.version == identity.version:
            if current.identity != identity:  # same version, fresher metadata (metrics, alias)
                self.current = ServedModel(current.forecaster, identity, current.loaded_at)
                self.metrics.set_realised(identity.realised)
            return CheckOutcome("unchanged", f"version {identity.version} is already served")
        if identity.version in self.refused and not (force or moved):
            refusal = self.refused[identity.version]
            return CheckOutcome(
                "refused", f"version {identity.version} was refused: {refusal.error}"
            )

        logger.info("loading %s version %s", identity.name, identity.version)
        try:
            forecaster = await asyncio.to_thread(self._load_and_test, identity)
        except ArtifactsUnavailableError as exc:
            self.last_check_error = str(exc)
            self.metrics.registry_errors.inc()
            logger.warning("%s: %s; trying again at the next check", self.label, exc)
            return CheckOutcome("unavailable", self.last_check_error)
        except Exception as exc:  # any failure refuses the version; the current one keeps serving
            message = f"{type(exc).__name__}: {exc}"
            self.refused[identity.version] = _Refusal(identity.version, message, datetime.now(UTC))
            self.metrics.model_loads.labels("refused").inc()
            logger.error(
                "refused %s version %s (still serving %s): %s",
                identity.name,
                identity.version,
                "nothing" if current is None else f"version {current.identity.version}",
                message,
            )
            return CheckOutcome("refused", f"version {identity.version} refused: {message}")
        self.refused.pop(identity.version, None)
        self.current = ServedModel(forecaster, identity, datetime.now(UTC))
        self.metrics.model_loads.labels("loaded").inc()
        self.metrics.set_model(identity.name, identity.version, identity.alias, identity.run_id)
        self.metrics.set_realised(identity.realised)
        logger.info(
            "now serving %s version %s (run %s)", identity.name, identity.version, identity.run_id
        )
        return CheckOutcome("loaded", f"now serving version {identity.version}")

    def _load_and_test(self, identity: ModelIdentity) -> Forecaster:
        forecaster = self.source.load(identity)
        self.validate(forecaster)
        return forecaster

    def check_in_background(self, *, force: bool = False) -> asyncio.Task[CheckOutcome]:
        """`check` as a task that runs to its end whether or not anyone awaits it."""
        task = asyncio.ensure_future(self.check(force=force))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def wait_first_check(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._first_check.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def run_poller(self) -> None:
        """Check now, then every poll interval, until cancelled."""
        while True:
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the poller die; the next round tries again
                logger.exception("model poller round failed")
            await asyncio.sleep(self.poll_interval_s)

    def state(self) -> dict[str, Any]:
        current = self.current
        loaded = None
        if current is not None:
            f = current.forecaster
            ident = current.identity
            loaded = {
                **ident.info(),
                "source_uri": ident.source_uri,
                "metrics": ident.metrics,
                "loaded_at": current.loaded_at,
                "freq": f.freq,
                "context_length": f.model_config.context_length,
                "max_horizon": f.max_horizon,
                "quantiles": list(f.quantiles),
                "covariates": list(f.model_config.covariates),
                "device": str(f.device),
            }
        return {
            "model_uri": self.source.uri,
            "ready": current is not None,
            "loaded": loaded,
            "last_check_at": self.last_check_at,
            "last_check_error": self.last_check_error,
            "refused": [
                {"version": r.version, "error": r.error, "at": r.at} for r in self.refused.values()
            ],
            "checking": self.checking,
        }
