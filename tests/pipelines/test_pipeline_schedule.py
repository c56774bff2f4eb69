"""The scheduler on a fast clock: real retrains, with one real second worth one hour."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

import pytest
from croniter import croniter

from pipelines.schedule import _ticks_between, run_schedule
from tests.pipelines.pipeline_helpers import make_settings


class FastClock:
    """Wall time, sped up: the scheduler's time source and nothing else is replaced."""

    def __init__(self, speed: float, start: datetime):
        self.speed, self.start, self.real_start = speed, start, time.monotonic()
        self.waits: list[tuple[datetime, datetime]] = []  # (when, the tick it waits for)

    def now(self) -> datetime:
        return self.start + timedelta(seconds=(time.monotonic() - self.real_start) * self.speed)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds / self.speed)


def test_ticks_during_a_long_run_are_skipped_not_replayed(store, data_csv, caplog):
    """An hourly cron whose run takes hours (in clock time) runs again at the next tick after
    it ends: no back-to-back replays of the ticks it overlapped."""
    clock = FastClock(speed=3600.0, start=datetime(2026, 1, 1, 0, 30).astimezone())
    # Every run trains (on version 1's inputs alone a run would train nothing, in no time).
    settings = make_settings(store, data=str(data_csv), retrain_unchanged=True)

    class Waits(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("next retrain at "):
                tick = datetime.fromisoformat(record.args[0])
                clock.waits.append((clock.now(), tick))

    handler = Waits()
    logging.getLogger("pipelines.schedule").addHandler(handler)
    caplog.set_level(logging.INFO, logger="pipelines.schedule")
    try:
        report = run_schedule(
            settings, cron="0 * * * *", max_runs=2, run_now=True, sleep=clock.sleep, now=clock.now
        )
    finally:
        logging.getLogger("pipelines.schedule").removeHandler(handler)
    assert (report.runs, report.succeeded, report.failed) == (2, 2, 0)
    # each real retrain lasts seconds, i.e. hours on this clock: the ticks it spans are skipped
    assert report.overlapped_ticks >= 2
    assert "tick(s) of cron '0 * * * *' that fell during the run" in caplog.text
    assert len(clock.waits) == 1  # one wait between the two runs ...
    logged_at, next_tick = clock.waits[0]
    assert next_tick > logged_at  # ... for a tick still in the future, never a missed one
    assert next_tick - logged_at <= timedelta(hours=1)
    assert report.last_result is not None and not hasattr(report, "results")


def test_a_tick_at_the_very_end_of_a_run_counts_as_skipped():
    """The wait after a run takes the first tick after its end, so a tick that falls exactly
    at the end is never run: it is one of the skipped ticks the report counts."""
    start = datetime(2024, 1, 1, 0, 30, tzinfo=UTC)
    end = datetime(2024, 1, 1, 2, 0, tzinfo=UTC)
    assert croniter("0 * * * *", end).get_next(datetime) == end + timedelta(hours=1)
    assert _ticks_between("0 * * * *", start, end) == 2  # 01:00 and 02:00


@pytest.mark.parametrize("legacy", [False, True])
def test_a_run_left_running_by_this_process_is_marked_failed_by_the_next(tmp_path, legacy):
    """The tracking server vanished as a scheduled run ended: the next run ends it FAILED.
    Runs carry the tags `run_tags` gives them; those of older versions had no process tag."""
    import os
    import socket

    from pipelines import tracking
    from pipelines.retrain import HOST_TAG, PID_TAG, mark_stale_runs

    client = tracking.client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("forecaster", artifact_location=str(tmp_path / "a"))
    tags = (
        {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}
        if legacy
        else tracking.run_tags("retrain")
    )
    left = client.create_run(experiment, tags=tags).info.run_id
    mark_stale_runs(client, experiment)
    run = client.get_run(left)
    assert run.info.status == "FAILED"
    assert "tracking server" in run.data.tags["error"]


def test_a_run_of_an_earlier_process_with_this_pid_is_marked_killed(tmp_path):
    """A restarted container's pipeline is pid 1 again: the run its predecessor left running
    was killed, not ended by this process losing its tracking server."""
    import os
    import socket

    from pipelines import tracking
    from pipelines.retrain import HOST_TAG, PID_TAG, PROCESS_TAG, mark_stale_runs

    client = tracking.client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("forecaster", artifact_location=str(tmp_path / "a"))
    tags = {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid()), PROCESS_TAG: "before"}
    left = client.create_run(experiment, tags=tags).info.run_id
    mark_stale_runs(client, experiment)
    run = client.get_run(left)
    assert run.info.status == "KILLED"
    assert "process died" in run.data.tags["error"]


def test_nightly_ticks_stay_at_their_local_hour_across_daylight_saving(monkeypatch):
    """Ticks were computed in the fixed offset of the moment (`datetime.now().astimezone()`):
    after the autumn change "0 3 * * *" fell at 02:00 and then 03:00 the same night, and at
    04:00 after the spring one. Read in the machine's zone (TZ here), every night once at 03:00."""
    from croniter import croniter

    from pipelines.schedule import schedule_zone

    monkeypatch.setenv("TZ", "Europe/Berlin")
    zone = schedule_zone(None)
    autumn = datetime(2026, 10, 24, 3, 1, tzinfo=zone)  # the change is on the 25th
    spring = datetime(2026, 3, 28, 3, 1, tzinfo=zone)  # and on 29 March
    for start, offsets in ((autumn, [1, 1, 1]), (spring, [2, 2, 2])):
        ticks = croniter("0 3 * * *", start)
        nights = [ticks.get_next(datetime) for _ in range(3)]
        assert [(t.day - start.day, t.hour, t.minute) for t in nights] == [
            (1, 3, 0),
            (2, 3, 0),
            (3, 3, 0),
        ]
        assert [n.utcoffset() for n in nights] == [timedelta(hours=h) for h in offsets]
    assert str(schedule_zone("America/New_York")) == "America/New_York"  # the setting wins


def test_without_tz_the_machines_zone_file_gives_its_daylight_saving_rules(monkeypatch):
    """Without TZ the zone is /etc/localtime's, a zone with rules (not the offset of the
    moment, which the test above shows moving a nightly tick by an hour)."""
    from pathlib import Path
    from zoneinfo import ZoneInfo

    from pipelines.schedule import schedule_zone

    if not Path("/etc/localtime").is_file():
        pytest.skip("this machine has no /etc/localtime")
    monkeypatch.delenv("TZ", raising=False)
    zone = schedule_zone(None)
    assert isinstance(zone, ZoneInfo)
    assert datetime.now(zone).utcoffset() == datetime.now().astimezone().utcoffset()


def test_the_scheduler_itself_waits_for_the_settings_local_hour(store, monkeypatch, caplog):
    """`run_schedule` without an injected clock reads the wall clock in `schedule_timezone`:
    on the eve of the autumn change the next "0 3 * * *" is 03:00 Berlin winter time."""
    from pipelines import schedule

    instant = datetime(2026, 10, 24, 12, 0, tzinfo=UTC)

    class FixedClock(datetime):
        @classmethod
        def now(cls, tz=None):
            return instant.astimezone(tz)

    class Stop(Exception):
        pass

    def sleep(seconds: float) -> None:
        raise Stop

    monkeypatch.setattr(schedule, "datetime", FixedClock)
    settings = make_settings(store, schedule_timezone="Europe/Berlin")
    caplog.set_level(logging.INFO, logger="pipelines.schedule")
    with pytest.raises(Stop):
        run_schedule(settings, cron="0 3 * * *", max_runs=1, sleep=sleep)
    assert "next retrain at 2026-10-25T03:00:00+01:00" in caplog.text


def test_an_unknown_schedule_timezone_is_refused_naming_it():
    import pytest

    from forecaster.errors import InvalidConfigError
    from pipelines.settings import PipelineSettings

    with pytest.raises(InvalidConfigError, match="schedule_timezone: .*IANA time zone"):
        PipelineSettings.load(schedule_timezone="Mars/Olympus_Mons")
