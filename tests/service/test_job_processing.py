"""Processing a batch job's input, seen from its progress reports."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest

from service.job_files import JobFiles
from service.job_processing import JobContext, process_job
from service.job_store import JobStore
from service.model_manager import ServedModel

CHUNK = 3


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
    frames = []
    for k in range(4):  # 16 series: 4 base series under new ids
        part = training_frame.groupby("unique_id").tail(60).copy()
        part["unique_id"] = part["unique_id"] + f"-{k}"
        frames.append(part)
    frame = pd.concat(frames, ignore_index=True)
    # Three series that cannot be forecast (no observed value), the second chunk of the
    # grouped file: left out and counted as failed.
    bad = frame["unique_id"].isin(["series_003-0", "series_000-1", "series_001-1"])
    frame.loc[bad, "y"] = np.nan
    if layout == "interleaved":
        frame = frame.sort_values("ds", kind="stable")
    source = tmp_path / "input.csv"
    frame.to_csv(source, index=False)
    store = JobStore(tmp_path / "jobs.db")
    job = store.create(
        id="job-1",
        input_path=str(source),
        input_format="csv",
        input_bytes=source.stat().st_size,
        output_format="parquet",
    )
    owner = "worker-1"
    job = store.claim(owner, lease_s=3600)
    assert job is not None
    seen: list[tuple[int, int, int]] = []  # (rows, series done, series failed) after each report

    def report(**values: object) -> bool:
        ours = store.update(job.id, owner, **values)
        now = store.get(job.id)
        seen.append((now.rows_done, now.series_done, now.series_failed))
        return ours

    ctx = JobContext(
        job=job,
        files=JobFiles(tmp_path / "jobs", job.id),
        served=ServedModel(fitted, identity, datetime.now(UTC)),
        chunk_series=CHUNK,
        partition_bytes=partition_bytes,
        report=report,
        stopping=threading.Event(),
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
    if layout == "grouped":  # failures count when their chunk is done, not at the end
        assert next(s for s in seen if s[2])[1:] == (3, 3), seen


def test_many_bad_series_in_one_chunk_are_each_listed_and_the_rest_forecast(
    tmp_path, fitted, identity, training_frame
):
    frames = []
    for k in range(10):  # 40 series in one chunk, every third one bad
        part = training_frame.groupby("unique_id").tail(60).copy()
        part["unique_id"] = part["unique_id"] + f"-{k}"
        frames.append(part)
    frame = pd.concat(frames, ignore_index=True)
    ids = list(pd.unique(frame["unique_id"]))
    bad = ids[::3]
    frame.loc[frame["unique_id"].isin(bad), "y"] = np.nan
    source = tmp_path / "input.parquet"
    frame.to_parquet(source, index=False)
    store = JobStore(tmp_path / "jobs.db")
    store.create(
        id="job-1",
        input_path=str(source),
        input_format="parquet",
        input_bytes=source.stat().st_size,
        output_format="parquet",
    )
    job = store.claim("worker-1", lease_s=3600)
    files = JobFiles(tmp_path / "jobs", job.id)
    ctx = JobContext(
        job=job,
        files=files,
        served=ServedModel(fitted, identity, datetime.now(UTC)),
        chunk_series=len(ids),
        partition_bytes=1 << 30,
        report=lambda **values: store.update(job.id, "worker-1", **values),
        stopping=threading.Event(),
    )
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
