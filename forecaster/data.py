"""Loading long and wide frames, the quantile column convention, and time-ordered splits.

Long format (Nixtla's convention): `unique_id`, `ds`, `y` plus optional covariate columns.
Wide CSVs such as ETTh1 (`date` plus one column per variable) become one series per numeric
column (channel independence), `unique_id` being the column name.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from pandas._libs.parsers import STR_NA_VALUES  # read_csv's default missing-value tokens

from forecaster.columns import ID, TARGET, TIME
from forecaster.errors import (
    EmptyDataError,
    ForecasterInputError,
    InvalidConfigError,
    MissingColumnsError,
    NonNumericValuesError,
    SeriesTooShortError,
)
from forecaster.time_axis import is_aware, is_integer_time, parse_timestamps

__all__ = [
    "ID",
    "TARGET",
    "TIME",
    "TimeSplit",
    "load_frame",
    "quantile_column",
    "read_wide_csv",
    "time_split",
    "wide_to_long",
]

_CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.zip", ".csv.bz2", ".csv.xz")
_PARQUET_SUFFIXES = (".parquet", ".pq")


def quantile_column(q: float) -> str:
    """Name of the forecast column holding quantile `q`: 0.1 -> "q0.1", 0.5 -> "q0.5"."""
    return f"q{float(q):g}"


def wide_to_long(df: pd.DataFrame, time_column: str = "date") -> pd.DataFrame:
    """One series per numeric column of a wide frame; `unique_id` is the column name.

    Text columns other than the time column (labels: no value reads as a number) are ignored;
    a column of numbers with a cell that is not one is refused, naming the cell, as one typo
    would otherwise drop a whole series. Rows come out grouped by series in column order, time
    in the file's order within each.
    """
    if not isinstance(df, pd.DataFrame):
        raise ForecasterInputError(f"data: expected a pandas DataFrame, got {type(df).__name__}")
    if len(df) == 0:
        raise EmptyDataError("wide frame has no rows", field=time_column)
    if time_column not in df.columns:
        raise MissingColumnsError(
            f"wide frame lacks its time column {time_column!r}; present columns: "
            f"{list(map(str, df.columns))}",
            field=time_column,
        )
    columns = {}  # value column -> its numbers
    for c in df.columns:
        if c != time_column and not pd.api.types.is_bool_dtype(df[c]):
            numbers = _numbers(df, c, time_column)
            if numbers is not None:
                columns[c] = numbers
    value_columns = list(columns)
    if not value_columns:
        raise NonNumericValuesError(
            f"wide frame has no numeric value columns besides {time_column!r}; present columns: "
            f"{list(map(str, df.columns))}",
            field=time_column,
        )
    ds = _timestamps(df[time_column], column=time_column)
    n_rows, n_cols = len(df), len(value_columns)
    values = np.column_stack(  # (T, C)
        [v.to_numpy(dtype=np.float64, na_value=np.nan) for v in columns.values()]
    )
    return pd.DataFrame(
        {
            ID: pd.array(
                np.repeat(np.asarray(value_columns, dtype=object).astype(str), n_rows), dtype="str"
            ),
            TIME: ds.take(np.tile(np.arange(n_rows), n_cols)),
            TARGET: values.T.reshape(-1),
        }
    )


def _timestamps(
    col: pd.Series, ids: np.ndarray | None = None, column: str = TIME
) -> np.ndarray | pd.api.extensions.ExtensionArray:
    """A file's time column, checked: naive values parsed, those with a zone or UTC offset
    kept as they are (an aware column, ISO text with offsets), integer steps too. Parsed,
    aware ones would be naive wall-clock or UTC times: a forecast of them would come back
    naive, an hour or two off the zone it was asked in, where `predict` gives an aware
    history's forecasts back in its zone."""
    parsed = parse_timestamps(col, ids, column=column)  # names a bad value's row and series
    return col.array if is_aware(col) or is_integer_time(col) else parsed


def _numbers(df: pd.DataFrame, column: object, time_column: str) -> pd.Series | None:
    """`column` of a wide frame as numbers (empty cells missing); None for a text column (no
    cell reads as a number). Raises where numbers stand beside a cell that is not one."""
    values = df[column]
    if pd.api.types.is_numeric_dtype(values):
        return values
    numbers = pd.to_numeric(values, errors="coerce")
    if not numbers.notna().any():
        return None
    bad = numbers.isna() & values.notna() & (values.astype("str").str.strip() != "")
    if bad.any():
        i = int(np.argmax(bad.to_numpy()))
        raise NonNumericValuesError(
            f"column {column!r} holds numbers but {values.iloc[i]!r} at {time_column} "
            f"{df[time_column].iloc[i]} (row {i}) is not one; expected a number or an empty "
            "cell for a missing value",
            field=str(column),
        )
    return numbers


def ids_as_text(ids: pd.Series) -> pd.Series:
    """Series ids as text, as a CSV reads them, a missing id kept missing (pandas 2 casts it to
    the text 'nan', which would be trained and forecast as a series of that name)."""
    return ids.astype("str").mask(ids.isna())


def read_wide_csv(path: str | Path, time_column: str = "date") -> pd.DataFrame:
    """A wide CSV (e.g. ETTh1.csv: `date` plus one column per variable) as a long frame."""
    return wide_to_long(_read(Path(path)), time_column=time_column)


def load_frame(path: str | Path, *, time_column: str | None = None) -> pd.DataFrame:
    """Load CSV or Parquet (by suffix) as a long frame.

    A file with `unique_id`, `ds` and `y` columns is long already (its `ds` is parsed, other
    columns kept as covariates); anything else is read as wide with a `date` (or `time_column`)
    column. The result is not validated: call `validate_long_frame` on it.
    """
    path = Path(path)
    df = _read(path)
    if {ID, TIME, TARGET} <= set(df.columns) and time_column in (None, TIME):
        df[ID] = ids_as_text(df[ID])
        df[TIME] = _timestamps(df[TIME], df[ID].to_numpy(dtype=object))
        return df
    column = time_column or "date"
    if column not in df.columns:
        header = str(df.columns[0]) if len(df.columns) == 1 else ""
        other = max(";\t|", key=header.count)
        hint = (
            f" (the header reads as one column: the file looks separated by {other!r}; "
            "expected ',')"
            if header.count(other)
            else ""
        )
        raise MissingColumnsError(
            f"{path}: expected a long file with columns {[ID, TIME, TARGET]} or a wide file with "
            f"a {column!r} time column; present columns: {list(map(str, df.columns))}{hint}",
            field=column,
        )
    return wide_to_long(df, time_column=column)


@contextmanager
def reading(path: Path, field: str = "path") -> Iterator[None]:
    """Turn a reader's failure on the file `path` (empty, corrupt, not gzip, not Parquet...)
    into an input error naming the file and `field`."""
    try:
        yield
    except ForecasterInputError:
        raise
    except pd.errors.EmptyDataError:
        raise EmptyDataError(f"{path}: file is empty", field=field) from None
    except Exception as exc:  # pandas, gzip and pyarrow each raise their own kinds
        raise ForecasterInputError(
            f"{path}: cannot read file: {type(exc).__name__}: {exc}", field=field
        ) from None


def _read(path: Path) -> pd.DataFrame:
    name = path.name.lower()
    if name.endswith(_CSV_SUFFIXES):
        reader = _read_csv
    elif name.endswith(_PARQUET_SUFFIXES):
        reader = pd.read_parquet
    else:
        raise ForecasterInputError(
            f"{path}: unknown file type {path.suffix!r}; expected one of "
            f"{list(_CSV_SUFFIXES + _PARQUET_SUFFIXES)}",
            field="path",
        )
    if not path.is_file():
        raise ForecasterInputError(f"{path}: no such file", field="path")
    with reading(path):
        df = reader(path)
    if len(df) == 0:
        raise EmptyDataError(
            f"{path}: file has a header but no rows (columns {list(map(str, df.columns))})",
            field="path",
        )
    return df


# The text read as a missing value in a CSV's value columns (pandas' own list: "", NA, NaN,
# null, N/A...). An id is text whatever it spells ("NA" is Namibia's code); only an empty
# id is missing.
MISSING_TOKENS = frozenset(STR_NA_VALUES)


def csv_reading(columns: Sequence[object]) -> dict[str, object]:
    """`pd.read_csv` options for a file with `columns`: ids as text ("007" stays "007", "NA"
    stays "NA"), MISSING_TOKENS missing in every other column."""
    tokens = sorted(MISSING_TOKENS)
    return {
        "dtype": {ID: "str"},
        "keep_default_na": False,
        "na_values": {c: [""] if c == ID else tokens for c in columns},
    }


def _read_csv(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, **csv_reading(pd.read_csv(path, nrows=0).columns))


@dataclass(frozen=True)
class TimeSplit:
    """Time-ordered splits of a long frame.

    `val` and `test` each start with `context_length` points of history (which overlap the
    previous split) followed by their own `val_length` / `test_length` points.
    """

    train: pd.DataFrame
    val: pd.DataFrame
    test: pd.DataFrame


def time_split(
    df: pd.DataFrame,
    *,
    val_length: int,
    test_length: int,
    context_length: int = 0,
    min_train_length: int | None = None,
) -> TimeSplit:
    """Split every series in time: train, then validation, then test.

    Per series of n points: train holds the first n - val_length - test_length points;
    val the next val_length points preceded by up to context_length points of history; test
    the last test_length points preceded likewise. A series must have at least
    `min_train_length` (default max(1, context_length)) training points, else
    `SeriesTooShortError`.
    """
    for name, value in (
        ("val_length", val_length),
        ("test_length", test_length),
        ("context_length", context_length),
    ):
        if not isinstance(value, int | np.integer) or value < 0:
            raise InvalidConfigError(f"{name}: expected an int >= 0, got {value!r}", field=name)
    if not isinstance(df, pd.DataFrame):
        raise ForecasterInputError(f"data: expected a pandas DataFrame, got {type(df).__name__}")
    if len(df) == 0:
        raise EmptyDataError("cannot split an empty frame")
    missing = [c for c in (ID, TIME) if c not in df.columns]
    if missing:
        raise MissingColumnsError(
            f"missing required columns {missing}; present columns: {list(map(str, df.columns))}",
            field=missing[0],
        )
    codes = pd.factorize(df[ID])[0]
    ds_i8 = parse_timestamps(df[TIME], df[ID].to_numpy(dtype=object)).view(np.int64)
    order = np.lexsort((ds_i8, codes))  # series in order of appearance, time up
    frame = df.iloc[order].reset_index(drop=True) if (order != np.arange(len(df))).any() else df
    codes = codes[order]
    lengths = np.bincount(codes)
    n = lengths[codes]
    position = np.arange(len(frame)) - (np.cumsum(lengths) - lengths)[codes]

    n_train = lengths - val_length - test_length
    need = max(1, context_length) if min_train_length is None else max(1, min_train_length)
    short = n_train < need
    if short.any():
        k = int(np.argmax(short))
        sid = str(frame[ID].iat[int(np.argmax(codes == k))])
        raise SeriesTooShortError(
            f"series {sid!r} has {int(lengths[k])} points, expected at least "
            f"{need + val_length + test_length} to split into train (>= {need}), "
            f"val ({val_length}) and test ({test_length})",
            series_id=sid,
            field=TARGET,
        )
    train_end = n - val_length - test_length
    val_end = n - test_length
    train = position < train_end
    val = (position >= train_end - context_length) & (position < val_end) & (val_length > 0)
    test = (position >= val_end - context_length) & (test_length > 0)
    return TimeSplit(
        train=frame[train].reset_index(drop=True),
        val=frame[val].reset_index(drop=True),
        test=frame[test].reset_index(drop=True),
    )


def split_future_rows(
    frame: pd.DataFrame, covariates: Sequence[str]
) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """Split one frame into history and known-future covariate rows.

    MLflow's scoring formats carry a single frame, so for a model with known-future covariates
    each series' future rows are appended with `y` empty. Both the registered pyfunc model and
    the service's `/invocations` read inputs this way. The future rows are the rows with an
    empty `y` after a series' last observed value; an empty `y` before it is a missing value.
    Empty is what validation reads as missing (NaN, None, MISSING_TOKENS text); other text
    stays history, where validation names it, instead of moving the forecast origin back.
    """
    if not covariates or TARGET not in frame.columns:
        return frame, None
    y = frame[TARGET]
    missing = y.isna()
    if not pd.api.types.is_numeric_dtype(y):
        missing |= y.isin(MISSING_TOKENS)
    if not missing.any():
        return frame, None
    ids = frame[ID].astype("str")
    # Rows counted from each series' end: a row is future when no observed value follows it.
    observed_after = (~missing)[::-1].groupby(ids[::-1], sort=False).cumsum()[::-1]
    is_future = (missing & (observed_after == 0)).to_numpy()
    if not is_future.any():
        return frame, None
    return frame[~is_future].reset_index(drop=True), frame[is_future].reset_index(drop=True)
