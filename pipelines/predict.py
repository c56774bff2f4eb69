"""Predict: offline batch scoring of a file with a registered (or saved) model.

The input is streamed: a long Parquet file is read by record batches and a long CSV in
chunks; completed series are forecast ``chunk_series`` at a time (one batched ``predict``
call each) and appended to the output, so memory stays flat however many rows the file
has. Rows of a series must be contiguous (a file sorted by ``unique_id``, or written series
by series); a wide file (a time column plus one column per variable) is read whole, as such
files hold few variables.

For a model with known-future covariates, each series' future rows follow its history with
``y`` empty and the covariates filled, as for the pyfunc model.

The output (CSV or Parquet, by suffix) is written to a temporary file beside it and moved
into place at the end: a failed run leaves no half-written output. So is the optional glitches
file: ``unique_id, ds`` of every reading the model did not use because it read it as a glitch
(``TrainConfig.glitch_threshold``), what ``POST /v1/forecast`` returns as ``glitches``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from forecaster import Forecaster
from forecaster.data import csv_reading, load_frame, reading, split_future_rows
from forecaster.errors import EmptyDataError, ForecasterInputError, MissingColumnsError
from forecaster.outputs import ForecastArrays
from forecaster.validation import ID, TARGET, TIME, in_callers_types
from pipelines.errors import InvalidModelUriError
from pipelines.forecast_log import ForecastLog, StagedRows, records
from pipelines.registry import ModelRef, load_forecaster
from pipelines.series_chunks import whole_series_chunks

logger = logging.getLogger(__name__)

_CSV = (".csv", ".csv.gz")
_PARQUET = (".parquet", ".pq")
ROWS_PER_READ = 200_000


@dataclass(frozen=True)
class PredictSummary:
    """What a batch scoring run read and wrote."""

    model: ModelRef | None  # None for a model loaded from a local directory
    output: Path
    n_series: int
    n_input_rows: int | None  # None when the engine does not count them (spark)
    n_output_rows: int
    seconds: float
    n_glitches: int = 0  # readings read as glitches and not used, over every series
    n_series_with_glitches: int = 0
    glitches_output: Path | None = None  # where they were listed, when asked


def load_model(
    model: str, *, tracking_uri: str | None = None, device: str | None = None
) -> tuple[Forecaster, ModelRef | None]:
    """A model URI (``models:/NAME@alias``, ``models:/NAME/VERSION``) or a saved directory."""
    if not model.startswith("models:/"):
        if Path(model).is_dir():  # Forecaster.load names what a saved model lacks
            return Forecaster.load(model, device=device), None
        raise InvalidModelUriError(
            f"model: expected 'models:/NAME@alias', 'models:/NAME/VERSION' or the "
            f"directory of a saved model, got {model!r}, which is no directory"
        )
    loaded = load_forecaster(model, tracking_uri=tracking_uri, device=device)
    return loaded.forecaster, loaded.ref


def _kind(path: Path, role: str) -> str:
    name = path.name.lower()
    if name.endswith(_CSV):
        return "csv"
    if name.endswith(_PARQUET):
        return "parquet"
    raise ForecasterInputError(
        f"{role} {path}: unknown file type; expected a name ending in one of "
        f"{list(_CSV + _PARQUET)}",
        field=role,
    )


def _columns(path: Path, kind: str) -> list[str]:
    with reading(path, "input"):
        if kind == "parquet":
            return list(pq.ParquetFile(path).schema_arrow.names)
        return list(pd.read_csv(path, nrows=0).columns)


def _checked(path: Path, chunks: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """`chunks`, with a failure to read the rest of the file named as an input error."""
    while True:
        with reading(path, "input"):
            chunk = next(chunks, None)
        if chunk is None:
            return
        yield chunk


def read_chunks(
    path: Path, columns: Sequence[str], rows: int | None = None
) -> tuple[Iterator[pd.DataFrame], int | None]:
    """Chunks of a long file's ``columns`` (``rows`` each, `ROWS_PER_READ` unless given) and the
    total row count when the format knows it."""
    rows = ROWS_PER_READ if rows is None else rows  # read when called, not when defined
    kind = _kind(path, "input")
    if kind == "parquet":
        with reading(path, "input"):
            file = pq.ParquetFile(path)

        def parquet_chunks() -> Iterator[pd.DataFrame]:
            for batch in file.iter_batches(batch_size=rows, columns=list(columns)):
                yield batch.to_pandas()

        return _checked(path, parquet_chunks()), file.metadata.num_rows
    with reading(path, "input"):
        reader = pd.read_csv(path, usecols=list(columns), chunksize=rows, **csv_reading(columns))
    return _checked(path, iter(reader)), None


class _Writer:
    """Appends forecast frames to a CSV or Parquet file written under a temporary name."""

    def __init__(self, path: Path, role: str = "output", allow_empty: bool = False):
        self.path = path
        self.role = role
        self.kind = _kind(path, role)
        self.allow_empty = allow_empty
        if path.is_dir():
            raise ForecasterInputError(
                f"{role} {path}: a directory; expected a file path", field=role
            )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a parent is a file, or cannot be created
            raise ForecasterInputError(
                f"{role} {path}: its directory cannot be created ({exc.strerror})", field=role
            ) from None
        self.partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
        self._parquet: pq.ParquetWriter | None = None
        self._csv_header = True
        self.rows = 0

    def write(self, frame: pd.DataFrame) -> None:
        frame = frame.assign(**{ID: frame[ID].astype(object)})
        if self.kind == "csv":
            frame.to_csv(
                self.partial,
                mode="w" if self._csv_header else "a",
                header=self._csv_header,
                index=False,
            )
            self._csv_header = False
        else:
            table = pa.Table.from_pandas(frame, preserve_index=False)
            if table.schema.field(ID).type == pa.null():  # no rows: ids are text all the same
                at = table.schema.get_field_index(ID)
                table = table.set_column(at, ID, table.column(ID).cast(pa.string()))
            if self._parquet is None:
                self._parquet = pq.ParquetWriter(self.partial, table.schema)
            self._parquet.write_table(table.cast(self._parquet.schema))
        self.rows += len(frame)

    def close(self) -> None:
        """Finish the temporary file, so that `commit` is left only the rename."""
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None
        if self.rows == 0 and not self.allow_empty:
            raise EmptyDataError("no forecasts were produced: the input holds no series")

    def commit(self) -> None:
        self.close()
        try:
            os.replace(self.partial, self.path)
        except OSError as exc:  # e.g. a directory made at the path during the run
            raise ForecasterInputError(
                f"{self.role} {self.path}: cannot be replaced ({exc.strerror})", field=self.role
            ) from None

    def abort(self) -> None:
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None
        self.partial.unlink(missing_ok=True)


def forecast_batch(
    forecaster: Forecaster,
    batch: pd.DataFrame,
    *,
    horizon: int | None = None,
    quantiles: Sequence[float] | None = None,
) -> ForecastArrays:
    """One batched forecast of the complete series in ``batch``, as a file's rows hold them
    (``.to_frame()`` gives what ``Forecaster.predict`` returns).

    With known-future covariates, a series' rows with an empty ``y`` after its last observed
    value are its future (`forecaster.data.split_future_rows`).
    """
    history, future = split_future_rows(batch, forecaster.model_config.covariates)
    steps = forecaster.check_horizon(horizon)
    levels = forecaster.check_quantiles(quantiles)
    return forecaster.forecast(forecaster.prepare(history, future, steps)).select(steps, levels)


def check_paths(
    input_path: str | Path, output_path: str | Path, glitches_output: str | Path | None
) -> None:
    """Refuse, before any work, an output or glitches file that is the input or each other:
    the input would be replaced by forecasts."""
    named = {"input": input_path, "output": output_path, "glitches": glitches_output}
    seen: dict[Path, str] = {}
    for role, path in named.items():
        if path is None or "://" in str(path):
            continue
        resolved = Path(path).resolve()
        if resolved in seen:
            raise ForecasterInputError(
                f"{role} {path}: the same file as the {seen[resolved]}; expected another",
                field=role,
            )
        seen[resolved] = role


def glitches_writer(glitches_output: str | Path | None) -> _Writer | None:
    """The writer of ``--glitches`` (its suffix checked before any work); None when not asked
    for."""
    if glitches_output is None:
        return None
    return _Writer(Path(glitches_output), role="glitches", allow_empty=True)


def predict_file(
    model: str | Forecaster,
    input_path: str | Path,
    output_path: str | Path,
    *,
    horizon: int | None = None,
    quantiles: Sequence[float] | None = None,
    chunk_series: int = 2048,
    tracking_uri: str | None = None,
    device: str | None = None,
    time_column: str | None = None,
    progress: bool = True,
    forecast_log: str | Path | None = None,
    glitches_output: str | Path | None = None,
) -> PredictSummary:
    """Forecast every series of ``input_path`` and write the forecasts to ``output_path``.

    With ``forecast_log``, the forecasts of a registered version are also added to that
    forecast log (``pipelines.forecast_log``) for monitoring, once the output is in place (a
    run that fails logs nothing). With ``glitches_output`` (CSV or
    Parquet), the readings read as glitches are listed there (``unique_id, ds``; only a header
    when there is none); the summary counts them either way.

    Raises:
        ForecasterInputError: bad input (missing columns, NaN, too-short series, ...), naming
            the series; nothing is written then.
        ModelNotFoundError: the model URI resolves to nothing.
    """
    started = time.perf_counter()
    input_path, output_path = Path(input_path), Path(output_path)
    if not input_path.is_file():
        raise ForecasterInputError(f"input {input_path}: no such file", field="input")
    check_paths(input_path, output_path, glitches_output)
    writer = _Writer(output_path)  # checks the output suffixes before any work
    glitch_writer = glitches_writer(glitches_output)
    glitches_output = None if glitch_writer is None else glitch_writer.path
    kind = _kind(input_path, "input")
    if isinstance(model, Forecaster):
        forecaster, ref = model, None
    else:
        forecaster, ref = load_model(model, tracking_uri=tracking_uri, device=device)
    covariates = list(forecaster.model_config.covariates)
    log = staged = None
    if forecast_log is not None and ref is not None:
        log = ForecastLog(forecast_log, retention_days=None)  # the service's to prune
        # Beside the output, and handed to the log with it: a run that fails logs nothing.
        staged = StagedRows(writer.partial.with_name(f"{writer.partial.name}.log.parquet"))
    elif forecast_log is not None:
        logger.info("forecasts of a model loaded from a directory are not logged: no version")

    columns = _columns(input_path, kind)
    if {ID, TIME, TARGET} <= set(columns):
        missing = [c for c in covariates if c not in columns]
        if missing:
            raise MissingColumnsError(
                f"input {input_path}: missing covariate columns {missing} the model needs; "
                f"present columns: {columns}",
                field=missing[0],
            )
        chunks, total = read_chunks(input_path, [ID, TIME, TARGET, *covariates])
    else:  # wide: one series per variable, read whole
        frame = load_frame(input_path, time_column=time_column)
        chunks, total = iter([frame]), len(frame)

    n_series = n_rows = n_glitches = n_glitched_series = 0
    bar = tqdm(
        total=total, unit="rows", desc="forecasting", disable=not progress, dynamic_ncols=True
    )
    try:
        for batch in whole_series_chunks(chunks, chunk_series):
            forecast = forecast_batch(forecaster, batch, horizon=horizon, quantiles=quantiles)
            # Ids and an aware ds come back as given (integer ids, the zone), as from
            # Forecaster.predict.
            wall_clock = forecaster.wall_clock
            typed = {"wall_clock": wall_clock, "freq": forecaster.freq}
            writer.write(in_callers_types(forecast.to_frame(), batch, **typed))
            counts = np.fromiter((len(g) for g in forecast.glitches), dtype=np.int64)
            n_glitches += int(counts.sum())
            n_glitched_series += int((counts > 0).sum())
            if glitch_writer is not None:
                glitch_writer.write(in_callers_types(forecast.glitch_frame(), batch, **typed))
            if staged is not None:
                staged.append(records(forecast, model_name=ref.name, model_version=ref.version))
            n_series += int(batch[ID].nunique())
            n_rows += len(batch)
            bar.update(len(batch))
            bar.set_postfix(series=n_series)
        # Both files finished before either is renamed, the output first: a run that fails
        # leaves neither, and the glitches file never describes an output that is not there.
        writer.close()
        if glitch_writer is not None:
            glitch_writer.close()
        writer.commit()
        if glitch_writer is not None:
            glitch_writer.commit()
        if staged is not None:
            staged.hand_over(log)
    except BaseException:
        writer.abort()
        if glitch_writer is not None:
            glitch_writer.abort()
        raise
    finally:
        bar.close()
        if staged is not None:
            staged.discard()
    summary = PredictSummary(
        ref,
        output_path,
        n_series,
        n_rows,
        writer.rows,
        time.perf_counter() - started,
        n_glitches,
        n_glitched_series,
        glitches_output,
    )
    logger.info(
        "wrote %d forecast rows for %d series to %s in %.1fs",
        summary.n_output_rows,
        n_series,
        output_path,
        summary.seconds,
    )
    return summary
