"""Retrain: ingest -> monitor -> split -> train -> evaluate -> register -> promote -> refit,
as one MLflow run (monitor scores the forecasts logged since the last run, see
``pipelines.monitor``; ``check_champion`` runs that step alone).

The run ends FINISHED, FAILED (with the error as the ``error`` tag) or KILLED (interrupted).
``champion`` moves only in the last steps: promote moves it to the evaluated version, and
refit (when on) then to the refit version. A failure before promote leaves the champion as it
was; one during refit leaves the evaluated version champion (judged, and promoted); nothing is
registered before the model has trained and been evaluated. Runs hold
the pipeline lock, so they never overlap; a run that was killed (and so could not mark its
MLflow run) is marked KILLED by the next run on the same host.

A run that would only repeat a decision stops after monitoring (`unchanged`): its inputs (data,
configuration, split and committed code: `training_inputs`) are the champion's, or those of a
version rejected against the present champion. It would register the same model again, a new
version on every scheduled run of a feed that has not moved.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow.entities import RunStatus
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from forecaster import ModelConfig
from forecaster.errors import ForecasterInputError
from forecaster.time_axis import time_label
from pipelines import tracking
from pipelines.evaluate import Evaluation, evaluate
from pipelines.ingest import IngestResult, ingest
from pipelines.interrupt import uninterruptible
from pipelines.lock import pipeline_lock, process_alive
from pipelines.monitor import BACKTEST_MASE_BY_STEP, MonitorResult, monitor, step_tag
from pipelines.promote import DECISION, PromotionDecision, promote_with_settings
from pipelines.refit import REFIT_OF, refit
from pipelines.register import code_version, input_example, register
from pipelines.registry import CHAMPION, ModelRef
from pipelines.settings import PipelineSettings
from pipelines.split import DataSplit, SplitPlan, split
from pipelines.train import TrainOutcome, log_params, train

logger = logging.getLogger(__name__)

# Version tag: the hash of what the version was trained on (`training_inputs`).
TRAINING_INPUTS = "train.inputs"
# Run tag of a run that trained nothing (`retrain_unchanged`).
UNCHANGED_TAG = "retrain.unchanged"
# Run tags that let a later run recognise a run killed on this host (`tracking.run_tags`).
HOST_TAG, PID_TAG, KIND_TAG = tracking.HOST_TAG, tracking.PID_TAG, tracking.KIND_TAG
PROCESS_TAG, PROCESS = tracking.PROCESS_TAG, tracking.PROCESS


@dataclass(frozen=True)
class TrainResultSummary:
    """What ``train_and_register`` produced."""

    run_id: str
    data: IngestResult
    split: DataSplit
    training: TrainOutcome
    evaluation: Evaluation
    version: ModelRef


@dataclass(frozen=True)
class RetrainResult:
    """What a retrain run did: the run, the new version, its metrics, the decision; or, when
    a version was already trained on the same inputs, which one (and nothing was trained)."""

    run_id: str
    experiment_id: str
    version: ModelRef | None  # None when nothing was trained (`unchanged`)
    evaluation: Evaluation | None
    decision: PromotionDecision | None
    fingerprint: str
    # The version trained on all the data after a promotion (now champion); None without one.
    refit_version: ModelRef | None = None
    # How the champion in place before the run did on the data observed since it forecast.
    monitoring: MonitorResult | None = None
    # Readings of the training split the glitch rule finds.
    training_glitches: int = 0
    # Set when nothing was trained: the run's inputs would only repeat a decision.
    unchanged: Unchanged | None = None

    @property
    def champion_version(self) -> str | None:
        """The version `champion` points at after the run."""
        if self.refit_version is not None:
            return self.refit_version.version
        if self.unchanged is not None:
            return self.unchanged.champion
        return self.decision.champion_version


def training_inputs(settings: PipelineSettings, data_fingerprint: str) -> str | None:
    """A hash of everything a trained version depends on: the data, the model and training
    configuration, the split and the code; None when the code has uncommitted changes (or no
    known version), which the hash cannot see."""
    code = code_version()
    if code.endswith("-dirty") or code == "unknown":
        return None
    inputs = {
        "data": data_fingerprint,
        "model": dataclasses.asdict(settings.model_config_obj()),
        "train": dataclasses.asdict(settings.train_config_obj()),
        "val_length": settings.resolved_val_length,
        "backtest_windows": settings.backtest_windows,
        "short_series": settings.short_series,
        "code": code,
    }
    text = json.dumps(inputs, sort_keys=True, default=str)
    return f"sha256:{hashlib.sha256(text.encode()).hexdigest()}"


@dataclass(frozen=True)
class Unchanged:
    """Why a retrain trains nothing: the version trained on its inputs and the champion."""

    version: str  # the latest version trained on the run's inputs
    champion: str  # the champion's version
    reason: str


def unchanged(client: MlflowClient, settings: PipelineSettings, inputs: str) -> Unchanged | None:
    """Whether retraining on `inputs` (`training_inputs`) would only repeat a decision: the
    latest version trained on them is the champion (or the champion is its refit), or it was
    rejected against the present champion. None otherwise, so that a champion which was
    rolled back, replaced or never trained on these inputs is always challenged."""
    name = settings.model_name
    with tracking.tracking_errors(client.tracking_uri):
        versions = client.search_model_versions(
            f"name = '{name}' and tags.`{TRAINING_INPUTS}` = '{inputs}'"
        )
        if not versions:
            return None
        latest = max(versions, key=lambda v: int(v.version))
        try:
            champion = client.get_model_version_by_alias(name, CHAMPION)
        except MlflowException:
            return None  # no champion: train one
    version, champion_version = str(latest.version), str(champion.version)
    tags = latest.tags or {}
    if champion_version == version or (champion.tags or {}).get(REFIT_OF) == version:
        why = f"version {version}, trained on them, is @{CHAMPION}"
        if champion_version != version:
            why += f" (as its refit, version {champion_version})"
    elif (
        tags.get(DECISION) == "rejected" and tags.get("promotion.compared_with") == champion_version
    ):
        why = (
            f"version {version}, trained on them, was rejected against @{CHAMPION} "
            f"(version {champion_version})"
        )
    else:
        return None
    reason = (
        f"nothing to retrain: the data, configuration and code are unchanged and {why} "
        "(retrain_unchanged: true trains anyway)"
    )
    return Unchanged(version, champion_version, reason)


def _plan(settings: PipelineSettings, model_config: ModelConfig) -> SplitPlan:
    """The split for ``model_config`` resolved for the data (``ModelConfig.for_frequency``):
    the history in front of validation and test is the context the model will read."""
    return SplitPlan.from_config(
        model_config,
        val_length=settings.resolved_val_length,
        backtest_windows=settings.backtest_windows,
    )


def load_data(
    settings: PipelineSettings,
    data: str | Path | pd.DataFrame | None,
    *,
    to_train: bool = True,
) -> IngestResult:
    """Ingest ``data`` (or the configured source): with the length the split plan needs to
    train, or (``to_train`` false: monitoring, which only scores actuals) any length."""
    source = data if data is not None else settings.data
    if source is None:
        raise ForecasterInputError(
            "no data source: pass --data PATH or set FORECASTER_DATA / `data:` in the config",
            field="data",
        )
    # The length a series needs does not depend on the context, which the frequency may set.
    plan = _plan(settings, settings.model_config_obj().for_frequency(None))
    return ingest(
        source,
        covariates=settings.model_config_obj().covariates,
        min_length=plan.min_series_length if to_train else 1,
        time_column=settings.time_column,
        requirement=plan.describe() if to_train else "",
        leave_out_short=to_train and settings.short_series == "leave_out",
    )


def mark_stale_runs(client: MlflowClient, experiment_id: str) -> None:
    """End the RUNNING pipeline runs of this host that are not running any more.

    A run of a process that is gone is marked KILLED, as is one of an earlier process that had
    this process's pid (a restarted container's pipeline is pid 1 again); an earlier run of this
    very process (a scheduler whose tracking server vanished as that run ended) is marked
    FAILED. Only called while holding the pipeline lock, so no live run of this host can be
    among them.
    """
    host = socket.gethostname()
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"attributes.status = 'RUNNING' and tags.`{HOST_TAG}` = '{host}'",
        max_results=100,
    )
    for run in runs:
        pid = int(run.data.tags.get(PID_TAG, "0") or 0)
        process = run.data.tags.get(PROCESS_TAG, PROCESS)  # untagged runs: older versions'
        if pid == os.getpid() and process == PROCESS:
            error = "the run ended while the tracking server could not be reached"
            status = RunStatus.FAILED
        elif pid != os.getpid() and process_alive(pid):
            continue
        else:
            error, status = "process died before the run finished", RunStatus.KILLED
        client.set_tag(run.info.run_id, "error", error)
        client.set_terminated(run.info.run_id, status=RunStatus.to_string(status))
        logger.warning(
            "marked run %s (pid %d) as %s: %s",
            run.info.run_id,
            pid,
            RunStatus.to_string(status),
            error,
        )


class PipelineRun:
    """An MLflow run that ends FINISHED, FAILED or KILLED according to how its block exits."""

    def __init__(self, settings: PipelineSettings, kind: str, run_name: str | None = None):
        self.settings = settings
        self.kind = kind
        # A name that says what ran and when, where MLflow would draw a random one.
        started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        self.run_name = run_name or f"{kind} {started}"
        self.uri = settings.resolved_tracking_uri
        self.client = tracking.client(self.uri)
        self.experiment_id = ""
        self.run_id = ""
        self._uri_context = None

    @uninterruptible
    def __enter__(self) -> PipelineRun:
        tracking.check_reachable(self.uri)
        self.experiment_id = tracking.ensure_experiment(
            self.settings.experiment,
            tracking_uri=self.uri,
            artifact_location=self.settings.artifact_location,
        )
        with tracking.tracking_errors(self.uri):
            mark_stale_runs(self.client, self.experiment_id)
        self._uri_context = tracking.tracking_uri_set(self.uri)
        self._uri_context.__enter__()
        try:
            run = mlflow.start_run(
                experiment_id=self.experiment_id,
                run_name=self.run_name,
                tags={**tracking.run_tags(self.kind), "code_version": code_version()},
            )
        except BaseException:
            self._uri_context.__exit__(None, None, None)
            raise
        self.run_id = run.info.run_id
        logger.info(
            "MLflow run %s in experiment %r at %s", self.run_id, self.settings.experiment, self.uri
        )
        return self

    def log_data(self, data: IngestResult, **params: Any) -> None:
        """The data the run read (source, fingerprint, size, span) as its params, with
        `params`: every run says what its metrics were computed on."""
        log_params(self.client, self.run_id, {**data.as_params(), **params})

    @uninterruptible
    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                mlflow.end_run(RunStatus.to_string(RunStatus.FINISHED))
            else:
                killed = issubclass(exc_type, KeyboardInterrupt | SystemExit)
                try:
                    self.client.set_tag(self.run_id, "error", f"{exc_type.__name__}: {exc}"[:5000])
                finally:
                    mlflow.end_run(
                        RunStatus.to_string(RunStatus.KILLED if killed else RunStatus.FAILED)
                    )
        except Exception as failure:
            # The server may be what failed; never hide the original error behind this one.
            first_line = str(failure).strip().splitlines()[0] if str(failure).strip() else ""
            logger.warning(
                "could not mark run %s as ended: %s: %s",
                self.run_id,
                type(failure).__name__,
                first_line[:300],
            )
        finally:
            self._uri_context.__exit__(None, None, None)


def train_and_register(
    settings: PipelineSettings, data: IngestResult, run: PipelineRun
) -> TrainResultSummary:
    """Split, train, evaluate and register ``data`` inside ``run`` (which logged it:
    `PipelineRun.log_data`); alias `challenger`."""
    client = run.client
    inputs = training_inputs(settings, data.fingerprint)
    # Resolved once for this data, so that the split hands the model the history it reads and
    # the run's params show the context, patch and season it trained with.
    model_config = settings.model_config_obj().for_frequency(data.freq)
    parts = split(data.frame, _plan(settings, model_config))
    log_params(client, run.run_id, parts.as_params())
    outcome = train(
        parts,
        model_config,
        settings.train_config_obj(),
        client=client,
        run_id=run.run_id,
    )
    evaluation = evaluate(
        outcome.forecaster,
        data.frame,
        n_windows=settings.backtest_windows,
        client=client,
        run_id=run.run_id,
        plot_series=settings.plot_series,
    )
    version = register(
        outcome.forecaster,
        input_example(outcome.forecaster, parts.train),
        client=client,
        run_id=run.run_id,
        model_name=settings.model_name,
        tags={
            **({TRAINING_INPUTS: inputs} if inputs else {}),
            "data.fingerprint": data.fingerprint,
            "data.source": data.source,
            "data.end": time_label(data.end),
            "train.window_end": time_label(parts.val_end),
            "train.train_end": time_label(parts.train_end),
            "train.glitches": str(outcome.glitches),
            "code_version": code_version(),
            # Every backtest score: monitoring compares the realised MASE with backtest.mase,
            # step by step where the version has backtest.mase_by_step.
            **{f"backtest.{name}": f"{value:.6g}" for name, value in evaluation.model.items()},
            BACKTEST_MASE_BY_STEP: step_tag(evaluation.mase_by_step),
        },
        description=(
            f"Trained on {data.frame['unique_id'].nunique()} series of {data.source} up to "
            f"{time_label(parts.val_end)} (run {run.run_name}). Backtest MASE "
            f"{evaluation.model.get('mase', float('nan')):.4g} vs seasonal naive "
            f"{evaluation.baseline.get('mase', float('nan')):.4g} over the last "
            f"{evaluation.n_windows} x {evaluation.horizon} points of each series."
        ),
    )
    return TrainResultSummary(run.run_id, data, parts, outcome, evaluation, version)


def retrain(
    settings: PipelineSettings, data: str | Path | pd.DataFrame | None = None
) -> RetrainResult:
    """The whole pipeline as one MLflow run, holding the pipeline lock.

    Raises:
        PipelineLockedError: another run holds the lock.
        TrackingUnavailableError: the tracking server cannot be reached (before any work).
        ForecasterInputError: the data is bad (the run is recorded as FAILED).
    """
    with (
        pipeline_lock(settings.lock_file),
        tracking.tracking_errors(settings.resolved_tracking_uri),
        PipelineRun(settings, "retrain") as run,
    ):
        ingested = load_data(settings, data)
        run.log_data(ingested)
        monitoring = _monitor(settings, ingested, run)
        inputs = training_inputs(settings, ingested.fingerprint)
        same = None
        if inputs is not None and not settings.retrain_unchanged:
            same = unchanged(run.client, settings, inputs)
        if same is not None:
            logger.info("%s", same.reason)
            run.client.set_tag(run.run_id, UNCHANGED_TAG, same.reason[:5000])
            return RetrainResult(
                run_id=run.run_id,
                experiment_id=run.experiment_id,
                version=None,
                evaluation=None,
                decision=None,
                fingerprint=ingested.fingerprint,
                monitoring=monitoring,
                unchanged=same,
            )
        summary = train_and_register(settings, ingested, run)
        decision = promote_with_settings(settings, ingested.frame, summary.version.version)
        run.client.set_tag(
            run.run_id, "promotion.decision", "promoted" if decision.promoted else "rejected"
        )
        run.client.set_tag(run.run_id, "promotion.reason", decision.reason[:5000])
        refit_version = None
        if settings.refit and decision.promoted:
            refit_version = refit(
                summary.training,
                summary.version,
                ingested,
                client=run.client,
                run_id=run.run_id,
                model_name=settings.model_name,
            )
        return RetrainResult(
            run_id=run.run_id,
            experiment_id=run.experiment_id,
            version=summary.version,
            evaluation=summary.evaluation,
            decision=decision,
            fingerprint=ingested.fingerprint,
            refit_version=refit_version,
            monitoring=monitoring,
            training_glitches=summary.training.glitches,
        )


def _monitor(settings: PipelineSettings, data: IngestResult, run: PipelineRun) -> MonitorResult:
    return monitor(
        data,
        log_dir=settings.forecast_log,
        model_name=settings.model_name,
        tolerance=settings.degradation_tolerance,
        min_points=settings.degradation_min_points,
        client=run.client,
        run_id=run.run_id,
        spill_dir=settings.forecast_log_spill_dir,
    )


def check_champion(
    settings: PipelineSettings, data: str | Path | pd.DataFrame | None = None
) -> MonitorResult:
    """Score the logged forecasts against ``data`` as an MLflow run of its own (no training).

    Raises:
        PipelineLockedError: a pipeline run holds the lock.
        TrackingUnavailableError: the tracking server cannot be reached.
        ForecasterInputError: the data is bad.
    """
    with (
        pipeline_lock(settings.lock_file),
        tracking.tracking_errors(settings.resolved_tracking_uri),
        PipelineRun(settings, "monitor") as run,
    ):
        ingested = load_data(settings, data, to_train=False)
        run.log_data(ingested)
        return _monitor(settings, ingested, run)
