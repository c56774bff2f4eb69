"""The service's side of the forecast log: every forecast it serves is recorded for monitoring.

Forecasts are kept as they came (a list append in the inference thread or a batch job's
thread, nothing on the request's path) and become log rows in the flusher, which runs every
``forecast_log_flush_s`` seconds and at shutdown. Logging never
fails a request: a write error is logged and retried at the next flush, and rows past the
buffer's bound are dropped and counted (``forecaster_forecast_log_rows_total{outcome=
"dropped"}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq

from forecaster.outputs import ForecastArrays
from pipelines.forecast_log import ForecastLog, records
from service.inference import ItemForecast
from service.metrics import ServiceMetrics
from service.model_manager import ModelIdentity
from service.settings import ServiceSettings

logger = logging.getLogger(__name__)


class ServiceForecastLog:
    """Records served forecasts into a ``ForecastLog`` and flushes it periodically."""

    def __init__(
        self,
        directory: Path,
        metrics: ServiceMetrics,
        *,
        flush_s: float,
        retention_days: float,
        max_pending_rows: int = 2_000_000,
    ):
        self.log = ForecastLog(directory, retention_days=retention_days)
        self.metrics = metrics
        self.flush_s = flush_s
        self.max_pending_rows = max_pending_rows
        # Online forecasts as they came, turned into log rows at flush, off the request path.
        self._pending: list[tuple[ModelIdentity, ForecastArrays]] = []
        self._pending_rows = 0
        self._lock = threading.Lock()
        # The log's written and dropped rows already counted in the metrics: rows count as
        # logged once they are in a file, not when they enter the buffer.
        self._counted_written = self._counted_dropped = 0

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
        """Record one online request's forecast (inference thread)."""
        self.record(forecast.arrays, forecast.model.identity)

    def record(self, forecast: ForecastArrays, identity: ModelIdentity) -> None:
        """Keep a forecast to be logged at the next flush (a list append)."""
        rows = forecast.mean.size
        with self._lock:
            if self._pending_rows + rows > self.max_pending_rows:
                self.metrics.forecast_log_rows.labels("dropped").inc(rows)
                return
            self._pending.append((identity, forecast))
            self._pending_rows += rows

    def adopt(self, staged: Sequence[Path]) -> None:
        """Hand a finished batch job's staged log files over to the log (`ForecastLog.adopt`);
        a file that cannot be is reported and its rows counted as dropped."""
        for path in staged:
            try:
                self.log.adopt(path)
            except OSError as exc:
                logger.warning("forecast log: could not add %s: %s", path, exc)
                with contextlib.suppress(OSError):
                    rows = pq.ParquetFile(path).metadata.num_rows
                    self.metrics.forecast_log_rows.labels("dropped").inc(rows)
        self._count()

    def _count(self) -> None:
        written, dropped = self.log.written_rows, self.log.dropped_rows
        if written > self._counted_written:
            self.metrics.forecast_log_rows.labels("logged").inc(written - self._counted_written)
        if dropped > self._counted_dropped:
            self.metrics.forecast_log_rows.labels("dropped").inc(dropped - self._counted_dropped)
        self._counted_written, self._counted_dropped = written, dropped

    def flush(self) -> None:
        """Turn the pending online forecasts into log rows and write everything buffered."""
        with self._lock:
            pending, self._pending, self._pending_rows = self._pending, [], 0
        groups: dict[tuple[str, str, tuple[float, ...], int], list[ForecastArrays]] = {}
        for identity, arrays in pending:
            key = (identity.name, identity.version, arrays.levels, arrays.mean.shape[1])
            groups.setdefault(key, []).append(arrays)
        for (name, version, _, _), parts in groups.items():
            try:
                table = records(
                    ForecastArrays.concat(parts), model_name=name, model_version=version
                )
            except Exception:
                logger.exception("forecast log: could not record %d forecast(s)", len(parts))
                continue
            self.log.append(table)
        try:
            self.log.flush()
        except OSError as exc:
            logger.warning("forecast log: could not write to %s: %s", self.log.directory, exc)
        finally:
            self._count()

    async def run_flusher(self) -> None:
        """Flush every ``flush_s`` seconds until cancelled, then once more."""
        try:
            while True:
                await asyncio.sleep(self.flush_s)
                await asyncio.to_thread(self.flush)
        finally:
            with contextlib.suppress(BaseException):
                await asyncio.to_thread(self.flush)
            if lost := self.log.buffered_rows:  # the last write failed: nothing retries it
                logger.error("forecast log: %d row(s) could not be written and are lost", lost)
                self.metrics.forecast_log_rows.labels("dropped").inc(lost)
