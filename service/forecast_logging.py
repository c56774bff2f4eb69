"""The service's side of the forecast log: every forecast it serves is recorded for monitoring.

Online forecasts are recorded in the inference thread (a small Arrow table per request) and
batch-job forecasts in the job's thread; a background task writes the buffer every
``forecast_log_flush_s`` seconds and at shutdown. Logging never fails a request: a write
error is logged and retried at the next flush, and rows past the buffer's bound are dropped
and counted (``forecaster_forecast_log_rows_total{outcome="dropped"}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import pandas as pd

from pipelines.forecast_log import ForecastLog, records, records_from_frames
from service.inference import ItemForecast
from service.metrics import ServiceMetrics
from service.model_manager import ModelIdentity
from service.settings import ServiceSettings

logger = logging.getLogger(__name__)


class ServiceForecastLog:
    """Records served forecasts into a ``ForecastLog`` and flushes it periodically."""

    def __init__(
        self, directory: Path, metrics: ServiceMetrics, *, flush_s: float, retention_days: float
    ):
        self.log = ForecastLog(directory, retention_days=retention_days)
        self.metrics = metrics
        self.flush_s = flush_s

    @classmethod
    def from_settings(
        cls, settings: ServiceSettings, metrics: ServiceMetrics
    ) -> ServiceForecastLog | None:
        if not settings.forecast_log:
            return None
        assert settings.forecast_log_dir is not None  # set by the settings' validator
        return cls(
            settings.forecast_log_dir,
            metrics,
            flush_s=settings.forecast_log_flush_s,
            retention_days=settings.forecast_log_retention_days,
        )

    def record_item(self, forecast: ItemForecast) -> None:
        """Record one online request's forecast (called in the inference thread)."""
        s, h = forecast.mean.shape
        identity = forecast.model.identity
        history = forecast.parts.history
        self._append(
            lambda: records(
                model_name=identity.name,
                model_version=identity.version,
                unique_id=pd.Series(forecast.series_ids).repeat(h).to_numpy(),
                ds=forecast.timestamps.reshape(s * h),
                mean=forecast.mean.reshape(s * h),
                quantiles={q: a.reshape(s * h) for q, a in forecast.quantiles.items()},
                history_ids=history["unique_id"],
                history_ds=history["ds"],
            )
        )

    def record_frame(
        self, forecast: pd.DataFrame, history: pd.DataFrame, identity: ModelIdentity
    ) -> None:
        """Record a batch job's forecast of one chunk of series (called in the job's thread)."""
        self._append(
            lambda: records_from_frames(
                forecast, history, model_name=identity.name, model_version=identity.version
            )
        )

    def _append(self, build) -> None:
        try:
            table = build()
            dropped_before = self.log.dropped_rows
            self.log.append(table)
        except Exception:  # never fail a forecast because it could not be logged
            logger.exception("forecast log: could not record a forecast")
            return
        dropped = self.log.dropped_rows - dropped_before
        self.metrics.forecast_log_rows.labels("logged").inc(table.num_rows - dropped)
        if dropped:
            self.metrics.forecast_log_rows.labels("dropped").inc(dropped)

    def flush(self) -> None:
        try:
            self.log.flush()
        except OSError as exc:
            logger.warning("forecast log: could not write to %s: %s", self.log.directory, exc)

    async def run_flusher(self) -> None:
        """Flush every ``flush_s`` seconds until cancelled, then once more."""
        try:
            while True:
                await asyncio.sleep(self.flush_s)
                await asyncio.to_thread(self.flush)
        finally:
            with contextlib.suppress(BaseException):
                await asyncio.to_thread(self.flush)
