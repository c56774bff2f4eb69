"""Train: fit the Forecaster on the training split, logging everything to an MLflow run."""

from __future__ import annotations

import logging
import platform
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from forecaster import EpochLog, Forecaster, ModelConfig, TrainConfig
from forecaster.config import HISTORY_BANDS, config_to_dict
from pipelines.split import DataSplit

logger = logging.getLogger(__name__)

_PACKAGES = ("forecaster", "torch", "numpy", "pandas", "mlflow", "safetensors", "pyarrow")


@dataclass(frozen=True)
class TrainOutcome:
    """A fitted model and how its training went."""

    forecaster: Forecaster
    best_epoch: int
    best_val_loss: float | None
    epochs: int
    seconds: float
    device: str
    glitches: int  # readings of the training data the glitch rule finds


class MlflowEpochLogger:
    """Per-epoch callback: train/val loss, learning rate and epoch time as MLflow metrics.

    Each epoch is sent as one batch request, so a slow server costs one round trip per epoch.
    """

    def __init__(self, client: MlflowClient, run_id: str):
        self.client = client
        self.run_id = run_id

    def __call__(self, log: EpochLog) -> None:
        now = int(time.time() * 1000)
        values = {
            "train_loss": log.train_loss,
            "val_loss": log.val_loss,
            "learning_rate": log.learning_rate,
            "epoch_seconds": log.seconds,
        }
        metrics = [
            Metric(key, float(value), now, log.epoch)
            for key, value in values.items()
            if value is not None
        ]
        self.client.log_batch(self.run_id, metrics=metrics)
        logger.info(
            "epoch %d: train_loss %.4f val_loss %s%s",
            log.epoch,
            log.train_loss,
            "-" if log.val_loss is None else f"{log.val_loss:.4f}",
            " (best)" if log.is_best else "",
        )


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def config_params(model_config: ModelConfig, train_config: TrainConfig) -> dict[str, Any]:
    params = {f"model.{k}": v for k, v in config_to_dict(model_config).items()}
    params.update({f"train.{k}": v for k, v in config_to_dict(train_config).items()})
    return params


def log_params(client: MlflowClient, run_id: str, params: dict[str, Any]) -> None:
    """Log params in batches (MLflow caps a batch at 100 params and a value at 6000 chars)."""
    items = [Param(key, str(value)[:6000]) for key, value in params.items()]
    for begin in range(0, len(items), 100):
        client.log_batch(run_id, params=items[begin : begin + 100])


def train(
    data: DataSplit,
    model_config: ModelConfig,
    train_config: TrainConfig,
    *,
    client: MlflowClient,
    run_id: str,
) -> TrainOutcome:
    """Fit a Forecaster on ``data.train`` with early stopping on ``data.val``.

    Logs to run ``run_id``: every model and train config value, package versions, the seed,
    the device, per epoch train loss, validation loss and learning rate, why training ended
    (tag ``training_ended``: ``plateau``, ``max_epochs`` or ``out_of_time``), and how many
    readings of the training data the glitch rule finds (`training_glitches`; listed in the
    artifact ``data/training_glitches.csv`` when there are any).
    """
    forecaster = Forecaster(model_config, train_config)
    params = config_params(model_config, train_config)
    params.update({f"version.{k}": v for k, v in package_versions().items()})
    params["seed"] = train_config.seed
    params["device"] = str(forecaster.device)
    log_params(client, run_id, params)
    logger.info(
        "training on %d rows (%d series) on %s",
        len(data.train),
        data.train["unique_id"].nunique(),
        forecaster.device,
    )
    started = time.perf_counter()
    forecaster.fit(data.train, val_df=data.val, callbacks=[MlflowEpochLogger(client, run_id)])
    seconds = time.perf_counter() - started
    result = forecaster.train_result
    outcome = TrainOutcome(
        forecaster=forecaster,
        best_epoch=result.best_epoch if result else 0,
        best_val_loss=result.best_val_loss if result else None,
        epochs=len(result.epochs) if result else 0,
        seconds=seconds,
        device=str(forecaster.device),
        glitches=result.n_glitches if result else 0,
    )
    summary = {
        "train_seconds": seconds,
        "best_epoch": float(outcome.best_epoch),
        "training_glitches": float(outcome.glitches),
    }
    if result:
        # The factor of windows with more than L/2 of history, then one per shorter band.
        *shorter, summary["interval_scale"] = result.interval_scale
        for band, factor in zip(HISTORY_BANDS[:-1], shorter, strict=True):
            summary[f"interval_scale.history_{band}"] = factor
        # The share of the way to the drift forecast that forecasts move (0: none).
        summary["drift_weight"] = result.drift_weight
    if outcome.best_val_loss is not None:
        summary["best_val_loss"] = float(outcome.best_val_loss)
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in summary.items()])
    client.set_tag(run_id, "device", outcome.device)
    if result:
        # The bands of history whose forecasts impute their left padding (the rest read it as
        # the window mean), as validation chose them.
        imputed = [b for b, i in zip(HISTORY_BANDS, result.impute_padding, strict=True) if i]
        client.set_tag(run_id, "padding_imputed", ",".join(imputed) or "none")
        # Why the epochs stopped where they did: a budgeted run that ran out of time trained
        # less than its data supports, which its learning curves alone do not say.
        ended = "max_epochs"
        if result.out_of_time:
            ended = "out_of_time"
        elif result.stopped_early:
            ended = "plateau"
        client.set_tag(run_id, "training_ended", ended)
    glitches = forecaster.training_glitches
    if glitches is not None and len(glitches):
        logger.info(
            "%d readings of %d series in the training data look like glitches%s",
            len(glitches),
            glitches["unique_id"].nunique(),
            " and were left out" if train_config.mask_training_glitches else "",
        )
        with tempfile.TemporaryDirectory() as tmp:
            listed = Path(tmp) / "training_glitches.csv"
            glitches.to_csv(listed, index=False)
            client.log_artifact(run_id, str(listed), "data")
    return outcome
