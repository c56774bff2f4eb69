"""Series-validation rules: the one place they live.

Every entry point that accepts user data (the `Forecaster`, the baselines, the pipelines, the
service) calls `validate_long_frame` / `validate_future_frame`; nobody re-checks by hand. Each
problem raises its own `ForecasterInputError` subclass whose message names the series, the
column and, where useful, the timestamp, with expected versus actual, and whose `series_id` and
`field` attributes let the service answer a 4xx naming them.

All checks are vectorised over rows (numpy / pandas groupby-free arithmetic on the factorised
series codes), so validating millions of rows over 100k series costs a few hundred milliseconds.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
from pandas.tseries.offsets import BaseOffset

from forecaster.columns import ID, TARGET, TIME
from forecaster.data import MISSING_TOKENS
from forecaster.errors import (
    AmbiguousSeriesIdsError,
    DuplicateTimestampsError,
    EmptyDataError,
    ForecasterInputError,
    FrequencyInferenceError,
    InvalidConfigError,
    IrregularTimestampsError,
    MissingColumnsError,
    MissingCovariatesError,
    MissingValuesError,
    NonNumericValuesError,
    SeriesTooShortError,
)
from forecaster.time_axis import (
    DAY_NS,
    HOUR_NS,
    add_offset,
    business_hours,
    fixed_nanos,
    freq_alias,
    in_zone,
    infer_offset,
    is_integer_axis,
    is_integer_time,
    on_weekend,
    parse_freq,
    parse_timestamps,
    read_timestamps,
    steps_after,
    time_text,
    wall_clock_for,
    zone_of,
)

# Larger magnitudes overflow the squared deviations used for scaling, even in float64.
MAX_ABS_VALUE = 1e30
# Covariates reach the float32 model unscaled: past about 1e18 its layer norms overflow (a
# covariate of 1e20 made every forecast NaN without a word).
MAX_ABS_COVARIATE = 1e15


# A long frame, or its columns as arrays (the road the service takes: no DataFrame inside).
LongData = pd.DataFrame | Mapping[str, Any]


@dataclass(frozen=True)
class ValidatedFrame:
    """A long frame that passed every rule.

    `columns` holds `unique_id` (str), `ds` (datetime64[ns], tz-naive), `y` (float64) and the
    requested covariates (float64) as arrays, nothing else. Rows are grouped by series in order
    of first appearance, each series in time order whatever the caller's order was. `frame` is
    the same as a DataFrame (built on first use, with a fresh RangeIndex), for callers that
    work with frames.
    """

    columns: dict[str, Any]
    freq: str  # pandas offset alias, e.g. "h", "D", "15min", "MS", "W-SUN"
    series_ids: list[str]  # one per series, in row order
    offsets: np.ndarray  # (n_series + 1,) first row of each series, then the row count
    # Aware `ds` read on its zone's wall clock (`time_axis.on_wall_clock`), not in UTC; None
    # for naive `ds`. A future frame, which may hold a single step, is read the same way.
    wall_clock: bool | None = None

    @property
    def n_series(self) -> int:
        return len(self.series_ids)

    @cached_property
    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.columns)

    def in_id_order(self) -> ValidatedFrame:
        """The same frame with its series ordered by id, so that what is computed over the
        series in turn (training's shuffles, held-out series) does not depend on the order the
        caller's rows came in."""
        order = np.argsort(np.asarray(self.series_ids, dtype=object), kind="stable")
        if (order == np.arange(len(order))).all():
            return self
        lengths = np.diff(self.offsets)
        rows = np.concatenate(
            [np.arange(self.offsets[k], self.offsets[k + 1]) for k in order] or [np.arange(0)]
        )
        return ValidatedFrame(
            columns={name: column[rows] for name, column in self.columns.items()},
            freq=self.freq,
            series_ids=[self.series_ids[k] for k in order],
            offsets=np.r_[0, np.cumsum(lengths[order])].astype(np.int64),
            wall_clock=self.wall_clock,
        )


# --------------------------------------------------------------------------------------------
# public API


def validate_long_frame(
    df: LongData,
    *,
    covariates: Sequence[str] = (),
    min_length: int = 1,
    freq: str | None = None,
    target: str = TARGET,
    allow_missing: bool = False,
    wall_clock: bool | None = None,
) -> ValidatedFrame:
    """Check a long frame (`unique_id`, `ds`, target, covariates) and return it normalised.

    Args:
        df: the user's frame, or its columns as equally long arrays. Extra columns are
            ignored and dropped from the result.
        covariates: covariate columns that must be present, numeric and finite.
        min_length: the fewest observed target values a series may have.
        freq: the expected pandas offset alias; inferred from the data when None.
        target: name of the target column in `df`; it is called `y` in the result.
        allow_missing: a NaN target, or a timestamp missing from a series' regular grid, is a
            missing value (a row with `y` NaN in the result, covariates 0) instead of an
            error. The model masks them. A series needs at least one observed value.
        wall_clock: read aware timestamps on their wall clock (True) or in UTC (False), as a
            fitted model read its data (`Forecaster.wall_clock`); when None, as
            `time_axis.wall_clock_for(freq)` says.

    Raises:
        EmptyDataError, MissingColumnsError, InvalidTimestampsError, NonNumericValuesError,
        MissingValuesError, DuplicateTimestampsError,
        SeriesTooShortError, FrequencyInferenceError, IrregularTimestampsError.
    """
    covariates = _check_arguments(covariates, min_length, target)
    columns = _required_columns(df, [ID, TIME, target, *covariates])

    ids, codes, uniques = series_codes(columns[ID])
    if wall_clock is None:
        wall_clock = wall_clock_for(freq)
    ds, wall_clock = read_timestamps(columns[TIME], ids, wall_clock=wall_clock, freq=freq)
    # Integers, or text a model of integer ds read as steps (read_timestamps checks the kind)
    integers = is_integer_axis(freq) or is_integer_time(columns[TIME])
    shown = ds.view(np.int64) if integers else ds  # as messages name a row's time
    values = {
        target: _as_float(columns[target], name=target, ids=ids, ds=shown, allow_nan=allow_missing)
    }
    # A covariate may be missing where the target is (an outage of both): the model reads no
    # covariate where it reads no target, so such a gap is read as 0.
    unobserved = np.isnan(values[target]) if allow_missing else False
    for name in covariates:
        column = _as_float(
            columns[name], name, ids, shown, allow_nan=unobserved, max_abs=MAX_ABS_COVARIATE
        )
        values[name] = np.where(np.isnan(column), 0.0, column) if allow_missing else column

    order = _series_time_order(codes, ds)
    if order is not None:
        codes, ds = codes[order], ds[order]
        values = {name: v[order] for name, v in values.items()}

    ds_i8 = ds.view(np.int64)
    same = codes[1:] == codes[:-1]
    _check_duplicates(codes, ds_i8, same, uniques, integers)
    _check_length(codes, uniques, min_length, observed=~np.isnan(values[target]))
    offset = _check_frequency(
        codes, ds_i8, same, uniques, freq, allow_gaps=allow_missing, integers=integers
    )

    ids = ids if order is None else ids.take(order)
    if allow_missing:
        ids, ds, values, lengths = _fill_gaps(ids, codes, ds, values, offset, uniques, target)
    else:
        lengths = np.bincount(codes, minlength=len(uniques))
    validated = {
        ID: ids,
        TIME: ds,
        TARGET: values[target],
        **{name: values[name] for name in covariates},
    }
    return ValidatedFrame(
        columns=validated,
        freq=freq_alias(offset),
        series_ids=[str(u) for u in uniques],
        offsets=np.r_[0, np.cumsum(lengths)].astype(np.int64),
        wall_clock=wall_clock,
    )


def infer_frequency(df: pd.DataFrame | pd.Series | pd.DatetimeIndex) -> str:
    """The pandas offset alias every series follows.

    Accepts a long frame (`ds` and, for several series, `unique_id`) or the timestamps of a
    single series. Raises the same errors as `validate_long_frame` for bad timestamps, and
    `FrequencyInferenceError` / `IrregularTimestampsError` when no single regular frequency fits.
    """
    if isinstance(df, pd.DataFrame):
        if len(df) == 0:
            raise EmptyDataError("cannot infer a frequency from an empty frame", field=TIME)
        _check_frame(df, [TIME])
        ids_col = df[ID] if ID in df.columns else pd.Series(["series"] * len(df), index=df.index)
        times = df[TIME]
    else:
        times = pd.Series(df)
        if len(times) == 0:
            raise EmptyDataError("cannot infer a frequency from no timestamps", field=TIME)
        ids_col = pd.Series(["series"] * len(times), index=times.index)
    ids, codes, uniques = series_codes(ids_col)
    ds = parse_timestamps(times, ids)
    order = _series_time_order(codes, ds)
    if order is not None:
        codes, ds = codes[order], ds[order]
    ds_i8 = ds.view(np.int64)
    same = codes[1:] == codes[:-1]
    integers = is_integer_time(times)
    _check_duplicates(codes, ds_i8, same, uniques, integers)
    offset = _check_frequency(codes, ds_i8, same, uniques, None, integers=integers)
    return freq_alias(offset)


def validate_future_frame(
    future_df: pd.DataFrame | None,
    *,
    history: ValidatedFrame,
    horizon: int,
    covariates: Sequence[str],
) -> pd.DataFrame:
    """Known-future covariate values for the `horizon` steps after each series' history.

    Every series of `history` needs a row at each of its next `horizon` timestamps (on
    `history.freq`) with every covariate numeric and finite. Rows for other series or later
    timestamps are ignored, unchecked but for their id and time, so a longer covariate
    schedule can be passed as is.

    Returns a frame with `unique_id`, `ds` and the covariates (float64), `horizon` rows per
    series, series in the order of `history.frame` and time increasing within each.
    """
    covariates = list(covariates)
    if horizon < 1:
        raise InvalidConfigError(f"horizon: expected >= 1, got {horizon}", field="horizon")
    expected = future_grid(history, horizon)
    if not covariates:
        return expected
    integers = is_integer_axis(history.freq)  # messages name steps as the integers they are
    if future_df is None:
        raise MissingCovariatesError(
            f"future values of covariates {covariates} are needed for the {horizon} steps after "
            "each series' history, but no future frame was given",
            field=covariates[0],
        )
    if not isinstance(future_df, pd.DataFrame):
        raise ForecasterInputError(
            f"future data: expected a pandas DataFrame, got {type(future_df).__name__}"
        )
    missing_cov = [c for c in covariates if c not in future_df.columns]
    if missing_cov:
        raise MissingCovariatesError(
            f"future frame lacks covariate columns {missing_cov}; "
            f"present columns: {list(map(str, future_df.columns))}",
            field=missing_cov[0],
        )
    if len(future_df) == 0:
        first = str(expected[ID].iat[0])
        raise MissingCovariatesError(
            f"future frame is empty; series {first!r} needs covariates {covariates} at "
            f"{horizon} timestamps starting {time_text(expected[TIME].iat[0], integers)}",
            series_id=first,
            field=covariates[0],
        )
    _check_frame(future_df, [ID, TIME, *covariates])

    ids, codes, uniques = series_codes(future_df[ID])
    ds = parse_timestamps(future_df[TIME], ids, wall_clock=history.wall_clock, freq=history.freq)
    # Only the rows forecasts read are checked: a schedule may run on past them, with values
    # not known yet, or hold series not forecast now.
    keys = pd.DataFrame({ID: ids, TIME: ds})
    wanted = keys.merge(expected[[ID, TIME]].assign(_wanted=True), on=[ID, TIME], how="left")
    rows = np.flatnonzero(wanted["_wanted"].notna().to_numpy())
    ids, codes, ds = ids[rows], codes[rows], ds[rows]
    values = {
        name: _as_float(
            future_df[name].iloc[rows],
            name,
            ids,
            ds.view(np.int64) if integers else ds,
            max_abs=MAX_ABS_COVARIATE,
        )
        for name in covariates
    }
    dup = pd.DataFrame({"c": codes, "t": ds.view(np.int64)}).duplicated().to_numpy()
    if dup.any():
        i = int(np.argmax(dup))
        sid = str(ids[i])
        raise DuplicateTimestampsError(
            f"series {sid!r}: future frame has timestamp {time_text(ds[i], integers)} more "
            "than once",
            series_id=sid,
            field=TIME,
        )
    future = pd.DataFrame({ID: ids, TIME: ds, **values})
    merged = expected.merge(future, on=[ID, TIME], how="left", indicator=True, sort=False)
    absent = (merged["_merge"] == "left_only").to_numpy()
    if absent.any():
        i = int(np.argmax(absent))
        sid = str(merged[ID].iat[i])
        n_absent = int(absent[merged[ID].to_numpy() == sid].sum())
        raise MissingCovariatesError(
            f"series {sid!r}: future covariates {covariates} are needed at the {horizon} "
            f"timestamps after its history (freq {history.freq!r}); {n_absent} missing, the "
            f"first at {time_text(merged[TIME].iat[i], integers)}",
            series_id=sid,
            field=covariates[0],
        )
    return merged.drop(columns="_merge")


def later_covariates(
    future_df: pd.DataFrame,
    *,
    history: ValidatedFrame,
    horizon: int,
    steps: int,
    covariates: Sequence[str],
) -> pd.DataFrame:
    """Covariate rows of `future_df` for steps `horizon + 1 .. steps` after each series'
    history, where it gives every covariate as a number within range (the first such row of a
    timestamp): each series' own, so that its forecast depends on no other series' rows.
    Nothing is required of these rows; a step not given holds the last value."""
    covariates = list(covariates)
    grid = future_grid(history, steps)
    later = grid[(grid.groupby(ID, sort=False).cumcount() >= horizon).to_numpy()]
    ids, _, _ = series_codes(future_df[ID])
    ds = parse_timestamps(future_df[TIME], ids, wall_clock=history.wall_clock, freq=history.freq)
    values = {c: pd.to_numeric(future_df[c], errors="coerce").to_numpy(float) for c in covariates}
    usable = np.ones(len(future_df), dtype=bool)
    for column in values.values():
        usable &= np.isfinite(column) & (np.abs(column) <= MAX_ABS_COVARIATE)
    given = pd.DataFrame(
        {ID: pd.array(ids, dtype="str")[usable], TIME: ds[usable]}
        | {c: v[usable] for c, v in values.items()}
    ).drop_duplicates([ID, TIME])
    return later.merge(given, on=[ID, TIME], how="inner", sort=False)


def future_grid(history: ValidatedFrame, horizon: int) -> pd.DataFrame:
    """`unique_id`, `ds` of the `horizon` timestamps after each series' last one."""
    frame = history.frame
    codes = pd.factorize(frame[ID])[0]
    last_rows = np.flatnonzero(np.r_[codes[1:] != codes[:-1], True])
    ts = steps_after(frame[TIME].to_numpy()[last_rows], history.freq, horizon).reshape(-1)
    ids = np.repeat(frame[ID].to_numpy()[last_rows], horizon)
    return pd.DataFrame({ID: pd.array(ids, dtype="str"), TIME: ts})


# --------------------------------------------------------------------------------------------
# building blocks


def _check_arguments(covariates: Sequence[str], min_length: int, target: str) -> list[str]:
    if isinstance(covariates, str):
        covariates = [covariates]
    covariates = list(covariates)
    if not isinstance(min_length, int | np.integer) or min_length < 1:
        raise InvalidConfigError(f"min_length: expected an int >= 1, got {min_length!r}")
    # The result holds the target as TARGET whatever its name, so a covariate can take neither.
    reserved = {ID, TIME, TARGET, target}
    clash = [c for c in covariates if c in reserved]
    if clash:
        raise InvalidConfigError(
            f"covariates: expected columns other than {sorted(reserved)}, got {clash}",
            field="covariates",
        )
    if len(set(covariates)) != len(covariates):
        raise InvalidConfigError(
            f"covariates: expected distinct names, got {covariates}", field="covariates"
        )
    return covariates


def _required_columns(df: object, required: list[str]) -> dict[str, Any]:
    """The required columns of a frame (as Series) or of a mapping of arrays (as arrays)."""
    if isinstance(df, pd.DataFrame) or not isinstance(df, Mapping):
        _check_frame(df, required)
        return {name: df[name] for name in required}  # type: ignore[index]
    missing = [c for c in required if c not in df]
    if missing:
        raise MissingColumnsError(
            f"missing required columns {missing}; present columns: {list(map(str, df))}",
            field=missing[0],
        )
    columns = {name: np.asarray(df[name]) for name in required}
    lengths = {name: len(column) for name, column in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ForecasterInputError(
            f"columns have different lengths {lengths}; expected one value per row in each"
        )
    if lengths[required[0]] == 0:
        raise EmptyDataError(f"data has no rows; expected at least one row with columns {required}")
    return columns


def _check_frame(df: object, required: list[str]) -> None:
    if not isinstance(df, pd.DataFrame):
        raise ForecasterInputError(f"data: expected a pandas DataFrame, got {type(df).__name__}")
    if len(df) == 0:
        raise EmptyDataError(f"data has no rows; expected at least one row with columns {required}")
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise MissingColumnsError(
            f"missing required columns {missing}; present columns: {list(map(str, df.columns))}",
            field=missing[0],
        )
    repeated = [] if df.columns.is_unique else [c for c in required if (df.columns == c).sum() > 1]
    if repeated:
        raise MissingColumnsError(
            f"columns {repeated} appear more than once; expected each exactly once",
            field=repeated[0],
        )


def series_codes(
    col: pd.Series | np.ndarray,
) -> tuple[pd.api.extensions.ExtensionArray | np.ndarray, np.ndarray, pd.Index]:
    """Series ids as a string array, integer codes in order of first appearance, unique ids."""
    # Ids that are already Python strings (the service's road) need no conversion.
    if (
        isinstance(col, np.ndarray)
        and col.dtype == object
        and pd.api.types.infer_dtype(col, skipna=False) == "string"
    ):
        codes, uniques = pd.factorize(col)
        return col, codes.astype(np.int64, copy=False), pd.Index(uniques, dtype=object)
    col = pd.Series(col)
    missing = col.isna().to_numpy()
    if missing.any():
        i = int(np.argmax(missing))
        raise MissingValuesError(
            f"{ID} is missing at row {i}; every row needs a series id", field=ID
        )
    strings = col.astype("str")
    if col.dtype == object:
        _check_ids_apart(col, strings)
    # Series.factorize, not pd.factorize(strings.array): pandas 2 deprecates factorizing the
    # NumPy-backed array its "str" cast gives.
    codes, uniques = strings.factorize()
    return strings.array, codes.astype(np.int64, copy=False), pd.Index(uniques)


def _id_kind(value: Any) -> str:
    """What an id is beside its text: numbers of any Python or NumPy type are one kind."""
    if isinstance(value, str):
        return "text"
    if isinstance(value, bool | np.bool_):
        return "bool"
    return "number" if isinstance(value, int | float | np.number) else type(value).__name__


def _check_ids_apart(col: pd.Series, strings: pd.Series) -> None:
    """Refuse ids of different kinds that share a text (1 and "1"): a series is known by its
    id's text inside, and in every file and response."""
    if pd.api.types.infer_dtype(col, skipna=False) in ("string", "integer", "floating"):
        return
    kinds = pd.DataFrame({"text": strings, "kind": col.map(_id_kind)}).drop_duplicates()
    shared = kinds["text"].duplicated(keep=False)
    if shared.any():
        text = kinds.loc[shared, "text"].iloc[0]
        values = list(col[strings == text].drop_duplicates(keep="first").iloc[:2])
        raise AmbiguousSeriesIdsError(
            f"{ID} holds distinct ids that read as the same text {text!r}: {values[0]!r} "
            f"and {values[-1]!r}; expected one type of id (cast the column to str or int)",
            field=ID,
        )


def _as_float(
    col: pd.Series | np.ndarray,
    name: str,
    ids: np.ndarray,
    ds: np.ndarray,
    allow_nan: bool | np.ndarray = False,
    max_abs: float = MAX_ABS_VALUE,
) -> np.ndarray:
    """A target/covariate column as float64, rejecting text, inf, magnitudes past `max_abs`
    and NaN (unless `allow_nan`, everywhere or where it is True)."""
    if isinstance(col, np.ndarray) and col.dtype == np.float64:
        values = col
    else:
        values = _to_float(pd.Series(col), name, ids, ds)
    finite = np.isfinite(values) | (allow_nan & np.isnan(values))
    if not finite.all():
        i = int(np.argmin(finite))
        sid = str(ids[i])
        if isinstance(allow_nan, np.ndarray):  # missing only where allowed per row
            expected = "a finite number, or missing where y is"
            advice = "; fill or drop them before forecasting"
        elif allow_nan:
            expected, advice = "a finite number or NaN (missing)", ""
        else:
            expected, advice = "a finite number", "; fill or drop them before forecasting"
        raise MissingValuesError(
            f"series {sid!r}: column {name!r} is {values[i]} at {_ts(ds, i)} (row {i}); "
            f"expected {expected} ({int((~finite).sum())} such value(s) in all{advice})",
            series_id=sid,
            field=name,
        )
    too_large = np.abs(values) > max_abs  # NaN compares False; inf was refused above
    if too_large.any():
        i = int(np.argmax(too_large))
        sid = str(ids[i])
        raise NonNumericValuesError(
            f"series {sid!r}: column {name!r} is {values[i]:g} at {_ts(ds, i)} (row {i}); "
            f"expected a magnitude of at most {max_abs:g} (rescale it)",
            series_id=sid,
            field=name,
        )
    return values


def _to_float(col: pd.Series, name: str, ids: np.ndarray, ds: np.ndarray) -> np.ndarray:
    """A column as float64 (NaN where missing, or text in MISSING_TOKENS), or
    NonNumericValuesError naming the text."""
    kind = col.dtype.kind
    if kind in "mMc":  # timestamps would read as nanoseconds, complex numbers lose a part
        raise NonNumericValuesError(
            f"column {name!r} holds {col.dtype} values; expected real numbers", field=name
        )
    if pd.api.types.is_bool_dtype(col) and not col.isna().any():
        values = col.to_numpy(dtype=np.float64)
    elif pd.api.types.is_numeric_dtype(col):
        values = col.to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        # Text that spells a missing value ("NA", "null", "") is one, as in a CSV.
        col = col.mask(col.isin(MISSING_TOKENS))
        numeric = pd.to_numeric(col, errors="coerce")
        bad = (numeric.isna() & col.notna()).to_numpy()
        if bad.any():
            i = int(np.argmax(bad))
            sid = str(ids[i])
            raise NonNumericValuesError(
                f"series {sid!r}: column {name!r} holds {col.iat[i]!r} at {_ts(ds, i)} "
                f"(row {i}); expected a number ({int(bad.sum())} non-numeric value(s) in all)",
                series_id=sid,
                field=name,
            )
        values = numeric.to_numpy(dtype=np.float64, na_value=np.nan)
    return values


def _ts(ds: np.ndarray | None, i: int) -> str:
    """Row i's time as a message names it: `ds` holds timestamps, or integer steps."""
    if ds is None:
        return f"row {i}"
    return f"ds={time_text(ds[i], integers=ds.dtype.kind in 'iu')}"


def _series_time_order(codes: np.ndarray, ds: np.ndarray) -> np.ndarray | None:
    """A stable permutation putting each series' rows together and in time order, or None
    when they already are: rows may come in any order, as a query without ORDER BY or a
    shuffled Spark partition returns them (Nixtla's libraries sort them too)."""

    def in_order(c: np.ndarray, t: np.ndarray) -> bool:
        return not ((c[1:] == c[:-1]) & (t[1:] < t[:-1])).any()

    if codes.size < 2 or (bool(np.all(codes[1:] >= codes[:-1])) and in_order(codes, ds)):
        return None
    order = np.argsort(codes, kind="stable")  # interleaved series (rows by time): enough
    if not in_order(codes[order], ds[order]):
        order = np.lexsort((ds, codes))
    return order


def _check_duplicates(
    codes: np.ndarray, ds_i8: np.ndarray, same: np.ndarray, uniques: pd.Index, integers: bool
) -> None:
    """Rows in series and time order (`_series_time_order`): a repeated timestamp is a step of
    0 within a series."""
    repeated = (np.diff(ds_i8) == 0) & same
    if repeated.any():
        i = int(np.argmax(repeated)) + 1
        sid = str(uniques[codes[i]])
        count = int(repeated[codes[1:] == codes[i]].sum())
        raise DuplicateTimestampsError(
            f"series {sid!r}: timestamp {time_text(ds_i8[i], integers)} appears more than once "
            f"({count} duplicate row(s) in this series); expected one row per timestamp",
            series_id=sid,
            field=TIME,
        )


def _check_length(
    codes: np.ndarray, uniques: pd.Index, min_length: int, observed: np.ndarray
) -> None:
    """Every series has at least min_length (and at least one) observed target values."""
    counts = np.bincount(codes, weights=observed, minlength=len(uniques)).astype(np.int64)
    empty = counts == 0
    if empty.any():
        k = int(np.argmax(empty))
        sid = str(uniques[k])
        raise MissingValuesError(
            f"series {sid!r} has no observed value (every {TARGET} is NaN); expected at least "
            f"one ({int(empty.sum())} of {len(uniques)} series have none)",
            series_id=sid,
            field=TARGET,
        )
    short = counts < min_length
    if short.any():
        k = int(np.argmax(short))
        sid = str(uniques[k])
        raise SeriesTooShortError(
            f"series {sid!r} has {int(counts[k])} observed points, expected at least "
            f"{min_length} ({int(short.sum())} of {len(uniques)} series are too short)",
            series_id=sid,
            field=TARGET,
        )


def _warn_of_weekday_series(
    codes: np.ndarray, ds_i8: np.ndarray, uniques: pd.Index, step: int
) -> None:
    """Series that keep business hours in a frame read as hourly, or business days in one read
    as daily (beside series read round the clock or every day), are read with their nights and
    weekends missing, and forecast through them; with gaps allowed nothing else says so. Only
    series without a weekend reading are looked at, each once (rows sorted by series)."""
    weekend = on_weekend(ds_i8).astype(np.int64)
    candidates = np.flatnonzero(np.bincount(codes, weights=weekend, minlength=len(uniques)) == 0)
    if len(candidates) == 0:
        return
    if step == HOUR_NS:
        keeps, what, kind, missing = (
            business_hours,
            "business hours",
            "hourly",
            "nights and weekends",
        )
    else:
        keeps, what, kind, missing = _business_days, "business days", "daily", "weekends"
    order = np.argsort(codes, kind="stable")
    starts = np.searchsorted(codes[order], candidates, side="left")
    ends = np.searchsorted(codes[order], candidates, side="right")
    found = [
        k for k, a, b in zip(candidates, starts, ends, strict=True) if keeps(ds_i8[order[a:b]])
    ]
    if found:
        warnings.warn(
            f"{len(found)} of {len(uniques)} series keep {what} (e.g. "
            f"{str(uniques[found[0]])!r}) but are read as {kind}, with {missing} missing, "
            f"beside series read {'round the clock' if step == HOUR_NS else 'every day'}; fit "
            f"them apart to forecast their next {what}",
            UserWarning,
            stacklevel=4,
        )


def _business_days(ds_i8: np.ndarray) -> bool:
    """Whether one series' weekday-only timestamps step from a Friday to the Monday after:
    business days (`time_axis.infer_offset` reads a frame of them as 'B')."""
    return bool((np.diff(np.unique(ds_i8)) == 3 * DAY_NS).any())


def _check_frequency(
    codes: np.ndarray,
    ds_i8: np.ndarray,
    same: np.ndarray,
    uniques: pd.Index,
    freq: str | None,
    allow_gaps: bool = False,
    integers: bool = False,
) -> BaseOffset:
    """The offset every series follows, checking each one is on it (without gaps unless
    `allow_gaps`: then only timestamps off the grid are errors); `integers` for integer `ds`."""
    if freq is not None:
        offset = parse_freq(freq)
    else:
        offset = infer_offset(ds_i8, same, uniques, codes, integers=integers)
    if freq is None and allow_gaps and not integers and fixed_nanos(offset) in (HOUR_NS, DAY_NS):
        _warn_of_weekday_series(codes, ds_i8, uniques, fixed_nanos(offset))
    bad = _off_grid(ds_i8, same, offset, allow_gaps)
    if bad is None:
        return offset
    i, expected = bad
    k = codes[i]
    sid = str(uniques[k])
    rows = codes == k
    own = _series_offset(ds_i8[rows], integers) if not allow_gaps else None
    source = (
        f"the given freq {freq!r}" if freq is not None else f"the inferred {freq_alias(offset)!r}"
    )
    if own is not None and freq_alias(own) != freq_alias(offset):
        raise FrequencyInferenceError(
            f"series {sid!r} has frequency {freq_alias(own)!r}, expected {source}"
            + ("" if freq is not None else " that the other series follow (mixed frequencies)"),
            series_id=sid,
            field=TIME,
        )
    found = pd.Timestamp(ds_i8[i])
    if expected is None:
        raise IrregularTimestampsError(
            f"series {sid!r}: timestamp {time_text(found, integers)} is not on the "
            f"{freq_alias(offset)!r} grid ({source})",
            series_id=sid,
            field=TIME,
        )
    nanos = fixed_nanos(offset)
    if nanos is not None:
        on_grid = (ds_i8[i] - ds_i8[i - 1]) % nanos == 0
    else:
        on_grid = add_offset(add_offset(pd.DatetimeIndex([found]), offset), -offset)[0] == found
    kind = "gap" if found > expected and on_grid else "off-grid point"
    raise IrregularTimestampsError(
        f"series {sid!r}: {kind} after {time_text(ds_i8[i - 1], integers)}: expected "
        f"{time_text(expected, integers)} at frequency {freq_alias(offset)!r} ({source}), "
        f"found {time_text(found, integers)}",
        series_id=sid,
        field=TIME,
    )


def _off_grid(
    ds_i8: np.ndarray, same: np.ndarray, offset: BaseOffset, allow_gaps: bool = False
) -> tuple[int, pd.Timestamp | None] | None:
    """First row not where `offset` says it should be: (row, expected timestamp or None).

    With `allow_gaps`, a row may be any whole number of steps after the previous one.
    """
    nanos = fixed_nanos(offset)
    if nanos is not None:
        step = np.diff(ds_i8)
        wrong = ((step % nanos != 0) if allow_gaps else (step != nanos)) & same
        if not wrong.any():
            return None
        i = int(np.argmax(wrong)) + 1
        return i, pd.Timestamp(ds_i8[i - 1] + nanos)
    # Calendar arithmetic runs per timestamp in pandas (0.5 s a pass over 11 M rows), and a
    # catalogue's series share their dates: do it once per distinct timestamp.
    which, distinct = pd.factorize(ds_i8)
    dti = pd.DatetimeIndex(distinct.view("datetime64[ns]"))
    # Anchored offsets (month starts, Mondays, business days): each timestamp must be on the
    # anchor; x + offset - offset == x exactly when it is.
    anchored = (add_offset(add_offset(dti, offset), -offset).asi8 != distinct)[which]
    nxt = np.zeros(ds_i8.size, dtype=bool)
    expected_next = add_offset(dti, offset).asi8[which[:-1]]
    nxt[1:] = (expected_next != ds_i8[1:]) & same
    first_anchor = int(np.argmax(anchored)) if anchored.any() else None
    first_next = int(np.argmax(nxt)) if nxt.any() and not allow_gaps else None
    if first_anchor is None and first_next is None:
        return None
    if first_next is None or (first_anchor is not None and first_anchor < first_next):
        return first_anchor, None
    return first_next, pd.Timestamp(expected_next[first_next - 1])


# A series may miss at most this many grid steps per observed row: more is a wrong frequency,
# not gaps, and would blow up memory.
MAX_GAP_RATIO = 10


def _fill_gaps(
    ids: pd.api.extensions.ExtensionArray,
    codes: np.ndarray,
    ds: np.ndarray,
    values: dict[str, np.ndarray],
    offset: BaseOffset,
    uniques: pd.Index,
    target: str,
) -> tuple[pd.api.extensions.ExtensionArray, np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """Insert a row for every timestamp missing from a series' grid: NaN target, covariates 0.

    Rows are grouped by series and on the grid of `offset` (checked before). Returns the ids,
    timestamps and value columns with the new rows in place, and each series' row count.
    """
    ds_i8 = ds.view(np.int64)
    nanos = fixed_nanos(offset)
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    ends = np.r_[starts[1:], len(codes)]
    if nanos is not None:
        position = (ds_i8 - np.repeat(ds_i8[starts], ends - starts)) // nanos  # grid index
        lengths = position[ends - 1] + 1
        grids = None
    else:  # calendar offsets (months, business days): grids the series share
        position, lengths, grids = _calendar_grids(ds_i8, starts, ends, offset)
        # The anchor check lets a time of day pass (a month end at noon is one); each row must
        # also be a step of its series' grid, or it would land on another step's row.
        off = position < 0
        if off.any():
            row = int(np.argmax(off))
            s = starts[np.searchsorted(starts, row, side="right") - 1]
            sid = str(uniques[codes[s]])
            raise IrregularTimestampsError(
                f"series {sid!r}: timestamp {pd.Timestamp(ds_i8[row])} "
                f"is not on the {freq_alias(offset)!r} grid that starts at its first timestamp "
                f"{pd.Timestamp(ds_i8[s])} (a different time of day?)",
                series_id=sid,
                field=TIME,
            )
    counts = ends - starts
    if int(lengths.sum()) == len(codes):
        return ids, ds, values, lengths
    # A series whose steps are all multiples of k > 1 grid steps follows a coarser frequency
    # (2-hourly among hourly series): filling it would make it mostly missing, silently.
    # Checked before the gap ratio so that a daily frame given to an hourly model is named a
    # wrong frequency whether or not gaps are allowed.
    steps = np.diff(position)
    steps[ends[:-1] - 1] = 0  # across series boundaries; gcd(0, n) = n
    common = np.gcd.reduceat(np.r_[steps, 0], starts)
    coarser = (common > 1) & (counts >= 3)
    if coarser.any():
        k = int(np.argmax(coarser))
        sid = str(uniques[codes[starts[k]]])
        raise FrequencyInferenceError(
            f"series {sid!r}: its timestamps are {int(common[k])} steps of {freq_alias(offset)!r} "
            f"apart or a multiple of that, never 1; expected frequency {freq_alias(offset)!r} "
            "(mixed frequencies?)",
            series_id=sid,
            field=TIME,
        )
    too_sparse = lengths - counts > MAX_GAP_RATIO * counts
    if too_sparse.any():
        k = int(np.argmax(too_sparse))
        sid = str(uniques[codes[starts[k]]])
        raise IrregularTimestampsError(
            f"series {sid!r}: {int(counts[k])} timestamps span {int(lengths[k])} steps of "
            f"frequency {freq_alias(offset)!r}; expected at most {MAX_GAP_RATIO} missing steps per "
            "observed one (is the frequency right?)",
            series_id=sid,
            field=TIME,
        )
    new_starts = np.r_[0, np.cumsum(lengths)[:-1]]
    target_rows = np.repeat(new_starts, counts) + position
    total = int(lengths.sum())
    if grids is not None:
        filled_ds = _calendar_timestamps(grids, lengths)
    else:
        filled_ds = np.repeat(ds_i8[starts], lengths) + _steps_within(lengths) * nanos
    filled = {}
    for name, column in values.items():
        out = np.full(total, np.nan if name == target else 0.0)
        out[target_rows] = column
        filled[name] = out
    filled_ids = pd.array(np.repeat(np.asarray(ids)[starts], lengths), dtype="str")
    return filled_ids, filled_ds.view("datetime64[ns]"), filled, lengths


def _steps_within(lengths: np.ndarray) -> np.ndarray:
    """0, 1, .., n - 1 for each n of `lengths`, concatenated."""
    return np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)


@dataclass(frozen=True)
class _GridRound:
    """One calendar grid of `_calendar_grids` and the series it serves."""

    grid: np.ndarray  # the grid's timestamps, int64 nanoseconds
    served: np.ndarray  # the series (indices into starts) on it
    first: np.ndarray  # each served series' first step in the grid


def _calendar_grids(
    ds_i8: np.ndarray, starts: np.ndarray, ends: np.ndarray, offset: BaseOffset
) -> tuple[np.ndarray, np.ndarray, list[_GridRound]]:
    """Each series on the grid of a calendar `offset` (months, business days) that starts at
    its first timestamp: (the steps of each row after its series' first timestamp (T,), -1 for
    a row off that grid; each series' steps to its last on-grid row (S,); the grids, for
    `_calendar_timestamps`).

    A calendar grid is built step by step in Python (`pd.date_range`), so series share one:
    built from the earliest first timestamp to the latest last one, it serves every series
    whose first timestamp is on it (all of them, unless some are at another time of day or,
    with a multiple such as "2MS", at another phase), and the rest take the next grid.
    """
    counts = ends - starts
    position = np.full(len(ds_i8), -1, np.int64)
    lengths = np.zeros(len(starts), np.int64)
    rounds = []
    # Series share their dates: each row is looked up in a grid through its distinct date.
    which, distinct = pd.factorize(ds_i8)
    waiting = np.arange(len(starts))
    while len(waiting):
        begin = ds_i8[starts[waiting]]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            grid = (
                pd.date_range(
                    pd.Timestamp(begin.min()),
                    pd.Timestamp(ds_i8[ends[waiting] - 1].max()),
                    freq=offset,
                )
                .as_unit("ns")
                .asi8
            )
        at = np.minimum(np.searchsorted(grid, begin), max(len(grid) - 1, 0))
        on = grid[at] == begin if len(grid) else np.zeros(len(begin), bool)
        if not on.any():  # off every grid: the rows stay -1 (the anchor check runs first)
            break
        served, first = waiting[on], at[on]
        step_of = np.minimum(np.searchsorted(grid, distinct), len(grid) - 1)  # (distinct dates,)
        step_of[grid[step_of] != distinct] = -1
        # The rows of the served series; in the usual single round, every row in order.
        rows = (
            slice(None)
            if len(served) == len(starts)
            else np.repeat(starts[served], counts[served]) + _steps_within(counts[served])
        )
        found = step_of[which[rows]]
        position[rows] = np.where(found >= 0, found - np.repeat(first, counts[served]), -1)
        lengths[served] = position[ends[served] - 1] + 1  # 0 when the last row is off-grid
        rounds.append(_GridRound(grid, served, first))
        waiting = waiting[~on]
    return position, lengths, rounds


def _calendar_timestamps(rounds: list[_GridRound], lengths: np.ndarray) -> np.ndarray:
    """Every series' grid timestamps, `lengths` of them each, concatenated in series order."""
    timestamps = np.empty(int(lengths.sum()), np.int64)
    begins = np.cumsum(lengths) - lengths
    for r in rounds:
        within = _steps_within(lengths[r.served])
        timestamps[np.repeat(begins[r.served], lengths[r.served]) + within] = r.grid[
            np.repeat(r.first, lengths[r.served]) + within
        ]
    return timestamps


def _series_offset(ds_i8: np.ndarray, integers: bool) -> BaseOffset | None:
    """The frequency one series follows on its own, or None if it has none."""
    if ds_i8.size < 2:
        return None
    same = np.ones(ds_i8.size - 1, dtype=bool)
    try:
        offset = infer_offset(
            ds_i8, same, pd.Index(["series"]), np.zeros(ds_i8.size, np.int64), integers
        )
    except FrequencyInferenceError:
        return None
    return offset if _off_grid(ds_i8, same, offset) is None else None


def in_callers_types(
    forecast: pd.DataFrame,
    df: pd.DataFrame | Mapping[str, np.ndarray],
    wall_clock: bool,
    time_columns: Sequence[str] = (TIME,),
    freq: str | None = None,
) -> pd.DataFrame:
    """The forecast with the ids and timestamps (`time_columns`) typed as in `df`: inside, ids
    are strings and timestamps tz-naive; a caller's integer, categorical or object ids or
    tz-aware `ds` come back as given, aware `ds` read back as the history was read
    (`time_axis.zone_of`, `in_zone`); integer `ds`, or any `ds` of a model of integer `freq`
    (text that spelt steps), as integers."""
    given_ids = pd.Series(df[ID])
    if given_ids.hasnans or not isinstance(given_ids.dtype, pd.StringDtype):
        # By text, as inside: distinct ids that compare equal (True and 1) stay apart.
        text = given_ids.astype("str")
        first = ~text.duplicated().to_numpy()
        by_text = pd.Series(given_ids.to_numpy()[first], index=text.to_numpy()[first])
        forecast[ID] = pd.array(by_text.loc[forecast[ID]].to_numpy(), dtype=given_ids.dtype)
    elif given_ids.dtype != forecast[ID].dtype:
        # Text ids are their own text: a cast, not a lookup over every row of `df` (pandas
        # 3's default "str" against the forecast's "string": 1.3 s of 10 s for 10,000 series).
        forecast[ID] = forecast[ID].astype(given_ids.dtype)
    if is_integer_axis(freq) or is_integer_time(pd.Series(df[TIME])):
        for column in time_columns:  # back to the steps they were read from (time_axis)
            forecast[column] = forecast[column].to_numpy(dtype="datetime64[ns]").view(np.int64)
        return forecast
    zone = zone_of(df[TIME], wall_clock)
    if zone is not None:
        for column in time_columns:
            forecast[column] = in_zone(forecast[column], zone, wall_clock)
    return forecast
