"""Batch jobs: persisted in a database plus files under the data directory, never lost.

The database is SQLite (default) or PostgreSQL, which replicas share along with the data
directory: a job submitted to one replica is seen, run and downloaded by any.
A job is accepted only after its input is on disk (fsynced) and its row is committed, so a
crash after the 202 loses nothing. Workers claim jobs with a lease in the database; a job whose
worker died (it stopped renewing the lease, or on SQLite its process is gone) is claimed again
and resumes where it stopped: finished partitions are kept, the rest run again.

Memory stays bounded whatever the input size: the input is streamed once into hash partitions
of about `batch_partition_bytes` each (all rows of a series land in the same partition), and
each partition is forecast in chunks of `batch_chunk_series` series, each chunk's result
appended to that partition's Parquet part. The parts are finally streamed into one result file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from sqlalchemy import create_engine, event, make_url, text

from forecaster.errors import ForecasterInputError
from forecaster.outputs import ForecastArrays
from pipelines.predict import forecast_batch
from service.errors import InvalidInputError
from service.model_manager import ServedModel

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("unique_id", "ds", "y")
MAX_PARTITIONS = 256
MAX_ATTEMPTS = 3
PARQUET_MAGIC = b"PAR1"
# Parquet compresses; its rows take several times the file size once in memory.
PARQUET_EXPANSION = 4

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
_ADDED_COLUMNS = {"series_failed": "BIGINT NOT NULL DEFAULT 0"}
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
    model_name: str | None
    model_version: str | None
    model_alias: str | None
    model_run_id: str | None
    owner: str | None
    heartbeat_at: float | None
    attempts: int
    error: dict[str, Any] | None

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
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


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
                return self.get(seen["id"])

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


# -- files ---------------------------------------------------------------------------------------


class JobFiles:
    """Where a job's files live: <data_dir>/jobs/<id>/."""

    def __init__(self, root: Path, job_id: str):
        self.dir = Path(root) / job_id
        self.partitions = self.dir / "partitions"
        self.parts = self.dir / "parts"
        self.result_parquet = self.dir / "result.parquet"
        self.result_csv = self.dir / "result.csv"
        self.errors_csv = self.dir / "errors.csv"  # one row per series left out, and why

    def input_file(self, fmt: str) -> Path:
        return self.dir / f"input.{fmt}"

    def result(self, fmt: str) -> Path:
        return self.result_csv if fmt == "csv" else self.result_parquet


def temp_beside(path: Path) -> Path:
    """A temporary name for writing `path` then renaming it into place; unique, because two
    writers may meet: concurrent downloads, or a stalled worker whose job was taken over."""
    return path.with_name(f"{path.name}.{uuid.uuid4().hex[:12]}.tmp")


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be fsynced
        fsync_file(path)


def sniff_format(path: Path, declared: str | None) -> str:
    """csv or parquet, from the declared format and the file's magic bytes."""
    with open(path, "rb") as f:
        head = f.read(4)
    looks_parquet = head == PARQUET_MAGIC
    if declared == "parquet" and not looks_parquet:
        raise InvalidInputError(
            "file: malformed Parquet: the file does not start with the Parquet magic bytes "
            "'PAR1' (is it a CSV? send it as text/csv)",
            field="file",
        )
    if declared == "csv" and looks_parquet:
        raise InvalidInputError(
            "file: declared CSV, but the file is Parquet; send it as application/vnd.apache.parquet",
            field="file",
        )
    return "parquet" if looks_parquet else "csv"


def inspect_input(path: Path, fmt: str, covariates: tuple[str, ...]) -> list[str]:
    """Cheap checks before a job is accepted: the file parses and has the needed columns.

    Reads the Parquet footer, or the first block of a CSV; the full file is validated by the
    core rules chunk by chunk while the job runs. Returns the column names.
    """
    if path.stat().st_size == 0:
        raise InvalidInputError(
            "file: the file is empty; expected a long-format table with columns "
            f"{list(REQUIRED_COLUMNS)}",
            field="file",
        )
    if fmt == "parquet":
        try:
            pf = pq.ParquetFile(path)
            columns = list(pf.schema_arrow.names)
            n_rows = pf.metadata.num_rows
        except (pa.ArrowException, OSError) as exc:
            raise InvalidInputError(f"file: malformed Parquet: {exc}", field="file") from None
    else:
        try:
            reader = pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=1 << 20))
            columns = list(reader.schema.names)
            first = reader.read_next_batch()
            n_rows = first.num_rows
        except StopIteration:
            n_rows = 0
        except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
            raise InvalidInputError(f"file: malformed CSV: {exc}", field="file") from None
    required = [*REQUIRED_COLUMNS, *covariates]
    missing = [c for c in required if c not in columns]
    if missing:
        raise InvalidInputError(
            f"{missing[0]}: the file lacks required columns {missing}; present columns: "
            f"{columns}; expected long format with {required}",
            field=missing[0],
        )
    if n_rows == 0:
        raise InvalidInputError(
            f"file: the file has a header but no rows; expected rows with {required}",
            field="file",
        )
    return columns


def _normalise(batch: pa.RecordBatch, numeric: list[str]) -> pa.RecordBatch:
    """Ids as strings, numeric columns as float64 (text is left for the core to report)."""
    arrays, names = [], []
    for name in batch.schema.names:
        col = batch.column(name)
        if name == "unique_id" and not pa.types.is_string(col.type):
            col = col.cast(pa.string())
        elif name in numeric and (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
            col = col.cast(pa.float64())
        elif pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        arrays.append(col)
        names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def iter_input(path: Path, fmt: str, columns: list[str]) -> Iterator[pa.RecordBatch]:
    """Stream the input's needed columns as record batches of bounded size."""
    numeric = [c for c in columns if c not in ("unique_id", "ds")]
    try:
        if fmt == "parquet":
            pf = pq.ParquetFile(path)
            for batch in pf.iter_batches(batch_size=65_536, columns=columns):
                yield _normalise(batch, numeric)
        else:
            types = {"unique_id": pa.string(), "ds": pa.string()}
            reader = pacsv.open_csv(
                path,
                read_options=pacsv.ReadOptions(block_size=8 << 20),
                convert_options=pacsv.ConvertOptions(
                    include_columns=columns, column_types=types, strings_can_be_null=True
                ),
            )
            for batch in reader:
                yield _normalise(batch, numeric)
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeDecodeError) as exc:
        kind = "Parquet" if fmt == "parquet" else "CSV"
        raise InvalidInputError(f"file: malformed {kind}: {exc}", field="file") from None


def _unify(batches: list[pa.RecordBatch]) -> pa.Table:
    """One table from batches whose numeric columns may differ in type (CSV type inference
    per block): columns that are text in any batch become text everywhere."""
    if not batches:
        raise InvalidInputError("file: the file has no rows", field="file")
    schemas = {b.schema for b in batches}
    if len(schemas) == 1:
        return pa.Table.from_batches(batches)
    names = batches[0].schema.names
    fixed = []
    for b in batches:
        cols = []
        for name in names:
            col = b.column(name)
            if any(not other.schema.field(name).type.equals(col.type) for other in batches):
                col = col.cast(pa.string())
            cols.append(col)
        fixed.append(pa.RecordBatch.from_arrays(cols, names=names))
    return pa.Table.from_batches(fixed)


# -- processing ----------------------------------------------------------------------------------


# (a chunk's forecast, the model's identity) -> None
ForecastHook = Callable[[ForecastArrays, Any], None]


class JobStopped(Exception):
    """The job was cancelled, taken over, or the service is stopping."""


@dataclass
class JobContext:
    job: Job
    files: JobFiles
    served: ServedModel
    chunk_series: int
    partition_bytes: int
    report: Callable[..., bool]  # update(**progress) -> still ours?
    stopping: threading.Event
    on_forecast: ForecastHook | None = None  # sees each chunk's forecast (the forecast log)


def process_job(ctx: JobContext) -> None:
    """Run a job to its result file; resumable at partition granularity."""
    job, files, forecaster = ctx.job, ctx.files, ctx.served.forecaster
    columns = [*REQUIRED_COLUMNS, *forecaster.model_config.covariates]
    input_path = Path(job.input_path)
    if not input_path.exists():
        raise InvalidInputError(f"path: the input file {str(input_path)!r} no longer exists")
    covariates = forecaster.model_config.covariates
    if covariates:
        raise InvalidInputError(
            f"the model needs known-future covariates {list(covariates)}, which batch jobs "
            "do not take yet; use POST /v1/forecast with covariates",
            field=covariates[0],
        )
    files.parts.mkdir(parents=True, exist_ok=True)
    if job.model_version is not None and job.model_version != ctx.served.identity.version:
        # Resumed under another model version: start over so one result has one model.
        shutil.rmtree(files.parts, ignore_errors=True)
        files.parts.mkdir(parents=True)
    ident = ctx.served.identity
    ctx.report(
        model_name=ident.name,
        model_version=ident.version,
        model_alias=ident.alias,
        model_run_id=ident.run_id,
    )

    expansion = PARQUET_EXPANSION if job.input_format == "parquet" else 1
    n_parts = max(
        1, min(MAX_PARTITIONS, math.ceil(job.input_bytes * expansion / ctx.partition_bytes))
    )
    mode_file = files.dir / "mode"
    if n_parts == 1:
        # Small enough to hold at once: one part.
        n_done = _run_sources(
            ctx,
            iter([lambda: _unify(list(iter_input(input_path, job.input_format, columns)))]),
            _count_rows(input_path, job.input_format),
        )
    else:
        mode = mode_file.read_text() if mode_file.exists() else "stream"
        n_done = None
        if mode == "stream":
            # Rows grouped by series (as most files are): one streaming pass, chunk by chunk.
            try:
                chunks = _grouped_chunks(input_path, job.input_format, columns, ctx.chunk_series)
                n_done = _run_sources(
                    ctx, (lambda t=t: t for t in chunks), _count_rows(input_path, job.input_format)
                )
            except _NotGrouped:
                logger.info("job %s: rows are not grouped by series; partitioning", job.id)
                mode_file.write_text("partition")
                shutil.rmtree(files.parts, ignore_errors=True)
                files.parts.mkdir(parents=True)
        if n_done is None:
            rows_total = _partition(
                input_path, job.input_format, columns, files.partitions, n_parts
            )
            n_done = _run_sources(
                ctx,
                (
                    (lambda p=p: pq.read_table(files.partitions / f"{p:05d}.parquet"))
                    for p in range(n_parts)
                ),
                rows_total,
            )
    errors = _collect_errors(files, n_done)
    if errors:
        _write_errors(errors, files.errors_csv)
        done = [json.loads((files.parts / f"{p:05d}.json").read_text()) for p in range(n_done)]
        if sum(d["series"] for d in done) == 0:
            first = errors[0]
            raise InvalidInputError(
                f"no series could be forecast ({len(errors)} refused; the first: "
                f"{first['detail']}); every reason is in the job's errors file",
                field=first.get("field"),
                series_id=first.get("series_id"),
            )
    _assemble(files, n_done, job.output_format)
    shutil.rmtree(files.partitions, ignore_errors=True)
    shutil.rmtree(files.parts, ignore_errors=True)


def _collect_errors(files: JobFiles, n_parts: int) -> list[dict[str, Any]]:
    errors: list[dict[str, Any]] = []
    for p in range(n_parts):
        meta = files.parts / f"{p:05d}.json"
        if meta.exists():
            errors += json.loads(meta.read_text()).get("errors", [])
    return errors


def _write_errors(errors: list[dict[str, Any]], path: Path) -> None:
    """`unique_id, field, error, detail` of every series left out, written atomically."""
    frame = pd.DataFrame(
        {
            "unique_id": [e.get("series_id") for e in errors],
            "field": [e.get("field") for e in errors],
            "error": [e.get("error") for e in errors],
            "detail": [e.get("detail") for e in errors],
        }
    )
    tmp = temp_beside(path)
    frame.to_csv(tmp, index=False)
    os.replace(tmp, path)


def _run_sources(
    ctx: JobContext, sources: Iterator[Callable[[], pa.Table]], rows_total: int | None
) -> int:
    """Forecast each source table into its own part; parts already written are kept (resume).
    Returns the number of parts."""
    files = ctx.files
    if rows_total is not None:
        ctx.report(rows_total=rows_total)
    rows_done = series_done = series_failed = 0
    count = 0
    for p, load in enumerate(sources):
        count += 1
        part = files.parts / f"{p:05d}.parquet"
        meta = files.parts / f"{p:05d}.json"
        if part.exists() and meta.exists():
            done = json.loads(meta.read_text())
            rows_done += done["rows"]
            series_done += done["series"]
            series_failed += len(done.get("errors", []))
            continue
        if ctx.stopping.is_set():
            raise JobStopped("service stopping")
        table = load()
        rows, series, errors = _forecast_partition(ctx, table, part, rows_done, series_done)
        meta.write_text(json.dumps({"rows": rows, "series": series, "errors": errors}))
        rows_done += rows
        series_done += series
        series_failed += len(errors)
        if not ctx.report(
            rows_done=rows_done, series_done=series_done, series_failed=series_failed
        ):
            raise JobStopped("job cancelled or taken over")
    if rows_total is None or rows_total != rows_done:
        ctx.report(rows_total=rows_done)
    return count


class _NotGrouped(Exception):
    """A series' rows are not contiguous in the input."""


def _grouped_chunks(
    path: Path, fmt: str, columns: list[str], chunk_series: int
) -> Iterator[pa.Table]:
    """Tables of `chunk_series` whole series each, streamed from an input whose rows are grouped
    by series; raises _NotGrouped as soon as a series shows up again after others.

    Memory: one chunk plus one input batch. Chunk k is the same on every pass over the same
    file, which is what lets a resumed job skip the chunks it has written.
    """
    seen: set[int] = set()  # hashes of the series whose rows are complete
    open_hash: int | None = None  # the series the last batch ended in
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    starts: list[int] = []  # row offsets in `pending` where a series begins
    for batch in iter_input(path, fmt, columns):
        if batch.num_rows == 0:
            continue
        ids = batch.column("unique_id").to_numpy(zero_copy_only=False).astype(object)
        hashes = pd.util.hash_array(ids)
        group_starts = np.r_[0, np.flatnonzero(hashes[1:] != hashes[:-1]) + 1]
        group_hashes = hashes[group_starts].tolist()
        continues = open_hash is not None and group_hashes[0] == open_hash
        if open_hash is not None and not continues:
            seen.add(open_hash)
        new = group_hashes[1:] if continues else group_hashes
        if len(set(new)) != len(new) or not seen.isdisjoint(new):
            raise _NotGrouped
        seen.update(group_hashes[:-1])
        open_hash = group_hashes[-1]
        offsets = group_starts[1:] if continues else group_starts
        starts.extend((offsets + pending_rows).tolist())
        pending.append(batch)
        pending_rows += batch.num_rows
        while len(starts) - 1 >= chunk_series:  # the last series may go on in the next batch
            end = starts[chunk_series]
            table = _unify(pending)
            yield table.slice(0, end)
            rest = table.slice(end)
            pending, pending_rows = rest.to_batches(), rest.num_rows
            starts = [s - end for s in starts[chunk_series:]]
    if pending_rows:
        yield _unify(pending)


def _count_rows(path: Path, fmt: str) -> int | None:
    """Rows of the input for progress: Parquet's footer, or the CSV's lines."""
    try:
        if fmt == "parquet":
            return int(pq.ParquetFile(path).metadata.num_rows)
        lines = 0
        with open(path, "rb") as f:
            while block := f.read(1 << 24):
                lines += block.count(b"\n")
        return max(0, lines - 1)
    except (OSError, pa.ArrowException):
        return None


def _partition(path: Path, fmt: str, columns: list[str], out_dir: Path, n_parts: int) -> int:
    """Hash-partition the input by series id into `n_parts` Parquet files; returns rows."""
    done_marker = out_dir / "_DONE"
    if done_marker.exists():
        return int(done_marker.read_text())
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    writers: dict[int, pq.ParquetWriter] = {}
    schema: pa.Schema | None = None
    rows = 0
    try:
        for batch in iter_input(path, fmt, columns):
            if schema is None:
                schema = batch.schema
            elif not batch.schema.equals(schema):
                batch = _cast_like(batch, schema)
            rows += batch.num_rows
            ids = batch.column("unique_id").to_numpy(zero_copy_only=False)
            bucket = (pd.util.hash_array(ids.astype(object)) % np.uint64(n_parts)).astype(np.int64)
            order = np.argsort(bucket, kind="stable")
            sorted_buckets = bucket[order]
            bounds = np.searchsorted(sorted_buckets, np.arange(n_parts + 1))
            taken = batch.take(pa.array(order))
            for p in range(n_parts):
                lo, hi = bounds[p], bounds[p + 1]
                if hi <= lo:
                    continue
                if p not in writers:
                    writers[p] = pq.ParquetWriter(out_dir / f"{p:05d}.parquet", schema)
                writers[p].write_batch(taken.slice(lo, hi - lo))
    finally:
        for w in writers.values():
            w.close()
    assert schema is not None, "iter_input yields at least one batch for a non-empty file"
    for p in range(n_parts):  # partitions no series hashed to still need a (empty) file
        target = out_dir / f"{p:05d}.parquet"
        if not target.exists():
            pq.write_table(schema.empty_table(), target)
    done_marker.write_text(str(rows))
    return rows


def _cast_like(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    try:
        return batch.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise InvalidInputError(
            f"file: malformed CSV: a column changes type part-way through the file ({exc})",
            field="file",
        ) from None


def _forecast_partition(
    ctx: JobContext, table: pa.Table, part: Path, rows_before: int, series_before: int
) -> tuple[int, int, list[dict[str, Any]]]:
    """Forecast one partition in chunks of series; write its part file atomically.
    Returns the rows read, the series forecast and the errors of the series left out."""
    forecaster = ctx.served.forecaster
    tmp = temp_beside(part)
    errors: list[dict[str, Any]] = []
    if table.num_rows == 0:
        _empty_result(forecaster, ctx.job).to_parquet(tmp, index=False)
        os.replace(tmp, part)
        return 0, 0, errors
    frame = table.to_pandas()
    codes, uniques = pd.factorize(frame["unique_id"], sort=False)
    order = np.argsort(codes, kind="stable")
    frame = frame.take(order).reset_index(drop=True)
    codes = codes[order]
    n_series = len(uniques)
    starts = np.searchsorted(codes, np.arange(0, n_series, ctx.chunk_series))
    ends = np.r_[starts[1:], len(codes)]
    writer: pq.ParquetWriter | None = None
    rows = series = 0
    try:
        for lo, hi in zip(starts, ends, strict=True):
            if ctx.stopping.is_set():
                raise JobStopped("service stopping")
            chunk = frame.iloc[lo:hi]
            arrays = _forecast_good_series(ctx, chunk, errors)
            if arrays is None:  # every series of the chunk was bad
                rows += int(hi - lo)
                continue
            out = arrays.to_frame()
            if ctx.on_forecast is not None:
                ctx.on_forecast(arrays, ctx.served.identity)
            result = pa.Table.from_pandas(out, preserve_index=False)
            if writer is None:
                writer = pq.ParquetWriter(tmp, result.schema)
            writer.write_table(result)
            rows += int(hi - lo)
            series += len(arrays)
            if not ctx.report(rows_done=rows_before + rows, series_done=series_before + series):
                raise JobStopped("job cancelled or taken over")
    finally:
        if writer is not None:
            writer.close()
    if writer is None:  # no series of the partition could be forecast
        _empty_result(forecaster, ctx.job).to_parquet(tmp, index=False)
    os.replace(tmp, part)
    return rows, series, errors


def _forecast_good_series(
    ctx: JobContext, chunk: pd.DataFrame, errors: list[dict[str, Any]]
) -> ForecastArrays | None:
    """Forecast the chunk's series, leaving out (and recording in `errors`) each series the
    core refuses; None when none is left. An error naming no series stops the job."""
    forecaster = ctx.served.forecaster
    while len(chunk):
        try:
            return forecast_batch(
                forecaster, chunk, horizon=ctx.job.horizon, quantiles=ctx.job.quantiles
            )
        except ForecasterInputError as exc:
            if exc.series_id is None:
                raise
            errors.append(input_error_payload(exc))
            chunk = chunk[chunk["unique_id"].astype("str") != str(exc.series_id)]
    return None


def _empty_result(forecaster: Any, job: Job) -> pd.DataFrame:
    from forecaster.data import quantile_column

    quantiles = job.quantiles or list(forecaster.quantiles)
    data: dict[str, Any] = {
        "unique_id": pd.array([], dtype="str"),
        "ds": pd.Series([], dtype="datetime64[ns]"),
        "mean": pd.Series([], dtype="float64"),
    }
    for q in quantiles:
        data[quantile_column(q)] = pd.Series([], dtype="float64")
    return pd.DataFrame(data)


def _assemble(files: JobFiles, n_parts: int, output_format: str) -> None:
    """Stream the parts into result.parquet (and result.csv when asked), atomically."""
    parts = [files.parts / f"{p:05d}.parquet" for p in range(n_parts)]
    # Empty partitions hold a schema-only table; take the schema from one with rows.
    with_rows = [p for p in parts if pq.ParquetFile(p).metadata.num_rows]
    schema = pq.read_schema(with_rows[0] if with_rows else parts[0])
    tmp = temp_beside(files.result_parquet)
    with pq.ParquetWriter(tmp, schema) as writer:
        for path in parts:
            pf = pq.ParquetFile(path)
            for i in range(pf.num_row_groups):
                writer.write_table(pf.read_row_group(i).cast(schema))
    fsync_file(tmp)
    os.replace(tmp, files.result_parquet)
    if output_format == "csv":
        write_csv(files.result_parquet, files.result_csv)
    fsync_dir(files.dir)


def write_csv(parquet_path: Path, csv_path: Path) -> None:
    """Stream a Parquet result into CSV (row group by row group)."""
    tmp = temp_beside(csv_path)
    pf = pq.ParquetFile(parquet_path)
    with pacsv.CSVWriter(tmp, pf.schema_arrow) as writer:
        for i in range(pf.num_row_groups):
            writer.write_table(pf.read_row_group(i))
    os.replace(tmp, csv_path)


def input_error_payload(exc: Exception) -> dict[str, Any]:
    if isinstance(exc, ForecasterInputError):
        from service.errors import describe_input_error

        return {
            "error": type(exc).__name__,
            "detail": describe_input_error(exc),
            "field": exc.field,
            "series_id": exc.series_id,
        }
    if isinstance(exc, InvalidInputError):
        return {
            "error": exc.kind,
            "detail": exc.message,
            "field": exc.field,
            "series_id": exc.series_id,
        }
    return {"error": "internal_error", "detail": f"{type(exc).__name__}: {exc}"}
