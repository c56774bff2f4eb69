"""Running a batch job: its input forecast into parts, then assembled into one result.

Memory stays bounded whatever the input size: the input is streamed once into hash partitions
of about `batch_partition_bytes` each (all rows of a series land in the same partition), and
each partition is forecast in chunks of `batch_chunk_series` series, each chunk's result
appended to that partition's Parquet part and the job's progress reported. An input whose rows
are grouped by series is streamed chunk by chunk instead, a part per chunk. The parts are
finally streamed into one result file.
Finished parts are kept, so a job taken over after its worker died resumes at the next part.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from forecaster import Forecaster
from forecaster.errors import ForecasterInputError, MissingValuesError, SeriesNotContiguousError
from forecaster.outputs import ForecastArrays
from forecaster.time_axis import is_integer_axis
from pipelines.forecast_log import records
from pipelines.predict import forecast_batch
from pipelines.series_chunks import whole_series_chunks
from service.errors import InvalidInputError
from service.job_files import (
    REQUIRED_COLUMNS,
    CallersTypes,
    JobFiles,
    assemble,
    collect_errors,
    count_rows,
    glitches_part,
    iter_input,
    no_rows_error,
    temp_beside,
    unify,
    write_errors,
    write_glitches,
    write_text_atomic,
)
from service.job_store import Job
from service.model_manager import ServedModel

logger = logging.getLogger(__name__)

MAX_PARTITIONS = 256
# Parquet compresses; its rows take several times the file size once in memory.
PARQUET_EXPANSION = 4


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
    on_forecast: ForecastHook | None = None  # sees each chunk's forecast (glitch metrics)
    # Takes the job's staged forecast-log files once its result is committed; None: the
    # service keeps no forecast log, and nothing is staged.
    publish_log: Callable[[list[Path]], None] | None = None


def check_batchable(forecaster: Forecaster) -> None:
    """Refuse a model batch jobs cannot serve: one that needs known-future covariates."""
    covariates = forecaster.covariates
    if covariates:
        raise InvalidInputError(
            f"the model needs known-future covariates {list(covariates)}, which batch jobs "
            "do not take yet; use POST /v1/forecast with covariates",
            field=covariates[0],
        )


def process_job(ctx: JobContext) -> None:
    """Run a job to its result file; resumable at partition granularity."""
    job, files, forecaster = ctx.job, ctx.files, ctx.served.forecaster
    columns = list(REQUIRED_COLUMNS)
    input_path = Path(job.input_path)
    if not input_path.exists():
        raise InvalidInputError(f"path: the input file {str(input_path)!r} no longer exists")
    check_batchable(forecaster)
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

    without_id = _RowsWithoutId(files.rows_without_id)

    def read(values_as_numbers: bool = True) -> Iterator[pa.RecordBatch]:
        batches = iter_input(input_path, job.input_format, columns, values_as_numbers)
        return without_id.drop(batches)

    expansion = PARQUET_EXPANSION if job.input_format == "parquet" else 1
    n_parts = max(
        1, min(MAX_PARTITIONS, math.ceil(job.input_bytes * expansion / ctx.partition_bytes))
    )
    n_parts, chunk_series = _layout(files, n_parts, ctx.chunk_series)
    ctx = dataclasses.replace(ctx, chunk_series=chunk_series)
    mode_file = files.dir / "mode"
    if n_parts == 1:
        # Small enough to hold at once: one part.
        def whole_input() -> pd.DataFrame:
            return unify(list(read())).to_pandas()

        n_done = _run_sources(
            ctx, iter([whole_input]), count_rows(input_path, job.input_format), without_id
        )
    else:
        if not mode_file.exists():
            with contextlib.closing(read()) as blocks:  # the first block only
                grouped = _looks_grouped(next(blocks, None))
            if not grouped:
                write_text_atomic(mode_file, "partition")
        mode = mode_file.read_text() if mode_file.exists() else "stream"
        n_done = None
        if mode == "stream":
            # Rows grouped by series (as most files are): one streaming pass, chunk by chunk.
            try:
                chunks = whole_series_chunks((b.to_pandas() for b in read()), ctx.chunk_series)
                n_done = _run_sources(
                    ctx,
                    (lambda c=c: c for c in chunks),
                    count_rows(input_path, job.input_format),
                    without_id,
                )
            except SeriesNotContiguousError:
                logger.info("job %s: rows are not grouped by series; partitioning", job.id)
                write_text_atomic(mode_file, "partition")
                shutil.rmtree(files.parts, ignore_errors=True)
                files.parts.mkdir(parents=True)
        if n_done is None:
            rows_total = _partition(read, files.partitions, n_parts, ctx.stopping)
            n_done = _run_sources(
                ctx,
                (
                    (lambda p=p: pq.read_table(files.partitions / f"{p:05d}.parquet").to_pandas())
                    for p in range(n_parts)
                ),
                rows_total,
                without_id,
            )
    errors = [*without_id.errors(), *collect_errors(files, n_done)]
    if errors:
        write_errors(errors, files.errors_csv)
        done = [json.loads((files.parts / f"{p:05d}.json").read_text()) for p in range(n_done)]
        if sum(d["series"] for d in done) == 0:
            first = errors[0]
            raise InvalidInputError(
                f"no series could be forecast ({len(errors)} refused; the first: "
                f"{first['detail']}); every reason is in the job's errors file",
                field=first.get("field"),
                series_id=first.get("series_id"),
            )
    if n_done == 0:  # streamed: no chunk, since no row
        raise no_rows_error()
    callers = CallersTypes.of(
        input_path, job.input_format, forecaster.wall_clock, is_integer_axis(forecaster.freq)
    )
    if any(glitches_part(files, p).exists() for p in range(n_done)):
        write_glitches(files, n_done, callers)
    assemble(files, n_done, job.output_format, callers)
    if ctx.publish_log is not None:  # served now: the log takes what the result holds
        staged = [log_part(files.parts / f"{p:05d}.parquet") for p in range(n_done)]
        ctx.publish_log([path for path in staged if path.exists()])
    shutil.rmtree(files.partitions, ignore_errors=True)
    shutil.rmtree(files.parts, ignore_errors=True)


def _looks_grouped(first: pa.RecordBatch | None) -> bool:
    """Whether the input's first block looks grouped by series: most rows follow a row of
    their own series. Rows by time do not, and streaming them would forecast every series'
    first row as a series of its own (sent to the forecast log, counted as progress) until a
    series came back, which in a block of distinct ids is not before the second block."""
    if first is None or first.num_rows < 2:
        return True
    ids = first.column("unique_id").to_numpy(zero_copy_only=False)
    return bool((ids[1:] == ids[:-1]).mean() >= 0.5)


def _layout(files: JobFiles, n_parts: int, chunk_series: int) -> tuple[int, int]:
    """The partitions and series per streamed chunk of the job's first run, which its parts
    are numbered by: a job resumed under other settings (a redeploy that tuned them, a
    replica configured otherwise) keeps them, or its kept parts would name other series."""
    if files.layout.exists():
        kept = json.loads(files.layout.read_text())
        return int(kept["n_parts"]), int(kept["chunk_series"])
    write_text_atomic(files.layout, json.dumps({"n_parts": n_parts, "chunk_series": chunk_series}))
    return n_parts, chunk_series


def _run_sources(
    ctx: JobContext,
    sources: Iterator[Callable[[], pd.DataFrame]],
    rows_total: int | None,
    without_id: _RowsWithoutId,
) -> int:
    """Forecast each source's rows into its own part; parts already written are kept (resume).
    The rows without an id, known once the sources are read, are counted as read and as one
    series left out. Returns the number of parts."""
    files = ctx.files
    if rows_total is not None:
        ctx.report(rows_total=rows_total)
    done = _Counts()
    count = 0
    for p, load in enumerate(sources):
        count += 1
        part = files.parts / f"{p:05d}.parquet"
        meta = files.parts / f"{p:05d}.json"
        if part.exists() and meta.exists():
            saved = json.loads(meta.read_text())
            done += _Counts(
                saved["rows"],
                saved["series"],
                len(saved.get("errors", [])),
                saved.get("glitches", 0),
            )
            continue
        if ctx.stopping.is_set():
            raise JobStopped("service stopping")
        in_part, errors = _forecast_partition(ctx, load(), part, glitches_part(files, p), done)
        write_text_atomic(
            meta,
            json.dumps(
                {
                    "rows": in_part.rows,
                    "series": in_part.series,
                    "errors": errors,
                    "glitches": in_part.glitches,
                }
            ),
        )
        done += in_part
    left_out = without_id.counts()
    if left_out.rows:
        done += left_out
        done.report(ctx)
    if rows_total is None or rows_total != done.rows:
        ctx.report(rows_total=done.rows)
    return count


@dataclass(frozen=True)
class _Counts:
    """Rows read, series forecast, series left out and readings read as glitches: of a job,
    or of one of its parts."""

    rows: int = 0
    series: int = 0
    failed: int = 0
    glitches: int = 0

    def __add__(self, other: _Counts) -> _Counts:
        return _Counts(
            self.rows + other.rows,
            self.series + other.series,
            self.failed + other.failed,
            self.glitches + other.glitches,
        )

    def report(self, ctx: JobContext) -> None:
        """Record these as the job's progress; stop if the job is no longer this worker's."""
        if not ctx.report(
            rows_done=self.rows,
            series_done=self.series,
            series_failed=self.failed,
            glitches=self.glitches,
        ):
            raise JobStopped("job cancelled or taken over")


def _partition(
    read: Callable[[bool], Iterator[pa.RecordBatch]],
    out_dir: Path,
    n_parts: int,
    stopping: threading.Event,
) -> int:
    """Hash-partition the input (`read(values_as_numbers)`) by series id into `n_parts` Parquet
    files; returns rows. Stops (`JobStopped`) between blocks when the service stops: a large
    input takes minutes to partition, and the job must be handed back, not lost with its
    worker."""
    done_marker = out_dir / "_DONE"
    if done_marker.exists():
        return int(done_marker.read_text())
    try:
        rows = _write_partitions(read(True), out_dir, n_parts, stopping)
    except _ValuesChangeType:
        # Values that are all numbers in the first block and hold text in a later one (a
        # series with text, far into the file) cannot share the partitions' schema: read the
        # values as text throughout, for the core to name that series. Only such files pay
        # for the second pass.
        rows = _write_partitions(read(False), out_dir, n_parts, stopping)
    write_text_atomic(done_marker, str(rows))
    return rows


class _ValuesChangeType(Exception):
    """A value column is numbers in the first block of the input and text in a later one."""


def _write_partitions(
    batches: Iterator[pa.RecordBatch], out_dir: Path, n_parts: int, stopping: threading.Event
) -> int:
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    writers: dict[int, pq.ParquetWriter] = {}
    schema: pa.Schema | None = None
    rows = 0
    try:
        for batch in batches:
            if stopping.is_set():
                raise JobStopped("service stopping")
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
    return rows


def _cast_like(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """A later block's batch in the first one's schema (its numbers become text where the first
    block held text), or `_ValuesChangeType` when its text cannot become numbers."""
    try:
        return batch.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        raise _ValuesChangeType from None


class _RowsWithoutId:
    """The input's rows that have no `unique_id`: they belong to no series, so they are left
    out, and reported as one error naming the first (its 0-based row, as `forecaster predict`
    names it) and how many there are. A pass over the input that reads to its end records
    them in `path`, so a resumed job that skips reading still reports them."""

    def __init__(self, path: Path):
        self.path = path

    def drop(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        first: int | None = None
        count = seen = 0
        for batch in batches:
            ids = batch.column("unique_id")
            offset, seen = seen, seen + batch.num_rows
            if ids.null_count:  # known without a scan: files with every id pay nothing
                if first is None:
                    first = offset + int(np.argmax(ids.is_null().to_numpy(zero_copy_only=False)))
                count += ids.null_count
                batch = batch.filter(ids.is_valid())
            yield batch
        if count:
            write_text_atomic(self.path, json.dumps({"first_row": first, "rows": count}))

    def _recorded(self) -> dict[str, int] | None:
        return json.loads(self.path.read_text()) if self.path.exists() else None

    def counts(self) -> _Counts:
        recorded = self._recorded()
        return _Counts(recorded["rows"], 0, 1) if recorded else _Counts()

    def errors(self) -> list[dict[str, Any]]:
        recorded = self._recorded()
        if recorded is None:
            return []
        return [
            input_error_payload(
                MissingValuesError(
                    f"unique_id is missing at row {recorded['first_row']} ({recorded['rows']} "
                    "such row(s) in all); every row needs a series id, so these rows were "
                    "left out",
                    field="unique_id",
                )
            )
        ]


def _forecast_partition(
    ctx: JobContext, frame: pd.DataFrame, part: Path, glitches_path: Path, before: _Counts
) -> tuple[_Counts, list[dict[str, Any]]]:
    """Forecast one partition in chunks of series, reporting the job's progress (`before` plus
    this partition's) after each; write its part file atomically, and its glitches (few: a
    frame in memory) to `glitches_path` when it has some.
    Returns the partition's counts and the errors of the series left out."""
    forecaster = ctx.served.forecaster
    tmp = temp_beside(part)
    errors: list[dict[str, Any]] = []
    in_part = _Counts()
    if len(frame) == 0:
        _empty_result(forecaster, ctx.job).to_parquet(tmp, index=False)
        os.replace(tmp, part)
        return in_part, errors
    codes, uniques = pd.factorize(frame["unique_id"], sort=False)
    order = np.argsort(codes, kind="stable")
    frame = frame.take(order).reset_index(drop=True)
    codes = codes[order]
    n_series = len(uniques)
    starts = np.searchsorted(codes, np.arange(0, n_series, ctx.chunk_series))
    ends = np.r_[starts[1:], len(codes)]
    writer: pq.ParquetWriter | None = None
    # Arrow encodes and writes without the GIL: chunk k is written while chunk k + 1 is
    # forecast (one write in flight, so memory stays two chunks).
    writes = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-job-write")
    written: Future[None] | None = None
    glitches: list[pd.DataFrame] = []
    logged: list[pa.Table] = []
    identity = ctx.served.identity
    try:
        for lo, hi in zip(starts, ends, strict=True):
            if ctx.stopping.is_set():
                raise JobStopped("service stopping")
            arrays = _forecast_good_series(ctx, frame.iloc[lo:hi], errors)
            if arrays is not None:  # None: every series of the chunk was bad
                if ctx.on_forecast is not None:
                    ctx.on_forecast(arrays, identity)
                if ctx.publish_log is not None:
                    logged.append(
                        records(arrays, model_name=identity.name, model_version=identity.version)
                    )
                result = arrays.to_arrow()
                if writer is None:
                    writer = pq.ParquetWriter(tmp, result.schema)
                if written is not None:
                    written.result()
                written = writes.submit(writer.write_table, result)
                found = arrays.glitch_frame()
                if len(found):
                    glitches.append(found)
            forecast = 0 if arrays is None else len(arrays)
            listed = sum(len(g) for g in glitches)
            in_part = _Counts(
                in_part.rows + int(hi - lo), in_part.series + forecast, len(errors), listed
            )
            # Every chunk, bad ones too: a partition can take minutes.
            (before + in_part).report(ctx)
        if written is not None:
            written.result()
    finally:
        writes.shutdown(wait=True)
        if writer is not None:
            writer.close()
    if writer is None:  # no series of the partition could be forecast
        _empty_result(forecaster, ctx.job).to_parquet(tmp, index=False)
    if glitches:
        tmp_glitches = temp_beside(glitches_path)
        pd.concat(glitches, ignore_index=True).to_parquet(tmp_glitches, index=False)
        os.replace(tmp_glitches, glitches_path)
    if logged:  # before the part: a part on disk has its log rows staged
        staged = log_part(part)
        tmp_log = temp_beside(staged)
        pq.write_table(pa.concat_tables(logged), tmp_log)
        os.replace(tmp_log, staged)
    os.replace(tmp, part)
    return in_part, errors


def log_part(part: Path) -> Path:
    """Where a part's forecast-log rows are staged until the job's result is committed."""
    return part.with_name(part.stem + ".log.parquet")


def _forecast_good_series(
    ctx: JobContext, chunk: pd.DataFrame, errors: list[dict[str, Any]]
) -> ForecastArrays | None:
    """Forecast the chunk's series, leaving out (and recording in `errors`) each series the
    core refuses; None when none is left. An error naming no series stops the job.

    The core stops at the first bad series it meets, so a refused chunk is searched by
    halves: the named series is set aside and the rest is tried in two halves, each
    forecast in one pass when it is clean. k bad series among n cost O(k log n) passes over
    ever smaller parts instead of k passes over the whole chunk.
    """
    forecaster = ctx.served.forecaster
    try:
        return forecast_batch(
            forecaster, chunk, horizon=ctx.job.horizon, quantiles=ctx.job.quantiles
        )
    except ForecasterInputError as exc:
        if exc.series_id is None:
            raise
        rest = chunk[chunk["unique_id"].astype("str") != str(exc.series_id)]
        if len(rest) == len(chunk):  # names no series of the chunk: nothing to set aside
            raise
        errors.append(input_error_payload(exc))
        chunk = rest
    codes = pd.factorize(chunk["unique_id"], sort=False)[0]
    n_series = int(codes.max()) + 1 if len(codes) else 0
    if n_series == 0:
        return None
    halves = (
        [chunk] if n_series == 1 else [chunk[codes < n_series // 2], chunk[codes >= n_series // 2]]
    )
    parts = [_forecast_good_series(ctx, half, errors) for half in halves]
    kept = [part for part in parts if part is not None]
    return ForecastArrays.concat(kept) if kept else None


def _empty_result(forecaster: Any, job: Job) -> pd.DataFrame:
    from forecaster.data import quantile_column

    # `[]` asks for the mean alone: the other parts have no quantile column either.
    quantiles = list(forecaster.quantiles) if job.quantiles is None else job.quantiles
    data: dict[str, Any] = {
        "unique_id": pd.array([], dtype="str"),
        "ds": pd.Series([], dtype="datetime64[ns]"),
        "mean": pd.Series([], dtype="float64"),
    }
    for q in quantiles:
        data[quantile_column(q)] = pd.Series([], dtype="float64")
    return pd.DataFrame(data)


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
