"""A batch job's files under <data_dir>/jobs/<id>: the input's checks and streaming, the
errors file and the result, each written under a temporary name and renamed into place."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from forecaster.data import MISSING_TOKENS
from forecaster.time_axis import in_zone
from service.errors import InvalidInputError

REQUIRED_COLUMNS = ("unique_id", "ds", "y")
PARQUET_MAGIC = b"PAR1"
# Rows per block read from a Parquet input (a CSV's blocks are 8 MB).
PARQUET_BATCH_ROWS = 65_536


class JobFiles:
    """Where a job's files live: <data_dir>/jobs/<id>/."""

    def __init__(self, root: Path, job_id: str):
        self.dir = Path(root) / job_id
        self.partitions = self.dir / "partitions"
        self.parts = self.dir / "parts"
        self.result_parquet = self.dir / "result.parquet"
        self.result_csv = self.dir / "result.csv"
        # One row per series left out, and why (and one for the rows without a unique_id).
        self.errors_csv = self.dir / "errors.csv"
        self.rows_without_id = self.dir / "rows_without_id.json"  # the first and how many
        # How the job's input was cut into parts, fixed by its first run (see process_job).
        self.layout = self.dir / "layout.json"
        # One row (unique_id, ds) per reading read as a glitch and not used.
        self.glitches_csv = self.dir / "glitches.csv"

    def input_file(self, fmt: str) -> Path:
        return self.dir / f"input.{fmt}"

    def result(self, fmt: str) -> Path:
        return self.result_csv if fmt == "csv" else self.result_parquet


def temp_beside(path: Path) -> Path:
    """A temporary name for writing `path` then renaming it into place; unique, because two
    writers may meet: concurrent downloads, or a stalled worker whose job was taken over."""
    return path.with_name(f"{path.name}.{uuid.uuid4().hex[:12]}.tmp")


def write_text_atomic(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a resumed job reads these files, and a worker killed
    mid-write must not leave one empty (a job resumed after a SIGKILL once failed on that)."""
    tmp = temp_beside(path)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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


def no_rows_error() -> InvalidInputError:
    """An input with a header and no rows: refused at submission, and failing the job when
    a file under the input directory was cut to its header after it was accepted."""
    return InvalidInputError(
        f"file: the file has a header but no rows; expected rows with {list(REQUIRED_COLUMNS)}",
        field="file",
    )


def inspect_input(path: Path, fmt: str) -> None:
    """Cheap checks before a job is accepted: the file parses and has the needed columns.

    Reads the Parquet footer, or the first block of a CSV; the full file is validated by the
    core rules chunk by chunk while the job runs.
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
    required = list(REQUIRED_COLUMNS)
    missing = [c for c in required if c not in columns]
    if missing:
        raise InvalidInputError(
            f"{missing[0]}: the file lacks required columns {missing}; present columns: "
            f"{columns}; expected long format with {required}",
            field=missing[0],
        )
    if n_rows == 0:
        raise no_rows_error()


_MISSING_TOKENS = pa.array(sorted(MISSING_TOKENS), pa.string())


def _normalise(batch: pa.RecordBatch, numeric: list[str]) -> pa.RecordBatch:
    """Ids as strings, numeric columns as float64 (text is left for the core to report);
    in text columns but the ids, pandas' missing-value tokens (NA, NaN, null...) missing,
    as `forecaster predict` reads a CSV (forecaster.data.csv_reading)."""
    arrays, names = [], []
    for name in batch.schema.names:
        col = batch.column(name)
        if name != "unique_id" and pa.types.is_string(col.type):
            missing = pc.is_in(col, value_set=_MISSING_TOKENS)
            col = pc.if_else(missing, pa.scalar(None, pa.string()), col)
        if name == "unique_id" and not pa.types.is_string(col.type):
            col = col.cast(pa.string())
        elif name in numeric and (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
            col = col.cast(pa.float64())
        elif name in numeric and pa.types.is_string(col.type):
            # CSV values are read as text; a batch whose every value is a number is numeric.
            with contextlib.suppress(pa.ArrowInvalid):
                col = col.cast(pa.float64())
        elif pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        arrays.append(col)
        names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def iter_input(
    path: Path, fmt: str, columns: list[str], values_as_numbers: bool
) -> Iterator[pa.RecordBatch]:
    """Stream the input's needed columns as record batches of bounded size.

    A value column becomes float64 in each batch whose values are all numbers; with
    `values_as_numbers` false it is left as read (a CSV's as text), so that every batch has
    the same schema however the values change along the file.
    """
    numeric = [c for c in columns if c not in ("unique_id", "ds")] if values_as_numbers else []
    try:
        if fmt == "parquet":
            pf = pq.ParquetFile(path)
            for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns):
                yield _normalise(batch, numeric)
        else:
            # Every column as text: Arrow would fix a column's type from the first block and
            # fail the whole file on text further down, where the core names its one series.
            types = {name: pa.string() for name in columns}
            reader = pacsv.open_csv(
                path,
                read_options=pacsv.ReadOptions(block_size=8 << 20),
                # Only an empty cell is null here: "NA" is an id, and a missing value
                # elsewhere (see _normalise).
                convert_options=pacsv.ConvertOptions(
                    include_columns=columns,
                    column_types=types,
                    strings_can_be_null=True,
                    null_values=[""],
                ),
            )
            for batch in reader:
                yield _normalise(batch, numeric)
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeDecodeError) as exc:
        kind = "Parquet" if fmt == "parquet" else "CSV"
        raise InvalidInputError(f"file: malformed {kind}: {exc}", field="file") from None


def unify(batches: list[pa.RecordBatch]) -> pa.Table:
    """One table from batches whose numeric columns may differ in type (CSV type inference
    per block): columns that are text in any batch become text everywhere."""
    if not batches:
        raise no_rows_error()
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


def collect_errors(files: JobFiles, n_parts: int) -> list[dict[str, Any]]:
    errors: list[dict[str, Any]] = []
    for p in range(n_parts):
        meta = files.parts / f"{p:05d}.json"
        if meta.exists():
            errors += json.loads(meta.read_text()).get("errors", [])
    return errors


def write_errors(errors: list[dict[str, Any]], path: Path) -> None:
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


@dataclass(frozen=True)
class CallersTypes:
    """How a Parquet input typed its ids and timestamps, for the result to type them alike:
    the core reads ids as text and timestamps naive (as the model reads them, on their zone's
    wall clock or in UTC), and integer ids or Berlin times would otherwise come back as
    '7' and as naive times an hour off, where `forecaster predict` and `/invocations` give
    them back as given. A CSV's are text, and stay so. A model fitted on integer ds gives
    its steps back as integers, whatever the file."""

    id_type: pa.DataType | None = None  # None: the ids are text
    zone: str | None = None  # None: the timestamps are naive
    wall_clock: bool = False  # how the model reads aware timestamps
    steps: bool = False  # integer ds (`time_axis.is_integer_axis`), held as nanoseconds inside

    @staticmethod
    def of(path: Path, fmt: str, wall_clock: bool, steps: bool = False) -> CallersTypes:
        if fmt != "parquet":
            return CallersTypes(steps=steps)
        schema = pq.read_schema(path)
        id_type = schema.field("unique_id").type
        if pa.types.is_dictionary(id_type):
            id_type = id_type.value_type
        text = pa.types.is_string(id_type) or pa.types.is_large_string(id_type)
        ds_type = schema.field("ds").type
        zone = ds_type.tz if pa.types.is_timestamp(ds_type) else None
        return CallersTypes(None if text else id_type, zone, wall_clock, steps)

    def restore(self, table: pa.Table) -> pa.Table:
        """A result or glitches table (text ids, naive `ds`) typed as the input was."""
        if self.id_type is not None:
            with contextlib.suppress(pa.ArrowInvalid, pa.ArrowNotImplementedError):
                ids = table.column("unique_id").cast(self.id_type)
                table = table.set_column(
                    table.schema.get_field_index("unique_id"), "unique_id", ids
                )
        if self.steps:
            steps = table.column("ds").cast(pa.timestamp("ns")).cast(pa.int64())
            table = table.set_column(table.schema.get_field_index("ds"), "ds", steps)
        elif self.zone is not None:
            ds = pd.Series(table.column("ds").to_numpy(), dtype="datetime64[ns]")
            zoned = pa.array(in_zone(ds, self.zone, self.wall_clock))
            table = table.set_column(table.schema.get_field_index("ds"), "ds", zoned)
        return table


def glitches_part(files: JobFiles, part: int) -> Path:
    """Where part `part` lists its glitches (written only when it has some)."""
    return files.parts / f"{part:05d}.glitches.parquet"


def write_glitches(files: JobFiles, n_parts: int, callers: CallersTypes) -> None:
    """The parts' glitches as one CSV (`unique_id, ds`), in part order, written atomically."""
    tmp = temp_beside(files.glitches_csv)
    schema = pa.schema([("unique_id", pa.string()), ("ds", pa.timestamp("ns"))])
    typed = callers.restore(schema.empty_table()).schema
    try:
        with pacsv.CSVWriter(tmp, typed) as writer:
            for p in range(n_parts):
                path = glitches_part(files, p)
                if path.exists():
                    writer.write_table(callers.restore(pq.read_table(path).cast(schema)))
        os.replace(tmp, files.glitches_csv)
    finally:
        tmp.unlink(missing_ok=True)


def count_rows(path: Path, fmt: str) -> int | None:
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


def assemble(
    files: JobFiles, n_parts: int, output_format: str, callers: CallersTypes = CallersTypes()
) -> None:
    """Stream the parts into result.parquet (and result.csv when asked), atomically, with the
    ids and timestamps typed as the input's (`callers`)."""
    parts = [files.parts / f"{p:05d}.parquet" for p in range(n_parts)]
    if len(parts) == 1 and callers == CallersTypes():  # the part is the result: renamed
        fsync_file(parts[0])
        os.replace(parts[0], files.result_parquet)
    else:
        # Empty partitions hold a schema-only table; take the schema from one with rows.
        with_rows = [p for p in parts if pq.ParquetFile(p).metadata.num_rows]
        schema = pq.read_schema(with_rows[0] if with_rows else parts[0])
        typed = callers.restore(schema.empty_table()).schema
        tmp = temp_beside(files.result_parquet)
        with pq.ParquetWriter(tmp, typed) as writer:
            for path in parts:
                pf = pq.ParquetFile(path)
                for i in range(pf.num_row_groups):
                    writer.write_table(callers.restore(pf.read_row_group(i).cast(schema)))
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
