"""Schedule: run ``retrain`` on a cron schedule.

Two schedulers never run at once (a second start exits at once with a clear error), and a
scheduled run never overlaps a manual one: each run takes the pipeline lock, and a tick that
finds it held is skipped. Ticks are never replayed: the next tick is always the first one
after *now*, so ticks that fell while a run was still going are skipped with a log line, and
ticks missed while the machine slept coalesce into the one run on waking. A failed run is
logged (its MLflow run is FAILED, or marked so by the next run if the tracking server was
what failed), leaves ``champion`` where it was, and the scheduler carries on.

With ``on_degradation`` a tick first scores the champion's logged forecasts (``check_champion``,
an MLflow run of kind ``monitor``) and retrains only when the champion is degraded or there is
none: retraining when it is needed rather than every night.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from forecaster.errors import ForecasterInputError, InvalidConfigError
from pipelines.errors import ModelNotFoundError, PipelineLockedError, TrackingUnavailableError
from pipelines.lock import pipeline_lock
from pipelines.registry import load_version, resolve_model
from pipelines.retrain import RetrainResult, check_champion, retrain
from pipelines.settings import PipelineSettings, cron_problem

logger = logging.getLogger(__name__)


@dataclass
class ScheduleReport:
    """What the scheduler did before it stopped (counts only: nothing accumulates)."""

    runs: int = 0
    succeeded: int = 0
    failed: int = 0
    skipped: int = 0  # ticks that found another pipeline run holding the lock
    overlapped_ticks: int = 0  # ticks that fell while a run of this scheduler was going
    healthy: int = 0  # ticks (with on_degradation) that found the champion healthy
    last_result: RetrainResult | None = None


def scheduler_lock_path(settings: PipelineSettings) -> Path:
    return settings.lock_file.with_name(settings.lock_file.name + ".scheduler")


def run_schedule(
    settings: PipelineSettings,
    *,
    cron: str | None = None,
    data: str | Path | None = None,
    max_runs: int | None = None,
    run_now: bool = False,
    on_degradation: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], datetime] | None = None,
) -> ScheduleReport:
    """Run ``retrain`` at every tick of ``cron`` (default: the ``schedule`` setting), read in
    the ``schedule_timezone`` setting's zone (default: the machine's).

    Args:
        max_runs: stop after this many ticks (None: run until interrupted).
        run_now: run once at start, before waiting for the first tick.
        on_degradation: retrain only at ticks where the champion is degraded (or absent).
        sleep, now: the time source (tests inject a fast clock; aware datetimes).

    Raises:
        PipelineLockedError: another scheduler is running.
    """
    expression = settings.schedule if cron is None else cron
    problem = cron_problem(expression)
    if problem:
        raise InvalidConfigError(f"cron: {problem}", field="cron")
    if on_degradation and settings.forecast_log is None:
        # With nothing logged nothing is scored, and every tick would read as healthy.
        raise InvalidConfigError(
            "--on-degradation judges the champion by its logged forecasts: expected a "
            "forecast_log directory, got none (forecast_log is empty)",
            field="forecast_log",
        )
    if now is None:
        zone = schedule_zone(settings.schedule_timezone)
        now = lambda: datetime.now(zone)  # noqa: E731
    report = ScheduleReport()
    with pipeline_lock(scheduler_lock_path(settings), what="scheduler"):
        first = run_now
        while max_runs is None or report.runs < max_runs:
            if not first:
                next_time = croniter(expression, now()).get_next(datetime)
                logger.info("next retrain at %s (cron %r)", next_time.isoformat(), expression)
                _sleep_until(next_time, sleep, now)
            first = False
            report.runs += 1
            started = now()
            try:
                run_settings = settings
                if on_degradation:
                    if not _needs_retrain(settings, data):
                        report.healthy += 1
                        continue
                    # The champion's state called for it: never skipped as unchanged.
                    run_settings = settings.model_copy(update={"retrain_unchanged": True})
                result = retrain(run_settings, data)
            except PipelineLockedError as exc:
                report.skipped += 1
                logger.warning("skipped this tick: %s", exc)
            except (ForecasterInputError, ModelNotFoundError, TrackingUnavailableError) as exc:
                # The run is marked FAILED in MLflow (by the next run if the server was down).
                report.failed += 1
                logger.error("scheduled retrain failed: %s", exc)
            except Exception:
                report.failed += 1
                logger.exception("scheduled retrain failed")
            else:
                report.succeeded += 1
                report.last_result = result
                if result.unchanged is not None:
                    logger.info("scheduled retrain: %s", result.unchanged.reason)
                else:
                    logger.info(
                        "scheduled retrain: version %s %s (%s)",
                        result.version.version,
                        "promoted" if result.decision.promoted else "not promoted",
                        result.decision.reason,
                    )
            overlapped = _ticks_between(expression, started, now())
            if overlapped:
                report.overlapped_ticks += overlapped
                logger.warning(
                    "skipped %d tick(s) of cron %r that fell during the run (%s to %s)",
                    overlapped,
                    expression,
                    started.isoformat(timespec="seconds"),
                    now().isoformat(timespec="seconds"),
                )
    return report


def schedule_zone(name: str | None) -> tzinfo:
    """The zone cron times are read in, with its daylight-saving rules: `name`, else the
    machine's (TZ, else /etc/localtime), else the fixed offset it has now. A fixed offset
    (what `datetime.now().astimezone()` gives) moved "0 3 * * *" to 02:00 after the autumn
    change, and ran it twice that night."""
    if name is not None:
        return ZoneInfo(name)
    given = os.environ.get("TZ", "").lstrip(":")
    if given:
        with contextlib.suppress(ZoneInfoNotFoundError, ValueError):
            return ZoneInfo(given)
    else:
        with contextlib.suppress(OSError, ValueError), open("/etc/localtime", "rb") as file:
            return ZoneInfo.from_file(file, key="localtime")
    zone = datetime.now().astimezone().tzinfo
    assert zone is not None
    return zone


def _needs_retrain(settings: PipelineSettings, data: str | Path | None) -> bool:
    check = check_champion(settings, data)
    if check.champion_version is None or check.degraded:
        logger.warning("retraining: %s", check.reason)
        return True
    # A champion that cannot be loaded serves nothing, so it logs nothing to be judged by.
    uri = settings.resolved_tracking_uri
    try:
        ref = resolve_model(
            f"models:/{settings.model_name}/{check.champion_version}", tracking_uri=uri
        )
        load_version(ref, tracking_uri=uri, device="cpu")
    except ModelNotFoundError as exc:  # UnloadableModelError included
        logger.warning("retraining: the champion serves nothing: %s", exc)
        return True
    logger.info("champion healthy, no retrain at this tick: %s", check.reason)
    return False


def _ticks_between(expression: str, start: datetime, end: datetime) -> int:
    ticks, count = croniter(expression, start), 0
    while ticks.get_next(datetime) <= end:
        count += 1
    return count


def _sleep_until(
    when: datetime, sleep: Callable[[float], None], now: Callable[[], datetime]
) -> None:
    # Short naps so a changed wall clock (suspend, NTP step) cannot make us oversleep a tick.
    while (remaining := (when - now()).total_seconds()) > 0:
        sleep(min(remaining, 30.0))
