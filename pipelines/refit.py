"""Refit: after a promotion, train the promoted configuration on every point and serve that.

The evaluated model was trained without its validation and backtest windows, the most recent
data, so that it could be judged. Once it has been judged (and promoted), its configuration is
trained again on all the data along the same path: one epoch per epoch the evaluated run kept,
at the same learning rates (`TrainResult.kept_lr_factors`), or the linear start alone when the
evaluated run kept epoch 0. The refit is registered as a new version linked both ways to the
evaluated one (`refit.of_version` / `refit.version`), carries its scores and promotion tags,
and takes the `champion` alias; ``rollback`` goes back past it as for any champion.

Caveat for the next promotion: a refit champion has seen the data up to its own
`train.window_end`; if fewer than `backtest_windows` horizons of new data have arrived since,
it is scored on windows it has trained on, which favours keeping it.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime

from forecaster import Forecaster
from forecaster.errors import TrainingDivergedError
from forecaster.time_axis import time_label
from pipelines import tracking
from pipelines.ingest import IngestResult
from pipelines.promote import DECISION, PREVIOUS_CHAMPION
from pipelines.register import code_version, input_example, register
from pipelines.registry import CHAMPION, ModelRef
from pipelines.train import TrainOutcome, config_params, log_params

logger = logging.getLogger(__name__)

# Version tags
REFIT_OF, REFIT_VERSION = "refit.of_version", "refit.version"


def refit(
    evaluated: TrainOutcome,
    evaluated_version: ModelRef,
    data: IngestResult,
    *,
    client,
    run_id: str,
    model_name: str,
) -> ModelRef | None:
    """Train ``evaluated``'s configuration on all of ``data``, register it, make it champion;
    None when the refit diverges (``evaluated_version`` stays champion, the run says why).

    The refit trains in a run of its own, nested under ``run_id`` (the retrain's): its params
    (the data it saw, the replayed configuration) and training loss are what the refit
    version's page links to, not the evaluated training's."""
    with tracking.tracking_errors(client.tracking_uri):
        child = client.create_run(
            client.get_run(run_id).info.experiment_id,
            run_name=f"refit of version {evaluated_version.version} "
            f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M:%S UTC')}",
            tags={
                **tracking.run_tags("refit"),
                tracking.PARENT_RUN_TAG: run_id,
                REFIT_OF: evaluated_version.version,
                "code_version": code_version(),
            },
        ).info.run_id
    status = "FAILED"
    try:
        version = _refit_in(child, evaluated, evaluated_version, data, client, run_id, model_name)
        status = "FINISHED" if version is not None else "FAILED"
        return version
    except BaseException as exc:
        status = "KILLED" if isinstance(exc, KeyboardInterrupt | SystemExit) else "FAILED"
        with contextlib.suppress(Exception):  # never hide the error behind the server's
            client.set_tag(child, "error", f"{type(exc).__name__}: {exc}"[:5000])
        raise
    finally:
        with contextlib.suppress(Exception):
            client.set_terminated(child, status=status)


def _refit_in(
    child: str,
    evaluated: TrainOutcome,
    evaluated_version: ModelRef,
    data: IngestResult,
    client,
    run_id: str,
    model_name: str,
) -> ModelRef | None:
    """`refit`'s work inside the run `child`."""
    model = evaluated.forecaster
    # The evaluated run kept epoch 0 (the linear start) when no epoch was kept: replaying no
    # epoch fits the linear start alone, on every window. The intervals' calibration is
    # replayed too: a refit holds no windows out to calibrate on.
    replay = model.refit_config()
    factors = replay.replay_lr_factors
    with tracking.tracking_errors(client.tracking_uri):
        log_params(
            client,
            child,
            {
                **config_params(model.model_config, replay),
                **data.as_params(),
                REFIT_OF: evaluated_version.version,
            },
        )
    try:
        refitted = Forecaster(model.model_config, replay).fit(data.frame)
    except TrainingDivergedError as exc:
        # The evaluated version stays champion: it was judged, the refit would forecast NaN.
        logger.warning(
            "refit skipped, version %s stays @%s: %s", evaluated_version.version, CHAMPION, exc
        )
        with tracking.tracking_errors(client.tracking_uri):
            client.set_tag(run_id, "refit_skipped", str(exc)[:5000])
            client.set_tag(child, "error", str(exc)[:5000])
        return None
    logger.info(
        "refit version %s's configuration on all %d series up to %s: %d epoch(s)",
        evaluated_version.version,
        data.frame["unique_id"].nunique(),
        time_label(data.end),
        len(factors),
    )
    with tracking.tracking_errors(client.tracking_uri):
        for log in refitted.train_result.epochs:
            client.log_metric(child, "train_loss", log.train_loss, step=log.epoch)
        evaluated_tags = client.get_model_version(model_name, evaluated_version.version).tags
        # The decision is tagged once the alias has moved, as promotion tags it: a run killed
        # in between leaves a version without it, never one that says "promoted" and is not
        # champion.
        carried = {
            k: v
            for k, v in evaluated_tags.items()
            if k.startswith(("backtest.", "promotion.", "data.")) and k != DECISION
        }
        # The champion the evaluated version replaced is the one to roll back to; tagged at
        # creation, so the version never holds the alias without it.
        previous = evaluated_tags.get(PREVIOUS_CHAMPION)
        version = register(
            refitted,
            input_example(refitted, data.frame),
            client=client,
            run_id=child,
            model_name=model_name,
            artifact_name="model-refit",
            tags={
                **carried,
                REFIT_OF: evaluated_version.version,
                "train.data": "all",
                "train.window_end": time_label(data.end),
                "train.epochs": str(len(factors)),
                "train.glitches": str(refitted.train_result.n_glitches),
                "code_version": code_version(),
                **({PREVIOUS_CHAMPION: previous} if previous is not None else {}),
            },
            # Straight to champion: it was never evaluated, so it is no challenger, and the
            # evaluated version keeps @challenger.
            alias=CHAMPION,
            run_tag="refit_version",
            description=(
                f"Refit of version {evaluated_version.version} on all "
                f"{data.frame['unique_id'].nunique()} series of {data.source} up to "
                f"{time_label(data.end)}: its configuration, epochs and learning rates, the "
                "validation and backtest windows included; serves as champion in its place "
                "(its scores are version "
                f"{evaluated_version.version}'s)."
            ),
        )
        if DECISION in evaluated_tags:
            client.set_model_version_tag(
                model_name, version.version, DECISION, evaluated_tags[DECISION]
            )
        client.set_model_version_tag(
            model_name, evaluated_version.version, REFIT_VERSION, version.version
        )
        client.set_tag(run_id, "refit_version", version.version)
    logger.info(
        "%s version %s, the refit of version %s, is now @%s",
        model_name,
        version.version,
        evaluated_version.version,
        CHAMPION,
    )
    return version
