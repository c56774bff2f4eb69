"""The batch-job store: the jobs table and its lease queue, never lost.

The database is SQLite (default) or PostgreSQL, which replicas share along with the data
directory: a job submitted to one replica is seen, run and downloaded by any.
A job is accepted only after its input is on disk (fsynced) and its row is committed, so a
crash after the 202 loses nothing. Workers claim jobs with a lease in the database; a job whose
worker died (it stopped renewing the lease, or on SQLite its process is gone) is claimed again
and resumes where it stopped (see service.job_processing).
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, make_url, text

from pipelines.lock import process_alive

MAX_ATTEMPTS = 3

# Types that mean the same in both databases: SQLite reads DOUBLE PRECISION as REAL and BIGINT
# as INTEGER, while PostgreSQL's REAL (4 bytes) could not hold a timestamp to the second.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    started_at DOUBLE PRECISION,
    finished_at DOUBLE PRECISION,
    input_path TEXT NOT NULL,
    input_owned INTEGER NOT NULL,
    input_format TEXT NOT NULL,
    input_bytes BIGINT NOT NULL,
    output_format TEXT NOT NULL,
    horizon INTEGER,
    quantiles TEXT,
    rows_total BIGINT,
    rows_done BIGINT NOT NULL DEFAULT 0,
    series_done BIGINT NOT NULL DEFAULT 0,
    series_failed BIGINT NOT NULL DEFAULT 0,
    glitches BIGINT NOT NULL DEFAULT 0,
    model_name TEXT,
    model_version TEXT,
    model_alias TEXT,
    model_run_id TEXT,
    owner TEXT,
    heartbeat_at DOUBLE PRECISION,
    attempts INTEGER NOT NULL DEFAULT 0,
    error TEXT
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status, created_at);
"""
_ADDED_COLUMNS = {
    "series_failed": "BIGINT NOT NULL DEFAULT 0",
    "glitches": "BIGINT NOT NULL DEFAULT 0",
}
# Any fixed number: replicas starting together take this advisory lock to create the table.
_SCHEMA_LOCK = 7_302_118_841


@dataclass(frozen=True)
class Job:
    """One row of the jobs table."""

    id: str
    status: str
    created_at: float
    started_at: float | None
    finished_at: float | None
    input_path: str
    input_owned: bool
    input_format: str
    input_bytes: int
    output_format: str
    horizon: int | None
    quantiles: list[float] | None
    rows_total: int | None
    rows_done: int
    series_done: int
    series_failed: int  # series left out of the result for bad input (see the errors file)
    glitches: int  # readings read as glitches and not used (see the glitches file)
    model_name: str | None
    model_version: str | None
    model_alias: str | None
    model_run_id: str | None
    owner: str | None
    heartbeat_at: float | None
    attempts: int
    error: dict[str, Any] | None
    # Not a column: set by `claim` when the job had started before, on a worker that died or
    # handed it back at a graceful stop, so this claim resumes it.
    resumed: bool = False

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Job:
        values = dict(row)
        values["input_owned"] = bool(values["input_owned"])
        values["quantiles"] = json.loads(values["quantiles"]) if values["quantiles"] else None
        values["error"] = json.loads(values["error"]) if values["error"] else None
        return cls(**values)

    @property
    def progress(self) -> float:
        if self.status == "succeeded":
            return 1.0
        if not self.rows_total:
            return 0.0
        return min(1.0, self.rows_done / self.rows_total)


def new_owner() -> str:
    """Identity of this process's workers: host, pid and a token unique to this start."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def _owner_is_dead(owner: str | None, me: str) -> bool:
    """True when `owner` is a previous run on this host: its pid is gone, or it is our own
    pid under another token (a restarted container reuses its pid)."""
    if not owner:
        return True
    try:
        host, pid_text, token = owner.rsplit(":", 2)
        pid = int(pid_text)
    except ValueError:
        return True
    my_host, my_pid, my_token = me.rsplit(":", 2)
    if host != my_host:
        return False  # another machine's worker: only its lease tells
    if pid == int(my_pid):
        return token != my_token
    return not process_alive(pid)


def job_store_url(location: str | Path) -> str:
    """The SQLAlchemy URL of a job store: a SQLite file (a path, or sqlite:///PATH) or a
    PostgreSQL database (postgresql://... or postgresql+psycopg://..., driven by psycopg).

    Raises:
        ValueError: another kind of URL, or PostgreSQL without psycopg installed.
    """
    if isinstance(location, Path) or "://" not in location:
        return f"sqlite:///{location}"
    scheme, rest = location.split("://", 1)
    if scheme == "sqlite":
        return location
    if scheme in ("postgresql", "postgresql+psycopg"):
        if importlib.util.find_spec("psycopg") is None:
            raise ValueError(
                "jobs_db: a PostgreSQL job store needs the psycopg driver, which is not "
                "installed; pip install 'forecaster[postgres]'"
            )
        return f"postgresql+psycopg://{rest}"
    # the scheme only: the rest may hold a password
    raise ValueError(
        "jobs_db: expected a SQLite file path, sqlite:///PATH or "
        f"postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE, got a {scheme}:// URL"
    )


class JobStore:
    """The jobs table, in SQLite (one host: the default) or PostgreSQL (shared by replicas).

    Every method runs in its own short transaction on a pooled connection: safe from any
    thread or process. Both databases run the same SQL (PostgreSQL adds a lock around creating
    the table). They differ in how a dead worker is recognised: in SQLite every worker is on
    this host, so one whose process is gone is known dead at once, while a shared store knows
    only leases (pids mean nothing on another host).
    """

    def __init__(self, location: str | Path):
        url = job_store_url(location)
        self.shared = url.startswith("postgresql")
        if self.shared:
            self.engine = create_engine(
                url, pool_pre_ping=True, connect_args={"connect_timeout": 10}
            )
        else:
            path = Path(make_url(url).database or "jobs.db")
            path.parent.mkdir(parents=True, exist_ok=True)
            self.engine = create_engine(url, connect_args={"timeout": 30})
            event.listen(self.engine, "connect", _sqlite_durable)
            with self.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        with self.engine.begin() as conn:
            if self.shared:  # replicas starting together would race to create the table
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK})
            for statement in filter(str.strip, _SCHEMA.split(";")):
                conn.exec_driver_sql(statement)
            # Stores created before a column existed get it (both databases add columns alike).
            present = set(conn.exec_driver_sql("SELECT * FROM jobs LIMIT 0").keys())
            for column, definition in _ADDED_COLUMNS.items():
                if column not in present:
                    conn.exec_driver_sql(f"ALTER TABLE jobs ADD COLUMN {column} {definition}")

    def close(self) -> None:
        self.engine.dispose()

    def _query(self, sql: str, **params: Any) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            return [dict(row) for row in conn.execute(text(sql), params).mappings()]

    def _execute(self, sql: str, **params: Any) -> int:
        """One write in its own transaction; returns the number of rows it changed."""
        with self.engine.begin() as conn:
            return conn.execute(text(sql), params).rowcount

    def create(self, **values: Any) -> Job:
        values = dict(values)
        values.setdefault("status", "queued")
        values.setdefault("created_at", time.time())
        if values.get("quantiles") is not None:
            values["quantiles"] = json.dumps(list(values["quantiles"]))
        values["input_owned"] = int(bool(values.get("input_owned", True)))
        columns = ", ".join(values)
        marks = ", ".join(f":{k}" for k in values)
        self._execute(f"INSERT INTO jobs ({columns}) VALUES ({marks})", **values)
        job = self.get(values["id"])
        assert job is not None
        return job

    def get(self, job_id: str) -> Job | None:
        rows = self._query("SELECT * FROM jobs WHERE id = :id", id=job_id)
        return Job.from_row(rows[0]) if rows else None

    def list(self, limit: int = 100, status: str | None = None) -> list[Job]:
        where = " WHERE status = :status" if status else ""
        rows = self._query(
            f"SELECT * FROM jobs{where} ORDER BY created_at DESC LIMIT :limit",
            status=status,
            limit=limit,
        )
        return [Job.from_row(r) for r in rows]

    def count_pending(self) -> int:
        rows = self._query("SELECT COUNT(*) AS n FROM jobs WHERE status IN ('queued', 'running')")
        return int(rows[0]["n"])

    def claim(self, owner: str, lease_s: float) -> Job | None:
        """Take the oldest queued job, or a running one whose worker is gone.

        The row is read, then changed only if it is still as read (compare-and-set), so of
        two workers reading the same row, threads, processes or replicas alike, one wins and
        the other looks again; no lock is held in between.
        """
        while True:
            now = time.time()
            seen = self._takeable(owner, lease_s, now)
            if seen is None:
                return None
            if seen["status"] == "running" and seen["attempts"] >= MAX_ATTEMPTS:
                error = {
                    "error": "worker_lost",
                    "detail": f"the job's worker stopped {seen['attempts']} times while "
                    "running it (killed or out of memory?); giving up",
                }
                self._take(
                    seen,
                    "status = 'failed', finished_at = :now, error = :error, owner = NULL",
                    now=now,
                    error=json.dumps(error),
                )
            elif self._take(
                seen,
                "status = 'running', owner = :owner, heartbeat_at = :now, "
                "started_at = COALESCE(started_at, :now), attempts = attempts + 1",
                owner=owner,
                now=now,
            ):
                job = self.get(seen["id"])
                if job is None:  # deleted meanwhile
                    continue
                return replace(job, resumed=seen["started_at"] is not None)

    def _takeable(self, owner: str, lease_s: float, now: float) -> dict[str, Any] | None:
        queued = self._query(
            "SELECT * FROM jobs WHERE status = 'queued' ORDER BY created_at LIMIT 1"
        )
        if queued:
            return queued[0]
        for row in self._query("SELECT * FROM jobs WHERE status = 'running' ORDER BY created_at"):
            expired = (row["heartbeat_at"] or 0) < now - lease_s
            if expired or (not self.shared and _owner_is_dead(row["owner"], owner)):
                return row
        return None

    def _take(self, seen: Mapping[str, Any], assignments: str, **values: Any) -> bool:
        """Apply `assignments` to the job `seen` if no one changed its row since it was read
        (a worker that renews its lease or takes the job changes heartbeat_at and owner)."""
        changed = self._execute(
            f"UPDATE jobs SET {assignments} WHERE id = :id AND status = :seen_status "
            "AND COALESCE(owner, '') = :seen_owner "
            "AND COALESCE(heartbeat_at, 0) = :seen_heartbeat",
            id=seen["id"],
            seen_status=seen["status"],
            seen_owner=seen["owner"] or "",
            seen_heartbeat=seen["heartbeat_at"] or 0.0,
            **values,
        )
        return changed == 1

    def update(self, job_id: str, owner: str, **values: Any) -> bool:
        """Progress and heartbeat; False when this worker no longer owns the running job."""
        values["heartbeat_at"] = time.time()
        assignments = ", ".join(f"{k} = :{k}" for k in values)
        changed = self._execute(
            f"UPDATE jobs SET {assignments} "
            "WHERE id = :job_id AND owner = :me AND status = 'running'",
            job_id=job_id,
            me=owner,
            **values,
        )
        return changed == 1

    def finish(
        self, job_id: str, owner: str, status: str, error: dict[str, Any] | None = None
    ) -> bool:
        changed = self._execute(
            "UPDATE jobs SET status = :status, finished_at = :now, error = :error, owner = NULL "
            "WHERE id = :id AND owner = :owner AND status = 'running'",
            status=status,
            now=time.time(),
            error=json.dumps(error) if error else None,
            id=job_id,
            owner=owner,
        )
        return changed == 1

    def release(self, job_id: str, owner: str) -> None:
        """Give a running job back to the queue (graceful shutdown); it resumes elsewhere."""
        self._execute(
            "UPDATE jobs SET status = 'queued', owner = NULL, "
            "attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END "
            "WHERE id = :id AND owner = :owner AND status = 'running'",
            id=job_id,
            owner=owner,
        )

    def cancel(self, job_id: str) -> Job | None:
        self._execute(
            "UPDATE jobs SET status = 'cancelled', finished_at = :now, owner = NULL "
            "WHERE id = :id AND status IN ('queued', 'running')",
            now=time.time(),
            id=job_id,
        )
        return self.get(job_id)

    def delete(self, job_id: str) -> None:
        self._execute("DELETE FROM jobs WHERE id = :id", id=job_id)

    def ids(self) -> set[str]:
        return {row["id"] for row in self._query("SELECT id FROM jobs")}

    def finished_before(self, cutoff: float) -> list[str]:
        """Ids of the jobs that ended (succeeded, failed, cancelled) before `cutoff`."""
        rows = self._query(
            "SELECT id FROM jobs WHERE status IN ('succeeded', 'failed', 'cancelled') "
            "AND finished_at < :cutoff",
            cutoff=cutoff,
        )
        return [row["id"] for row in rows]


def _sqlite_durable(dbapi_connection: Any, _record: Any) -> None:
    """Every SQLite connection waits for its commits to reach the disk."""
    dbapi_connection.execute("PRAGMA synchronous=FULL")
