"""The forecast log: what each model version forecast, kept to be scored once actuals arrive.

The service and ``forecaster predict`` append to it; ``pipelines.monitor`` reads it when the
next retrain (or ``forecaster monitor``) sees the data that has been observed since. A log is
a directory of Parquet files, one per flush, each written under a temporary name and renamed
into place: readers never see half a file, and any number of writers (service worker
processes, batch scoring runs, replicas on a shared volume) share one directory without a
lock. Files older than the retention are deleted by the writers.

One row per series and forecast step:

- ``model_name``, ``model_version``: the registered version that forecast;
- ``unique_id``, ``origin`` (the last timestamp of the history it was given), ``step`` (1..H),
  ``ds`` (the forecast timestamp), ``mean``;
- ``lower``, ``upper``: the outermost quantiles forecast and ``level`` their nominal coverage
  (0.8 for q0.1 and q0.9); NaN when fewer than two quantiles were asked for;
- ``logged_at``: when the row was written (UTC).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from forecaster.outputs import ForecastArrays

logger = logging.getLogger(__name__)

# Text columns repeat (a version on every row, an id on every step): dictionary-encoded, they
# cost an index per row in memory and on disk.
_TEXT = pa.dictionary(pa.int32(), pa.string())
SCHEMA = pa.schema(
    [
        ("model_name", _TEXT),
        ("model_version", _TEXT),
        ("unique_id", _TEXT),
        ("origin", pa.timestamp("ns")),
        ("step", pa.int32()),
        ("ds", pa.timestamp("ns")),
        ("mean", pa.float64()),
        ("lower", pa.float64()),
        ("upper", pa.float64()),
        ("level", pa.float64()),
        ("logged_at", pa.timestamp("ms", tz="UTC")),
    ]
)
_PREFIX, _SUFFIX = "part-", ".parquet"
# Writers prune expired files at most this often.
PRUNE_EVERY_S = 3600.0


def records(forecast: ForecastArrays, *, model_name: str, model_version: str) -> pa.Table:
    """Log rows of a forecast of S series and H steps (one row per series and step)."""
    s, h = forecast.mean.shape
    n = s * h
    levels = forecast.levels
    if len(levels) >= 2:
        lower = forecast.quantiles[:, :, int(np.argmin(levels))].reshape(n)
        upper = forecast.quantiles[:, :, int(np.argmax(levels))].reshape(n)
        level = round(max(levels) - min(levels), 6)
    else:
        lower = upper = np.full(n, np.nan)
        level = np.nan
    now = np.datetime64(datetime.now(UTC).replace(tzinfo=None), "ms")
    columns = {
        "model_name": _repeated([model_name], np.zeros(n, dtype=np.int32)),
        "model_version": _repeated([str(model_version)], np.zeros(n, dtype=np.int32)),
        "unique_id": _repeated(
            forecast.series_ids.astype(str), np.repeat(np.arange(s, dtype=np.int32), h)
        ),
        "origin": pa.array(np.repeat(forecast.origins, h), pa.timestamp("ns")),
        "step": pa.array(np.tile(np.arange(1, h + 1, dtype=np.int32), s), pa.int32()),
        "ds": pa.array(forecast.timestamps.reshape(n), pa.timestamp("ns")),
        "mean": pa.array(forecast.mean.reshape(n).astype(np.float64)),
        "lower": pa.array(np.asarray(lower, dtype=np.float64)),
        "upper": pa.array(np.asarray(upper, dtype=np.float64)),
        "level": pa.array(np.full(n, level, dtype=np.float64)),
        "logged_at": pa.array(np.full(n, now), pa.timestamp("ms", tz="UTC")),
    }
    return pa.table(columns, schema=SCHEMA)


def _repeated(values: Sequence[str] | np.ndarray, index: np.ndarray) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(index), pa.array(values, pa.string()))


class ForecastLog:
    """Buffers log rows and writes them as one Parquet file per flush; thread-safe.

    ``append`` is cheap (the rows are kept in memory); a flush happens when the buffer holds
    ``flush_rows`` rows (in the appending thread) and whenever the owner calls ``flush`` (the
    service every few seconds and at shutdown, batch scoring at the end of a run). Past
    ``max_buffer_rows`` (a disk that stays unwritable) new rows are dropped and counted.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        retention_days: float | None = 90.0,
        flush_rows: int = 200_000,
        max_buffer_rows: int = 2_000_000,
    ):
        self.directory = Path(directory)
        self.retention_days = retention_days
        self.flush_rows = flush_rows
        self.max_buffer_rows = max_buffer_rows
        self.dropped_rows = 0
        self.written_rows = 0  # rows in files, so a caller can count what is on disk
        self._buffer: list[pa.Table] = []
        self._rows = 0
        self._lock = threading.Lock()  # guards the buffer
        self._write_lock = threading.Lock()  # one file written at a time
        # The first flush prunes: the monotonic clock starts near 0 at boot, so "0" would
        # mean "pruned a moment ago" on a machine up for less than PRUNE_EVERY_S.
        self._last_prune = -math.inf

    @property
    def buffered_rows(self) -> int:
        """Rows appended and not yet written."""
        return self._rows

    def append(self, table: pa.Table) -> None:
        with self._lock:
            if self._rows + table.num_rows > self.max_buffer_rows:
                self.dropped_rows += table.num_rows
                return
            self._buffer.append(table)
            self._rows += table.num_rows
            full = self._rows >= self.flush_rows
        if full:
            self.flush()

    def flush(self) -> Path | None:
        """Write the buffered rows to a new file; returns it (None when nothing was buffered).

        Raises OSError when the file cannot be written; the rows stay buffered for the next try.
        """
        with self._write_lock:
            with self._lock:
                tables, self._buffer, self._rows = self._buffer, [], 0
            if not tables:
                return None
            try:
                path = self._write(pa.concat_tables(tables))
            except BaseException:
                with self._lock:
                    self._buffer[:0] = tables
                    self._rows += sum(t.num_rows for t in tables)
                raise
            self.written_rows += sum(t.num_rows for t in tables)
            if self.retention_days is not None and time.monotonic() - self._last_prune > (
                PRUNE_EVERY_S
            ):
                self._last_prune = time.monotonic()
                prune(self.directory, self.retention_days)
            return path

    def adopt(self, staged: Path) -> Path:
        """Make a file of log rows written elsewhere part of the log, under a name of its own:
        a batch job stages its chunks' rows beside its parts and hands them over once its
        result is committed, so a cancelled or restarted job logs nothing it did not serve.
        Raises OSError when it cannot be moved or copied in; `staged` is then left as it is."""
        rows = pq.ParquetFile(staged).metadata.num_rows
        with self._write_lock:
            path, tmp = self._new_path()
            try:
                try:
                    os.replace(staged, path)
                except OSError:  # another file system: copied in, then renamed into place
                    shutil.copyfile(staged, tmp)
                    os.replace(tmp, path)
                    staged.unlink()
            finally:
                tmp.unlink(missing_ok=True)
            self.written_rows += rows
        return path

    def _new_path(self) -> tuple[Path, Path]:
        """A new log file's name, and the temporary name it is written under."""
        self.directory.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        name = f"{_PREFIX}{stamp}-{os.getpid()}-{uuid.uuid4().hex[:8]}{_SUFFIX}"
        return self.directory / name, self.directory / f".{name}.tmp"

    def _write(self, table: pa.Table) -> Path:
        path, tmp = self._new_path()
        try:
            pq.write_table(table, tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path


class StagedRows:
    """Log rows kept in a file of their own until what they forecast has been delivered, then
    handed to the log whole (`ForecastLog.adopt`): a run that fails half way logs nothing it
    did not deliver, and rows go to disk as they come, so memory stays flat."""

    def __init__(self, path: Path):
        self.path = path
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None

    def append(self, table: pa.Table) -> None:
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, SCHEMA)
        self._writer.write_table(table)
        self.rows += table.num_rows

    def hand_over(self, log: ForecastLog) -> Path | None:
        """Move the rows into `log`; the file it became (None when there were none)."""
        self._close()
        if not self.rows:
            return None
        return log.adopt(self.path)

    def discard(self) -> None:
        self._close()
        self.path.unlink(missing_ok=True)

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def prune(directory: str | Path, retention_days: float) -> int:
    """Delete the log files written more than ``retention_days`` ago, and the temporary files
    of writers killed before their rename as old; returns how many."""
    cutoff = time.time() - retention_days * 86400
    removed = 0
    files = [*Path(directory).glob(f"{_PREFIX}*{_SUFFIX}")]
    files += Path(directory).glob(f".{_PREFIX}*{_SUFFIX}.tmp")
    for path in files:
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except FileNotFoundError:  # another writer pruned it first
            continue
    if removed:
        logger.info(
            "forecast log %s: deleted %d file(s) past %g days", directory, removed, retention_days
        )
    return removed


def empty_log() -> pd.DataFrame:
    """A log frame without rows (no log configured, or nothing logged yet)."""
    frame = SCHEMA.empty_table().to_pandas()
    return frame.astype({c: "str" for c in ("model_name", "model_version", "unique_id")})


_TEXT_COLUMNS = ("model_name", "model_version", "unique_id")


def read_log(directory: str | Path, *, model_name: str | None = None) -> pd.DataFrame:
    """Every row of the log (of ``model_name`` when given); an empty frame when there is none.

    The same forecast logged twice (a client asking again, a resumed batch job) counts once:
    rows are unique per version, series, origin and step, the latest kept. The rows are in
    order of version, series, origin and step.

    The filter runs in the Parquet reader, and the deduplication and the order on integer
    codes of the text columns, so that pandas gets the result alone: every retrain reads a
    log that holds tens of millions of rows (benchmarks.forecast_log).
    """
    files = sorted(Path(directory).glob(f"{_PREFIX}*{_SUFFIX}"))
    filters = None if model_name is None else [("model_name", "=", model_name)]
    tables = []
    for path in files:
        try:
            tables.append(pq.read_table(path, schema=SCHEMA, filters=filters))
        except FileNotFoundError:  # pruned while we listed
            continue
        except (pa.ArrowException, OSError) as exc:
            # Writers rename complete files into place, so this is a file put there by hand;
            # one bad file must not stop every later retrain.
            logger.warning("forecast log: skipped unreadable file %s: %s", path, exc)
    if not tables:
        return empty_log()
    table = pa.concat_tables(tables).unify_dictionaries()
    del tables  # their buffers go with the table's once its rows are taken
    if not table.num_rows:
        return empty_log()
    table = table.take(pa.array(_latest_in_order(table)))
    for column in _TEXT_COLUMNS:
        at = table.schema.get_field_index(column)
        table = table.set_column(at, column, pc.cast(table[column], pa.string()))
    # Column by column, each freed from Arrow once converted: not the log twice in memory.
    frame = table.to_pandas(split_blocks=True, self_destruct=True)
    return frame.astype({c: "str" for c in _TEXT_COLUMNS})


def _latest_in_order(table: pa.Table) -> np.ndarray:
    """Row numbers of `table`: the latest row of each forecast logged more than once, every
    forecast in order of version, series, origin and step (then model name).

    One sort puts each forecast's rows together in the order they were logged (rows of a tie
    in the order written), and the last of each is kept. Its own function so that the sort's
    arrays are freed before the rows are taken: a log of 14 million rows peaked at 5.7 GB
    with them alive, 4.3 GB without."""
    name, version, series = (_text_ranks(table[c]) for c in _TEXT_COLUMNS)
    origin, step, logged = (_int64(table[c]) for c in ("origin", "step", "logged_at"))
    # np.lexsort sorts by its last key first, and keeps the order written on a tie.
    order = np.lexsort((logged, name, step, origin, series, version))
    last = np.zeros(len(order), dtype=bool)
    last[-1] = True
    for key in (version, series, origin, step, name):  # the next row is another forecast
        in_order = key[order]
        last[:-1] |= in_order[1:] != in_order[:-1]
    return order[last]


def _int64(column: pa.ChunkedArray) -> np.ndarray:
    """A numeric or timestamp column as int64 (nulls, which writers never write, as the
    smallest value)."""
    values = pc.fill_null(column.cast(pa.int64()), np.iinfo(np.int64).min)
    return np.concatenate([chunk.to_numpy() for chunk in values.chunks])


def _text_ranks(column: pa.ChunkedArray) -> np.ndarray:
    """Each row's place in the sorted distinct values of a dictionary column whose chunks
    share one dictionary (`Table.unify_dictionaries`)."""
    dictionary = np.asarray(column.chunk(0).dictionary.to_pylist(), dtype=str)
    rank = np.empty(len(dictionary), dtype=np.int64)
    rank[np.argsort(dictionary, kind="stable")] = np.arange(len(dictionary))
    indices = [pc.fill_null(chunk.indices, 0).to_numpy() for chunk in column.chunks]
    return rank[np.concatenate(indices)]
