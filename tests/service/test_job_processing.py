"""Processing a batch job's input, seen from its progress reports."""

from __future__ import annotations

import dataclasses
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forecaster import Forecaster
from service.errors import InvalidInputError
from service.job_files import JobFiles, write_text_atomic
from service.job_processing import JobContext, JobStopped, input_error_payload, process_job
from service.job_store import JobStore
from service.model_manager import ServedModel

CHUNK = 3
OWNER = "worker-1"


def _copies(training_frame: pd.DataFrame, n: int) -> pd.DataFrame:
    """The last 60 points of each training series, `n` times under new ids (suffix `-k`)."""
    tails = training_frame.groupby("unique_id").tail(60)
    copies = [tails.assign(unique_id=tails["unique_id"] + f"-{k}") for k in range(n)]
    return pd.concat(copies, ignore_index=True)


def _claimed_job(tmp_path, source, output_format="parquet", **fields):
    """A job on `source` (its format from the suffix), stored and claimed by OWNER; `fields`
    are the job's other options (its quantiles...)."""
    store = JobStore(tmp_path / "jobs.db")
    store.create(
        id="job-1",
        input_path=str(source),
        input_format=source.suffix.lstrip("."),
        input_bytes=source.stat().st_size,
        output_format=output_format,
        **fields,
    )
    job = store.claim(OWNER, lease_s=3600)
    assert job is not None
    return store, job


def _context(tmp_path, store, job, forecaster, identity, **fields) -> JobContext:
    """OWNER's context for `job`: CHUNK series a chunk, partitions of 4096 bytes (streamed
    when the rows are grouped, a part per chunk), progress reported to `store`; `fields`
    override any of these."""
    defaults = {
        "job": job,
        "files": JobFiles(tmp_path / "jobs", job.id),
        "served": ServedModel(forecaster, identity, datetime.now(UTC)),
        "chunk_series": CHUNK,
        "partition_bytes": 4096,
        "report": lambda **values: store.update(job.id, OWNER, **values),
        "stopping": threading.Event(),
    }
    return JobContext(**{**defaults, **fields})


@pytest.mark.parametrize(
    ("layout", "partition_bytes"),
    [
        ("grouped", 1 << 30),  # small enough to be one part
        ("grouped", 4096),  # streamed, chunk by chunk
        ("interleaved", 4096),  # hash-partitioned, partitions of several chunks
    ],
)
def test_progress_advances_after_every_chunk_bad_ones_included(
    tmp_path, fitted, identity, training_frame, layout, partition_bytes
):
    frame = _copies(training_frame, 4)  # 16 series
    # Three series that cannot be forecast (no observed value), the second chunk of the
    # grouped file: left out and counted as failed.
    bad = frame["unique_id"].isin(["series_003-0", "series_000-1", "series_001-1"])
    frame.loc[bad, "y"] = np.nan
    if layout == "interleaved":
        frame = frame.sort_values("ds", kind="stable")
    source = tmp_path / "input.csv"
    frame.to_csv(source, index=False)
    store, job = _claimed_job(tmp_path, source)
    seen: list[tuple[int, int, int]] = []  # (rows, series done, series failed) after each report

    def report(**values: object) -> bool:
        ours = store.update(job.id, OWNER, **values)
        now = store.get(job.id)
        seen.append((now.rows_done, now.series_done, now.series_failed))
        return ours

    ctx = _context(
        tmp_path, store, job, fitted, identity, partition_bytes=partition_bytes, report=report
    )
    process_job(ctx)

    rows = [s[0] for s in seen]
    series = [s[1] + s[2] for s in seen]
    assert rows == sorted(rows) and series == sorted(series), seen
    # Every chunk of at most CHUNK series moves progress on, the chunk of bad series too.
    n_chunks = -(-16 // CHUNK)
    steps = np.diff(sorted({0, *series}))
    assert len(steps) >= n_chunks and steps.max() <= CHUNK, seen
    assert len(set(rows) - {0}) >= n_chunks, seen
    assert seen[-1] == (len(frame), 13, 3)
    # What a finished job keeps is its result and errors: the working files go.
    assert ctx.files.result_parquet.exists() and ctx.files.errors_csv.exists()
    assert not ctx.files.parts.exists() and not ctx.files.partitions.exists()
    if layout == "grouped":  # failures count when their chunk is done, not at the end
        assert next(s for s in seen if s[2])[1:] == (3, 3), seen


@pytest.mark.parametrize("partition_bytes", [1 << 30, 4096])  # one part; streamed in chunks
@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_a_job_knows_its_input_s_rows_before_its_first_chunk(
    tmp_path, fitted, identity, training_frame, suffix, partition_bytes
):
    """Progress is a share of the input's rows from the first report on, not 0 % until the
    end: the rows are counted (a CSV's lines, a Parquet file's footer) before forecasting."""
    frame = _copies(training_frame, 3)
    source = tmp_path / f"input.{suffix}"
    if suffix == "csv":
        frame.to_csv(source, index=False)
    else:
        frame.to_parquet(source, index=False)
    store, job = _claimed_job(tmp_path, source)
    reports: list[dict[str, object]] = []

    def report(**values: object) -> bool:
        reports.append(values)
        return store.update(job.id, OWNER, **values)

    process_job(
        _context(
            tmp_path, store, job, fitted, identity, partition_bytes=partition_bytes, report=report
        )
    )
    counted = next(i for i, values in enumerate(reports) if "rows_total" in values)
    first_chunk = next(i for i, values in enumerate(reports) if "rows_done" in values)
    assert counted < first_chunk and reports[counted]["rows_total"] == len(frame)
    assert store.get(job.id).rows_total == len(frame)


@pytest.mark.parametrize(
    ("output_format", "partition_bytes"), [("parquet", 1 << 30), ("csv", 4096)]
)
def test_a_finished_job_s_result_is_on_disk_in_the_format_it_asked_for(
    tmp_path, fitted, identity, training_frame, monkeypatch, output_format, partition_bytes
):
    """The result, one part renamed or many joined, reaches the disk with its directory
    entry before the job is done (a power cut after "succeeded" must not lose it), and a
    job that asked for CSV has its CSV ready for the first download."""
    source = tmp_path / "input.csv"
    _copies(training_frame, 2).to_csv(source, index=False)
    store, job = _claimed_job(tmp_path, source, output_format=output_format)
    synced: set[tuple[int, int]] = set()  # (device, inode) of each file or directory fsynced
    fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        status = os.fstat(fd)
        synced.add((status.st_dev, status.st_ino))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    ctx = _context(tmp_path, store, job, fitted, identity, partition_bytes=partition_bytes)
    process_job(ctx)

    def identity_of(path):
        return path.stat().st_dev, path.stat().st_ino

    assert identity_of(ctx.files.result_parquet) in synced
    assert identity_of(ctx.files.dir) in synced
    assert ctx.files.result_csv.exists() == (output_format == "csv")


def test_many_bad_series_in_one_chunk_are_each_listed_and_the_rest_forecast(
    tmp_path, fitted, identity, training_frame
):
    frame = _copies(training_frame, 10)  # 40 series in one chunk, every third one bad
    ids = list(pd.unique(frame["unique_id"]))
    bad = ids[::3]
    frame.loc[frame["unique_id"].isin(bad), "y"] = np.nan
    source = tmp_path / "input.parquet"
    frame.to_parquet(source, index=False)
    store, job = _claimed_job(tmp_path, source)
    ctx = _context(
        tmp_path, store, job, fitted, identity, chunk_series=len(ids), partition_bytes=1 << 30
    )
    files = ctx.files
    process_job(ctx)

    errors = pd.read_csv(files.errors_csv)
    assert sorted(errors["unique_id"]) == sorted(bad)
    good = frame[~frame["unique_id"].isin(bad)]
    got = pd.read_parquet(files.result_parquet)
    want = fitted.predict(good)
    assert got["unique_id"].tolist() == want["unique_id"].tolist()  # the input's order
    np.testing.assert_allclose(got["mean"], want["mean"], rtol=1e-5, atol=1e-6)
    now = store.get(job.id)
    assert (now.series_done, now.series_failed) == (len(ids) - len(bad), len(bad))


def test_rows_without_an_id_are_listed_by_a_job_resumed_past_reading(
    tmp_path, fitted, identity, training_frame
):
    """The input is read once into partitions; the worker that resumes the job skips reading,
    and still lists the rows that had no unique_id."""
    frame = training_frame.groupby("unique_id").tail(60).astype({"unique_id": object})
    frame = frame.sort_values("ds", kind="stable").reset_index(drop=True)  # partitioned
    without_id = frame.index[frame["unique_id"] == "series_002"][[4, 9]]
    frame.loc[without_id, "unique_id"] = None
    source = tmp_path / "input.csv"
    frame.to_csv(source, index=False)
    store, job = _claimed_job(tmp_path, source)
    ctx = _context(tmp_path, store, job, fitted, identity)
    files = ctx.files
    chunks_reported = []

    def stop_after_the_first_chunk(**values: object) -> bool:
        if "rows_done" in values:
            chunks_reported.append(values)
        return ctx.report(**values) and len(chunks_reported) < 2

    with pytest.raises(JobStopped):
        process_job(dataclasses.replace(ctx, report=stop_after_the_first_chunk))
    assert (files.partitions / "_DONE").exists()
    process_job(ctx)

    errors = pd.read_csv(files.errors_csv)
    assert errors["field"].tolist() == ["unique_id"]
    assert f"unique_id is missing at row {without_id[0]} (2 " in errors["detail"].iloc[0]
    now = store.get(job.id)
    assert (now.rows_done, now.series_done, now.series_failed) == (len(frame), 4, 1)


def test_a_state_file_is_written_whole_or_not_at_all(tmp_path):
    """A resumed job reads each part's record; a write cut short (here by text that cannot be
    encoded, in production by a SIGKILL) leaves the previous record as it was, and no
    temporary file behind."""
    meta = tmp_path / "00000.json"
    write_text_atomic(meta, '{"rows": 3}')
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(meta, '{"rows": 4, "note": "\ud800"}')
    assert meta.read_text() == '{"rows": 3}'
    assert [p.name for p in tmp_path.iterdir()] == ["00000.json"]


def test_a_stop_while_partitioning_hands_the_job_back(tmp_path, training_frame):
    """A large input takes minutes to partition: a graceful stop then stops between blocks
    (JobStopped, so the runner hands the job back) instead of outliving the stop's grace and
    counting as a lost worker; the unfinished partitions are not marked done."""
    from service.job_processing import _partition

    batch = pa.RecordBatch.from_pandas(training_frame, preserve_index=False)
    stopping = threading.Event()
    stopping.set()
    out = tmp_path / "partitions"
    with pytest.raises(JobStopped):
        _partition(lambda _: iter([batch, batch]), out, 4, stopping)
    assert not (out / "_DONE").exists()
    stopping.clear()
    assert _partition(lambda _: iter([batch, batch]), out, 4, stopping) == 2 * len(batch)
    assert (out / "_DONE").exists()


def test_rows_by_time_are_partitioned_without_forecasting_first_rows_as_series(
    tmp_path, fitted, identity, training_frame, monkeypatch
):
    """Streamed, rows by time made every series' first row a series of its own, forecast, sent
    to the forecast log and counted as progress, until a series came back (3.9 million such
    rows in the log of a 600,000-series file, whose first blocks held distinct ids). Their
    first block says they are not grouped."""
    from service import job_files

    monkeypatch.setattr(job_files, "PARQUET_BATCH_ROWS", 100)  # blocks of distinct ids
    # 200 series, each first seen at the first timestamp
    frame = _copies(training_frame, 50).sort_values("ds", kind="stable")
    source = tmp_path / "input.parquet"
    frame.to_parquet(source, index=False)
    store, job = _claimed_job(tmp_path, source)
    logged: list[str] = []

    def log(arrays, _identity) -> None:
        logged.extend(map(str, arrays.series_ids))

    process_job(_context(tmp_path, store, job, fitted, identity, on_forecast=log))
    assert sorted(logged) == sorted(frame["unique_id"].unique())
    assert store.get(job.id).series_done == frame["unique_id"].nunique()


def _stopped_after_first_part(
    tmp_path,
    fitted,
    identity,
    training_frame,
    forecast: list[str],
    frame: pd.DataFrame | None = None,
):
    """A job on `frame` (by default 16 series) stopped (as at a graceful shutdown) once its
    first part is written; the ids it forecast go to `forecast`. Returns the store, the job
    and its context."""
    source = tmp_path / "input.csv"
    (_copies(training_frame, 4) if frame is None else frame).to_csv(source, index=False)
    store, job = _claimed_job(tmp_path, source)
    stopping = threading.Event()
    ctx = _context(
        tmp_path,
        store,
        job,
        fitted,
        identity,
        stopping=stopping,
        on_forecast=lambda arrays, _: (forecast.extend(arrays.series_ids), stopping.set()),
    )
    with pytest.raises(JobStopped):
        process_job(ctx)
    return store, job, ctx


@pytest.mark.parametrize(("resumed_under", "forecast_again"), [("3", 16 - CHUNK), ("4", 16)])
def test_a_job_resumed_under_another_model_version_starts_over(
    tmp_path, fitted, identity, training_frame, resumed_under, forecast_again
):
    """A result is one model's: the parts an earlier version wrote are kept for a resume by
    the same version and forecast again by another (a champion promoted meanwhile)."""
    forecast: list[str] = []
    store, job, ctx = _stopped_after_first_part(
        tmp_path, fitted, identity, training_frame, forecast
    )
    assert identity.version == "3" and len(forecast) == CHUNK
    forecast.clear()
    resumed = _context(
        tmp_path,
        store,
        store.get(job.id),  # as the next worker claims it: with the version it ran under
        fitted,
        dataclasses.replace(identity, version=resumed_under),
        on_forecast=lambda arrays, _: forecast.extend(arrays.series_ids),
    )
    process_job(resumed)
    assert len(forecast) == forecast_again
    assert pd.read_parquet(ctx.files.result_parquet)["unique_id"].nunique() == 16
    assert store.get(job.id).model_version == resumed_under


def test_a_job_whose_input_file_is_gone_fails_naming_it(tmp_path, fitted, identity, training_frame):
    """A job naming a file under the input directory is queued; if the file is removed before
    a worker takes it, the job fails with that reason (not an internal error)."""
    source = tmp_path / "input.csv"
    training_frame.to_csv(source, index=False)
    store, job = _claimed_job(tmp_path, source)
    source.unlink()
    with pytest.raises(InvalidInputError) as caught:
        process_job(_context(tmp_path, store, job, fitted, identity))
    payload = input_error_payload(caught.value)
    assert payload["error"] != "internal_error"
    assert f"the input file {str(source)!r} no longer exists" in payload["detail"]


@pytest.mark.parametrize("partition_bytes", [1 << 30, 4096])  # read whole; streamed
def test_a_job_whose_input_was_emptied_fails_naming_the_file(
    tmp_path, fitted, identity, training_frame, partition_bytes
):
    """A file under the input directory cut to its header after the job was accepted (a
    producer rewriting it in place) fails the job with that reason, not an internal error."""
    source = tmp_path / "input.csv"
    training_frame.to_csv(source, index=False)
    store, job = _claimed_job(tmp_path, source)
    source.write_text("unique_id,ds,y\n")
    with pytest.raises(InvalidInputError) as caught:
        process_job(
            _context(tmp_path, store, job, fitted, identity, partition_bytes=partition_bytes)
        )
    assert caught.value.field == "file"
    assert "the file has a header but no rows" in input_error_payload(caught.value)["detail"]


def test_a_job_taken_by_a_model_that_needs_covariates_fails_naming_them(
    tmp_path, fitted, identity, training_frame
):
    """Refused at submission too; this is the job accepted while no model (or another one)
    was served, taken once a model with known-future covariates is the champion."""
    needs_promo = Forecaster(
        dataclasses.replace(fitted.model_config, covariates=("promo",)), fitted.train_config
    )
    source = tmp_path / "input.csv"
    training_frame.to_csv(source, index=False)
    store, job = _claimed_job(tmp_path, source)
    with pytest.raises(InvalidInputError) as caught:
        process_job(_context(tmp_path, store, job, needs_promo, identity))
    assert caught.value.field == "promo"
    assert "POST /v1/forecast" in input_error_payload(caught.value)["detail"]


def test_a_row_without_an_id_far_into_the_file_is_named_by_its_row(
    tmp_path, fitted, identity, training_frame, monkeypatch
):
    """The row a caller is told to fix is counted across the input's blocks, not within one."""
    from service import job_files

    monkeypatch.setattr(job_files, "PARQUET_BATCH_ROWS", 100)
    frame = _copies(training_frame, 4).astype({"unique_id": object})
    frame.loc[[250, 731], "unique_id"] = None  # in the third and the eighth block
    source = tmp_path / "input.parquet"
    frame.to_parquet(source, index=False)
    store, job = _claimed_job(tmp_path, source)
    ctx = _context(tmp_path, store, job, fitted, identity)
    process_job(ctx)
    (detail,) = pd.read_csv(ctx.files.errors_csv)["detail"]
    assert "unique_id is missing at row 250 (2 such row(s)" in detail


def test_a_part_whose_record_was_never_written_is_forecast_again(
    tmp_path, fitted, identity, training_frame
):
    """A worker killed between writing a part and its record leaves a part no resume can
    count: the resuming worker forecasts that part again instead of failing the job."""
    store, job, ctx = _stopped_after_first_part(tmp_path, fitted, identity, training_frame, [])
    (ctx.files.parts / "00000.json").unlink()  # as if killed before the record
    ctx.stopping.clear()
    process_job(dataclasses.replace(ctx, on_forecast=None))
    assert pd.read_parquet(ctx.files.result_parquet)["unique_id"].nunique() == 16
    assert store.get(job.id).series_done == 16


def test_a_job_resumed_under_other_chunk_settings_keeps_its_first_run_s_chunks(
    tmp_path, fitted, identity, training_frame
):
    """Parts are numbered by the first run's chunks: a replica configured with other chunks
    (or a redeploy that tuned them) that resumed with its own would skip series the kept
    part does not hold and forecast some twice."""
    store, job, ctx = _stopped_after_first_part(tmp_path, fitted, identity, training_frame, [])
    ctx.stopping.clear()
    process_job(dataclasses.replace(ctx, chunk_series=CHUNK + 2, on_forecast=None))
    got = pd.read_parquet(ctx.files.result_parquet)
    assert got["unique_id"].nunique() == 16
    assert not got.duplicated(["unique_id", "ds"]).any()
    assert store.get(job.id).series_done == 16


def test_a_resumed_job_still_counts_the_series_its_kept_parts_left_out(
    tmp_path, fitted, identity, training_frame
):
    """The series a part left out before the stop stay failed in the job's counts, beside the
    errors file that lists them."""
    frame = _copies(training_frame, 4)
    frame.loc[frame["unique_id"] == "series_001-0", "y"] = np.nan  # in the first part
    store, job, ctx = _stopped_after_first_part(
        tmp_path, fitted, identity, training_frame, [], frame
    )
    ctx.stopping.clear()
    process_job(dataclasses.replace(ctx, on_forecast=None))
    assert pd.read_csv(ctx.files.errors_csv)["unique_id"].tolist() == ["series_001-0"]
    now = store.get(job.id)
    assert (now.series_done, now.series_failed) == (15, 1)


def test_a_resumed_job_still_counts_the_glitches_its_kept_parts_found(
    tmp_path, fitted, identity, training_frame
):
    """A reading a kept part set aside as a glitch stays listed and counted: the resumed
    worker does not read that part again."""
    frame = _copies(training_frame, 4)
    at = frame.index[frame["unique_id"] == "series_001-0"][-7]  # in the first part
    frame.loc[at, "y"] = 10 * frame.loc[at, "y"] + 100
    store, job, ctx = _stopped_after_first_part(
        tmp_path, fitted, identity, training_frame, [], frame
    )
    ctx.stopping.clear()
    process_job(dataclasses.replace(ctx, on_forecast=None))
    listed = pd.read_csv(ctx.files.glitches_csv, parse_dates=["ds"])
    assert list(zip(listed["unique_id"], listed["ds"], strict=True)) == [
        ("series_001-0", frame.loc[at, "ds"])
    ]
    assert store.get(job.id).glitches == 1


@pytest.mark.parametrize("layout", ["grouped", "interleaved"])  # streamed; hash-partitioned
def test_a_mean_only_job_with_a_part_of_no_forecast_gets_its_result(
    tmp_path, fitted, identity, training_frame, layout
):
    """`quantiles: []` asks for the mean alone: a part with no series forecast (a chunk of bad
    series, a partition no series hashed to) has the mean alone too, not the model's
    quantiles, which the other parts' columns would not match."""
    frame = _copies(training_frame, 4)
    bad = ["series_003-0", "series_000-1", "series_001-1"]  # the second chunk, when grouped
    frame.loc[frame["unique_id"].isin(bad), "y"] = np.nan
    if layout == "interleaved":
        frame = frame.sort_values("ds", kind="stable")
    source = tmp_path / "input.csv"
    frame.to_csv(source, index=False)
    store, job = _claimed_job(tmp_path, source, quantiles=[])
    ctx = _context(tmp_path, store, job, fitted, identity)
    process_job(ctx)
    got = pd.read_parquet(ctx.files.result_parquet)
    assert list(got.columns) == ["unique_id", "ds", "mean"]
    assert got["unique_id"].nunique() == 16 - len(bad)
    assert sorted(pd.read_csv(ctx.files.errors_csv)["unique_id"]) == sorted(bad)


def test_a_partitioned_job_with_rows_without_an_id_ends_at_all_of_its_rows(
    tmp_path, fitted, identity, training_frame
):
    """Partitioning counts the rows with an id; the rows without one are read too, so the
    job's total is all of them and a finished job shows 100 %, not more."""
    frame = _copies(training_frame, 2).astype({"unique_id": object})
    frame = frame.sort_values("ds", kind="stable").reset_index(drop=True)  # partitioned
    frame.loc[[5, 40], "unique_id"] = None
    source = tmp_path / "input.csv"
    frame.to_csv(source, index=False)
    store, job = _claimed_job(tmp_path, source)
    process_job(_context(tmp_path, store, job, fitted, identity))
    now = store.get(job.id)
    assert (now.rows_total, now.rows_done) == (len(frame), len(frame))
    assert (now.series_done, now.series_failed) == (8, 1)


def test_the_forecast_log_is_handed_the_rows_of_the_parts_that_forecast(
    tmp_path, fitted, identity, training_frame
):
    """A part whose series were all left out stages no log rows: the log is handed the staged
    files there are, not a name for each part (which it would warn it could not add)."""
    frame = _copies(training_frame, 4)
    bad = ["series_003-0", "series_000-1", "series_001-1"]  # the second chunk
    frame.loc[frame["unique_id"].isin(bad), "y"] = np.nan
    source = tmp_path / "input.csv"
    frame.to_csv(source, index=False)
    store, job = _claimed_job(tmp_path, source)
    handed: list[int | None] = []  # each file's rows as the log is handed it; None: no file

    def publish_log(paths: list[Path]) -> None:
        handed.extend(pq.ParquetFile(p).metadata.num_rows if p.exists() else None for p in paths)

    ctx = _context(tmp_path, store, job, fitted, identity, publish_log=publish_log)
    process_job(ctx)
    assert None not in handed, handed
    assert sum(handed) == len(pd.read_parquet(ctx.files.result_parquet))
