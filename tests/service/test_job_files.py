"""A batch job's files, below the job: reading the input and making writes durable."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service.errors import InvalidInputError
from service.job_files import fsync_dir, fsync_file, iter_input, unify


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux's /proc")
def test_syncing_files_and_directories_leaves_no_descriptor_open(tmp_path):
    """A service runs job after job: a descriptor left open per sync would run it out of
    descriptors after some thousands of jobs."""
    path = tmp_path / "result.parquet"
    path.write_bytes(b"PAR1")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        fsync_file(path)
        fsync_dir(tmp_path)
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_parquet_input_is_read_with_text_ids_and_float_values(tmp_path):
    """Integer ids are ids (text, as the core reads them) and integer readings are numbers,
    whatever types the producer wrote."""
    source = tmp_path / "input.parquet"
    table = pa.table(
        {
            "unique_id": pa.array([7, 7, 8], pa.int64()),
            "ds": pa.array(pd.date_range("2026-01-01", periods=3, freq="h")),
            "y": pa.array([1, 2, 3], pa.int32()),
            "promo": pa.array(["a", "b", "a"]).dictionary_encode(),
        }
    )
    pq.write_table(table, source)
    columns = ["unique_id", "ds", "y", "promo"]
    (batch,) = iter_input(source, "parquet", columns, values_as_numbers=True)
    assert batch.schema.field("unique_id").type == pa.string()
    assert batch.column("unique_id").to_pylist() == ["7", "7", "8"]
    assert batch.schema.field("y").type == pa.float64()
    assert batch.column("y").to_pylist() == [1.0, 2.0, 3.0]
    assert pa.types.is_timestamp(batch.schema.field("ds").type)
    # A dictionary-encoded covariate is read as its values (text left for the core to judge).
    assert batch.column("promo").to_pylist() == ["a", "b", "a"]
    assert batch.schema.field("promo").type == pa.string()


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_an_input_broken_past_its_first_block_fails_as_malformed(tmp_path, fmt):
    """Submission reads only the start of a file; a row broken further on is found while the
    job reads it, and fails it as malformed input (a 4xx reason), not as an internal error."""
    source = tmp_path / f"input.{fmt}"
    if fmt == "csv":
        source.write_text("unique_id,ds,y\na,2026-01-01,1\na,2026-01-02,2,extra\n")
    else:
        pq.write_table(pa.table({"unique_id": ["a"] * 1000, "y": [1.0] * 1000}), source)
        source.write_bytes(source.read_bytes()[:-200])  # the footer cut off
    kind = {"csv": "CSV", "parquet": "Parquet"}[fmt]
    with pytest.raises(InvalidInputError, match=f"file: malformed {kind}") as caught:
        list(iter_input(source, fmt, ["unique_id", "y"], values_as_numbers=True))
    assert caught.value.field == "file"


def test_batches_whose_column_types_differ_are_joined_as_text_only_there():
    """A CSV is typed block by block: a column with text in one block is text in all; the
    others keep their types."""
    numbers = pa.record_batch({"y": pa.array([1.0]), "promo": pa.array([0.0])})
    text = pa.record_batch({"y": pa.array([2.0]), "promo": pa.array(["yes"])})
    table = unify([numbers, text])
    assert table.schema.field("y").type == pa.float64()
    assert table.schema.field("promo").type == pa.string()
    assert table.column("promo").to_pylist() == ["0", "yes"]
