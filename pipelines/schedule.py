"""Schedule: run ``retrain`` on a cron schedule.

Two schedulers never run at once (a second start exits at once with a clear error), and a
scheduled run never overlaps a manual one: each run takes the pipeline lock, and a tick that
finds it held is skipped. A failed run is logged (its MLflow run is FAILED), leaves
``champion`` where it was, and the scheduler carries on with the next tick.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from croniter import croniter

from forecaster.errors import ForecasterInputError, InvalidConfigError
from pipelines.errors import ModelNotFoundError, PipelineLockedError, TrackingUnavailableError
from pipelines.lock import pipeline_lock
from pipelines.retrain import RetrainResult, retrain
from pipelines.settings import PipelineSettings

logger = logging.getLogger(__name__)


@dataclass
class ScheduleReport:
    """What the scheduler did before it stopped."""

    runs: int = 0
    succeeded: int = 0
    failed: int = 0
    skipped: int = 0
    results: list[RetrainResult] = field(default_factory=list)


def scheduler_lock_path(settings: PipelineSettings) -> Path:
    return settings.lock_file.with_name(settings.lock_file.name + ".scheduler")


def run_schedule(
    settings: PipelineSettings,
    *,
    cron: str | None = None,
    data: str | Path | None = None,
    max_runs: int | None = None,
    run_now: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> ScheduleReport:
    """Run ``retrain`` at every tick of ``cron`` (default: the ``schedule`` setting).

    Args:
        max_runs: stop after this many ticks (None: run until interrupted).
        run_now: run once at start, before waiting for the first tick.

    Raises:
        PipelineLockedError: another scheduler is running.
    """
    expression = cron or settings.schedule
    if not croniter.is_valid(expression):
        raise InvalidConfigError(
            f"cron: expected a cron expression such as '0 3 * * *', got {expression!r}",
            field="cron",
        )
    report = ScheduleReport()
    with pipeline_lock(scheduler_lock_path(settings), what="scheduler"):
        ticks = croniter(expression, datetime.now().astimezone())
        first = run_now
        while max_runs is None or report.runs < max_runs:
            if not first:
                next_time = ticks.get_next(datetime)
                logger.info("next retrain at %s (cron %r)", next_time.isoformat(), expression)
                _sleep_until(next_time, sleep)
            first = False
            report.runs += 1
            try:
                result = retrain(settings, data)
            except PipelineLockedError as exc:
                report.skipped += 1
                logger.warning("skipped this tick: %s", exc)
            except (ForecasterInputError, ModelNotFoundError, TrackingUnavailableError) as exc:
                # The run is already marked FAILED in MLflow; champion was not touched.
                report.failed += 1
                logger.error("scheduled retrain failed, champion unchanged: %s", exc)
            except Exception:
                report.failed += 1
                logger.exception("scheduled retrain failed, champion unchanged")
            else:
                report.succeeded += 1
                report.results.append(result)
                logger.info(
                    "scheduled retrain: version %s %s (%s)",
                    result.version.version,
                    "promoted" if result.decision.promoted else "not promoted",
                    result.decision.reason,
                )
    return report


def _sleep_until(when: datetime, sleep: Callable[[float], None]) -> None:
    # Short naps so a changed wall clock (suspend, NTP step) cannot make us oversleep a tick.
    while (remaining := (when - datetime.now().astimezone()).total_seconds()) > 0:
        sleep(min(remaining, 30.0))
