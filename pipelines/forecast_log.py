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
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
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
    return frame.astype({c: "str" for c in TEXT_COLUMNS})


TEXT_COLUMNS = ("model_name", "model_version", "unique_id")
# The schema of coded rows: each text column an index into the sorted distinct values.
_CODED = pa.schema(
    [
        pa.field(c, pa.int32()) if c in TEXT_COLUMNS else f
        for c, f in zip(SCHEMA.names, SCHEMA, strict=True)
    ]
)


@dataclass(frozen=True)
class CodedLog:
    """Rows of the log with each text column as integer codes into the sorted distinct values
    of the whole log read (so a code's order is its text's order, in every part)."""

    rows: pd.DataFrame  # the columns of SCHEMA; model_name, model_version, unique_id: int32
    names: np.ndarray  # model names, sorted (str)
    versions: np.ndarray  # model versions, sorted (str)
    series: np.ndarray  # series ids, sorted (str)

    def decoded(self) -> pd.DataFrame:
        """The rows with their text columns as text (`read_log`'s frame)."""
        text = {"model_name": self.names, "model_version": self.versions, "unique_id": self.series}
        frame = self.rows.copy()
        for column, values in text.items():
            frame[column] = pd.Series(values[frame[column].to_numpy()], dtype="str")
        return frame


def read_log(directory: str | Path, *, model_name: str | None = None) -> pd.DataFrame:
    """Every row of the log (of ``model_name`` when given); an empty frame when there is none.

    The same forecast logged twice (a client asking again, a resumed batch job) counts once:
    rows are unique per version, series, origin and step, the latest kept. The rows are in
    order of version, series, origin and step.
    """
    parts = list(read_log_parts(directory, model_name=model_name))
    return parts[0].decoded() if parts else empty_log()


def read_log_parts(
    directory: str | Path,
    *,
    model_name: str | None = None,
    max_rows: int | None = None,
    spill_dir: str | Path | None = None,
) -> Iterator[CodedLog]:
    """`read_log`'s rows in parts of about ``max_rows`` logged rows (all in one part when
    None), each part the rows of a range of series, so that a consumer that works series by
    series (scoring) holds one part at a time; nothing when the log holds no row.

    Each part is deduplicated and ordered as `read_log` is; its series come after the previous
    part's. With more than one part the rows are first sorted into one file per part under
    ``spill_dir`` (created if missing; the system's temporary directory by default; about 72
    bytes a row), read back one at a time: memory then grows with the part, not with the log,
    which every retrain reads whole (benchmarks.forecast_log). The files go when the
    iteration ends.
    """
    files = sorted(Path(directory).glob(f"{_PREFIX}*{_SUFFIX}"))
    filters = None if model_name is None else [("model_name", "=", model_name)]
    # First pass, the text columns alone: their distinct values (codes in text order across
    # files, whose dictionaries differ) and the rows of each series (where parts end).
    seen: dict[str, list[np.ndarray]] = {c: [] for c in TEXT_COLUMNS}
    counts, readable = [], []
    for path in files:
        table = _read(path, list(TEXT_COLUMNS), filters)
        if table is None or not table.num_rows:
            continue
        readable.append(path)
        for column in TEXT_COLUMNS:
            values, indices = _dictionary(table[column])
            seen[column].append(values)
            if column == "unique_id":
                counts.append((values, np.bincount(indices, minlength=len(values))))
    if not readable:
        return
    names, versions, series = (np.unique(np.concatenate(seen[c])) for c in TEXT_COLUMNS)
    del seen
    rows_of = np.zeros(len(series), dtype=np.int64)
    for values, n in counts:
        np.add.at(rows_of, np.searchsorted(series, values), n)
    del counts
    limit = rows_of.sum() if max_rows is None else max(1, max_rows)
    # A series' rows in the part where its last row falls: parts of about `limit` rows.
    part_of = np.unique((np.cumsum(rows_of) - 1) // limit, return_inverse=True)[1]
    sorted_values = {"model_name": names, "model_version": versions, "unique_id": series}

    def coded(path: Path) -> pa.Table | None:
        table = _read(path, None, filters)  # None: pruned since the first pass
        if table is None or not table.num_rows:
            return None
        columns = []
        for column in SCHEMA.names:
            if column in TEXT_COLUMNS:
                values, indices = _dictionary(table[column])
                to_code = np.searchsorted(sorted_values[column], values).astype(np.int32)
                columns.append(pa.array(to_code[indices]))
            else:
                columns.append(table[column])
        return pa.table(columns, schema=_CODED)

    def part(table: pa.Table) -> CodedLog:
        rows = table.take(pa.array(_latest_in_order(table))).to_pandas(self_destruct=True)
        return CodedLog(rows, names, versions, series)

    if part_of[-1] == 0:  # one part: read in memory
        tables = [t for t in map(coded, readable) if t is not None]
        if tables:
            yield part(pa.concat_tables(tables))
        return
    if spill_dir is not None:
        Path(spill_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=spill_dir, prefix="forecast-log-") as spill:
        paths = [Path(spill) / f"{p}.arrow" for p in range(part_of[-1] + 1)]
        writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}
        try:
            for path in readable:
                table = coded(path)
                if table is None:
                    continue
                # The file's rows by part, in the order written (ties are broken by it).
                parts = part_of[table["unique_id"].to_numpy()]
                order = np.argsort(parts, kind="stable")
                bounds = np.searchsorted(parts[order], np.arange(len(paths) + 1))
                for p in np.flatnonzero(np.diff(bounds)):
                    if p not in writers:
                        writers[p] = pa.ipc.new_file(paths[p], _CODED)
                    writers[p].write_table(table.take(pa.array(order[bounds[p] : bounds[p + 1]])))
        finally:
            for writer in writers.values():
                writer.close()
        for p in sorted(writers):
            with pa.OSFile(str(paths[p])) as source:
                table = pa.ipc.open_file(source).read_all()
            paths[p].unlink()
            yield part(table)


def _read(path: Path, columns: list[str] | None, filters) -> pa.Table | None:
    """One log file's rows (of `columns`), dictionaries unified; None when it is gone or
    unreadable."""
    try:
        table = pq.read_table(path, columns=columns, schema=SCHEMA, filters=filters)
    except FileNotFoundError:  # pruned while we listed
        return None
    except (pa.ArrowException, OSError) as exc:
        # Writers rename complete files into place, so this is a file put there by hand;
        # one bad file must not stop every later retrain.
        logger.warning("forecast log: skipped unreadable file %s: %s", path, exc)
        return None
    return table.unify_dictionaries()


def _dictionary(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A dictionary column of one file as its values (str) and each row's index into them
    (nulls, which writers never write, as the first value)."""
    chunks = [chunk for chunk in column.chunks if len(chunk)]
    values = np.asarray(chunks[0].dictionary.to_pylist(), dtype=str)
    indices = [pc.fill_null(chunk.indices, 0).to_numpy() for chunk in chunks]
    return values, np.concatenate(indices)


def _latest_in_order(table: pa.Table) -> np.ndarray:
    """Row numbers of coded rows: the latest row of each forecast logged more than once, every
    forecast in order of version, series, origin and step (then model name).

    One sort puts each forecast's rows together in the order they were logged (rows of a tie
    in the order written), and the last of each is kept. Its own function so that the sort's
    arrays are freed before the rows are taken."""
    name, version, series = (table[c].to_numpy() for c in TEXT_COLUMNS)
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
