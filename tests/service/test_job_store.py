"""The batch-job store's queue rules, on a real SQLite file: which job a worker takes, when a
job whose worker is gone is taken again, and what only a job's own worker may change."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time

import pytest

from service.job_store import MAX_ATTEMPTS, Job, JobStore, new_owner

ME = new_owner()
LEASE_S = 3600.0


@pytest.fixture()
def store(tmp_path) -> JobStore:
    store = JobStore(tmp_path / "jobs.db")
    yield store
    store.close()


def _create(store: JobStore, job_id: str, created_at: float, **values) -> Job:
    return store.create(
        id=job_id,
        created_at=created_at,
        input_path=f"{job_id}.csv",
        input_format="csv",
        input_bytes=10,
        output_format="csv",
        **values,
    )


def _running(store: JobStore, job_id: str, owner: str, heartbeat_at: float, attempts: int = 1):
    """A job some worker took (and may since have lost)."""
    _create(store, job_id, created_at=1.0)
    store._execute(
        "UPDATE jobs SET status = 'running', owner = :owner, heartbeat_at = :at, "
        "started_at = :at, attempts = :attempts WHERE id = :id",
        owner=owner,
        at=heartbeat_at,
        attempts=attempts,
        id=job_id,
    )


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_store_on_a_fresh_volume_creates_its_directory(tmp_path):
    store = JobStore(tmp_path / "fresh" / "service" / "jobs.db")
    try:
        job = _create(store, "job", created_at=1.0, input_owned=False)  # a file under input_dir
        assert store.get("job") == job and not job.input_owned
    finally:
        store.close()


def test_a_reader_holds_up_no_worker_and_sees_what_was_committed(tmp_path):
    """The API lists jobs while workers write their progress: a read in progress must not
    make a worker's commit wait (the write-ahead log), nor see a half-made change."""
    store = JobStore(tmp_path / "jobs.db")
    reader = sqlite3.connect(tmp_path / "jobs.db", timeout=0, isolation_level=None)
    try:
        _create(store, "job", created_at=1.0)
        reader.execute("BEGIN")
        assert reader.execute("SELECT status FROM jobs").fetchall() == [("queued",)]
        started = time.monotonic()
        assert store.cancel("job").status == "cancelled"
        assert time.monotonic() - started < 5  # a rollback journal waits out the reader
        assert reader.execute("SELECT status FROM jobs").fetchall() == [("queued",)]
        reader.execute("COMMIT")
        assert reader.execute("SELECT status FROM jobs").fetchall() == [("cancelled",)]
    finally:
        reader.close()
        store.close()


def test_the_oldest_queued_job_is_taken_first_and_once(store):
    assert store.claim(ME, LEASE_S) is None
    _create(store, "newer", created_at=2.0)
    _create(store, "older", created_at=1.0)
    first = store.claim(ME, LEASE_S)
    assert (first.id, first.status, first.owner, first.attempts) == ("older", "running", ME, 1)
    assert first.input_owned  # an uploaded input is the job's, deleted with it
    assert not first.resumed and first.started_at is not None
    assert store.claim(ME, LEASE_S).id == "newer"
    assert store.claim(ME, LEASE_S) is None  # both are running under a live owner
    assert store.count_pending() == 2


def test_a_job_handed_back_is_resumed_by_the_next_claim(store):
    _create(store, "job", created_at=1.0)
    taken = store.claim(ME, LEASE_S)
    store.release("job", "someone else")  # only the job's worker gives it back
    assert store.get("job").status == "running"
    store.release("job", ME)
    back = store.get("job")
    assert (back.status, back.owner, back.attempts) == ("queued", None, 0)
    again = store.claim(ME, LEASE_S)
    assert again.resumed and again.started_at == taken.started_at and again.attempts == 1


def test_another_hosts_job_is_taken_only_once_its_lease_has_run_out(store):
    now = time.time()
    other = f"another-host:{os.getpid()}:0123456789ab"
    _running(store, "live", other, heartbeat_at=now - LEASE_S + 60)
    assert store.claim(ME, LEASE_S) is None
    store._execute("UPDATE jobs SET heartbeat_at = :at WHERE id = 'live'", at=now - LEASE_S - 1)
    taken = store.claim(ME, LEASE_S)
    assert (taken.id, taken.owner, taken.attempts) == ("live", ME, 2) and taken.resumed


@pytest.mark.parametrize(
    "owner",
    [
        pytest.param(lambda host, pid, token: f"{host}:{_dead_pid()}:{token}", id="pid gone"),
        pytest.param(lambda host, pid, token: f"{host}:{pid}:feedfacefeed", id="pid reused"),
        pytest.param(lambda host, pid, token: "worker-1", id="unreadable"),
        pytest.param(lambda host, pid, token: None, id="none"),
    ],
)
def test_this_hosts_job_whose_worker_is_gone_is_taken_at_once(store, owner):
    """On SQLite every worker is on this host, so a lost one is known without its lease: a
    restarted container reuses its pid under another token."""
    host, pid, token = ME.rsplit(":", 2)
    _running(store, "lost", owner(host, pid, token), heartbeat_at=time.time())
    assert store.claim(ME, LEASE_S).id == "lost"


def test_a_job_whose_worker_lives_is_not_taken_within_its_lease(store):
    _running(store, "mine", ME, heartbeat_at=time.time())
    assert store.claim(ME, LEASE_S) is None
    assert store.get("mine").attempts == 1


def test_a_job_of_another_live_worker_process_on_this_host_is_left_to_it(store):
    """Several service processes on one host share a SQLite store: one's job is not taken by
    another while its process lives, and is once it has gone."""
    host = ME.rsplit(":", 2)[0]
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _running(store, "theirs", f"{host}:{worker.pid}:0123456789ab", heartbeat_at=time.time())
        assert store.claim(ME, LEASE_S) is None
    finally:
        worker.kill()
        worker.wait()
    assert store.claim(ME, LEASE_S).id == "theirs"


def test_a_job_that_lost_its_worker_too_often_fails_instead_of_running_again(store):
    expired = time.time() - LEASE_S - 1
    other = "another-host:1:0123456789ab"
    _running(store, "retry", other, heartbeat_at=expired, attempts=MAX_ATTEMPTS - 1)
    assert store.claim(ME, LEASE_S).attempts == MAX_ATTEMPTS
    store.finish("retry", ME, "succeeded")
    _running(store, "doomed", other, heartbeat_at=expired, attempts=MAX_ATTEMPTS)
    assert store.claim(ME, LEASE_S) is None
    failed = store.get("doomed")
    assert (failed.status, failed.owner, failed.error["error"]) == ("failed", None, "worker_lost")
    assert f"stopped {MAX_ATTEMPTS} times" in failed.error["detail"]


def test_only_a_jobs_worker_reports_on_it_and_finishes_it(store):
    _create(store, "job", created_at=1.0)
    store.claim(ME, LEASE_S)
    assert not store.update("job", "someone else", rows_done=5)
    assert store.update("job", ME, rows_done=5) and store.get("job").rows_done == 5
    assert not store.finish("job", "someone else", "succeeded")
    assert store.finish("job", ME, "failed", error={"error": "bad", "detail": "x"})
    done = store.get("job")
    assert (done.status, done.owner, done.error) == (
        "failed",
        None,
        {"error": "bad", "detail": "x"},
    )
    assert not store.update("job", ME, rows_done=6)  # a finished job takes no more reports


def test_cancel_ends_waiting_and_running_jobs_only(store):
    _create(store, "queued", created_at=1.0)
    assert store.cancel("queued").status == "cancelled"
    _create(store, "done", created_at=2.0)
    store.claim(ME, LEASE_S)
    store.finish("done", ME, "succeeded")
    assert store.cancel("done").status == "succeeded"
    assert store.cancel("unknown") is None


def test_jobs_that_ended_before_a_cutoff_are_listed_for_deletion(store):
    for job_id, status in (("ok", "succeeded"), ("bad", "failed"), ("off", "cancelled")):
        _create(store, job_id, created_at=1.0, status=status, finished_at=100.0)
    _create(store, "waiting", created_at=1.0)
    assert store.finished_before(100.0) == []  # the cutoff itself is not before
    assert sorted(store.finished_before(100.5)) == ["bad", "off", "ok"]
    store.delete("ok")
    assert store.ids() == {"bad", "off", "waiting"}


@pytest.mark.parametrize(
    ("status", "rows_done", "rows_total", "progress"),
    [
        ("running", 0, None, 0.0),  # not counted yet
        ("running", 0, 0, 0.0),
        ("running", 25, 100, 0.25),
        ("running", 120, 100, 1.0),  # rows counted twice on a resume stay within the total
        ("succeeded", 0, None, 1.0),
    ],
)
def test_progress_is_a_share_of_the_input_rows(store, status, rows_done, rows_total, progress):
    job = _create(
        store, "job", created_at=1.0, status=status, rows_done=rows_done, rows_total=rows_total
    )
    assert job.progress == progress
