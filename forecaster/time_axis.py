"""The time axis, in one place: timestamps, frequencies, the steps after a series' end, and the
calendar features and seasonal periods a frequency implies.

Inside the package every timestamp is tz-naive ``datetime64[ns]`` within pandas' nanosecond
range, 1677-09-21 .. 2262-04-11: a timestamp, or a forecast step, outside it is an
``InvalidTimestampsError`` naming it, never a silent wrap-around.

Aware input (an aware column, Python datetimes, or ISO text whose UTC offset changes between
values) is read one of two ways, by the rule of `on_wall_clock`. Daily or coarser data
(at least two distinct timestamps, all at one local time of day) and business hours are read
on their zone's wall clock, dropping the zone: their points are local dates or opening hours,
while in UTC a local midnight moves by an hour at each daylight-saving change (off the daily grid) and lands on the previous day in zones
east of UTC (calendar features a day off). Anything else is converted to UTC, where an hourly
clock never skips or repeats an hour. A forecast goes back to an aware column's zone the same
way; text or datetimes with offsets, which name no zone, come back in UTC when they were
read in UTC and naive when read on the wall clock (`zone_of`).

Integer `ds` (steps with no calendar, as Nixtla's libraries take with ``freq=1``) is read as
that many nanoseconds after 1970-01-01, so that everything inside works on one axis: its
frequency is a step of nanoseconds ("ns", "7ns"; `is_integer_axis`), it has no season unless
the configuration gives one, and a forecast of integer `ds` gives its steps back as integers.
A model fitted on one kind of `ds` refuses the other.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, time
from typing import Any, Literal

import numpy as np
import pandas as pd
from pandas.tseries.frequencies import to_offset
from pandas.tseries.offsets import (
    BaseOffset,
    BMonthBegin,
    BMonthEnd,
    BQuarterBegin,
    BQuarterEnd,
    BusinessDay,
    BusinessHour,
    BYearBegin,
    BYearEnd,
    CustomBusinessHour,
    MonthBegin,
    MonthEnd,
    Nano,
    QuarterBegin,
    QuarterEnd,
    SemiMonthBegin,
    SemiMonthEnd,
    Week,
    YearBegin,
    YearEnd,
)

from forecaster.columns import TIME
from forecaster.errors import FrequencyInferenceError, InvalidConfigError, InvalidTimestampsError

# Fixed set and order: the model's covariate width depends on it. Each is scaled to
# [-0.5, 0.5] as GluonTS's time features are, so every frequency gets the same inputs.
CALENDAR_FEATURES = (
    "minute_of_hour",
    "hour_of_day",
    "day_of_week",
    "day_of_month",
    "day_of_year",
    "month_of_year",
)
RANGE = f"{pd.Timestamp.min.date()}..{pd.Timestamp.max.date()}"
# Longest fixed step: timestamps are int64 nanoseconds, and a longer one does not fit them
# (half the range, 292 years).
_MAX_STEP_NS = np.iinfo(np.int64).max
# The nanosecond range in whole microseconds (inside it by less than a microsecond).
_MIN_US = np.datetime64(pd.Timestamp.min.ceil("us").to_datetime64(), "us")
_MAX_US = np.datetime64(pd.Timestamp.max.floor("us").to_datetime64(), "us")
_NS = np.dtype("datetime64[ns]")

DAY_NS = 86_400 * 10**9
# Most steps in a seasonal cycle (a day of minutes).
_MAX_SEASON = 1440
_WEEKDAYS = ("MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN")
_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
# Aliases pandas 3 no longer accepts, mapped to their current spelling.
_LEGACY = {
    "SM": "SME",
    "M": "ME",
    "Q": "QE",
    "Y": "YE",
    "A": "YE",
    "H": "h",
    "T": "min",
    "S": "s",
}
_LEGACY_RE = re.compile(r"^(\d*)(SM|M|Q|Y|A|H|T|S)(-[A-Za-z]+|-\d+)?$")
# Business hours other than pandas' 09:00-17:00, which its alias "bh" cannot spell; written the
# way pandas prints such an offset (see `freq_alias`).
_BUSINESS_HOURS_RE = re.compile(r"^(\d*)bh=(\d\d):00-(\d\d):00$")
# Months on a day inside the month ("MD": the 15th of each month; "3MD" quarterly), which
# pandas has no alias for: a DateOffset of that many months, each series on its own day.
_MONTH_DAY_RE = re.compile(r"^(\d*)MD$")
# The latest such day: every month has it, so a step lands on the same day in each.
_MAX_MONTH_DAY = 28
HOUR_NS = 3600 * 10**9
# Longest opening a day that still reads as business hours rather than hourly data with gaps.
_MAX_BUSINESS_HOURS = 16


# -- timestamps ---------------------------------------------------------------------------------


def wall_clock_for(freq: str | None) -> bool | None:
    """How aware timestamps on `freq` are read: on their wall clock for steps of whole days or
    calendar units (True), in UTC for shorter ones (False); None when the frequency is not
    known yet (a frame to fit on), and `on_wall_clock` decides from the values.

    A model's frequency settles it for everything a model fitted on naive timestamps
    forecasts, so a history of a single timestamp, or a chunk of a file, reads as its data
    would; a model fitted on aware ones reads as it read them (`Forecaster.wall_clock`)."""
    if freq is None:
        return None
    offset = parse_freq(freq)
    if isinstance(offset, BusinessHour | CustomBusinessHour):
        return True  # opening hours are local ones
    nanos = fixed_nanos(offset)
    return nanos is None or nanos % DAY_NS == 0


def in_zone(ds: pd.Series, zone: Any, wall_clock: bool) -> pd.Series:
    """Naive timestamps, read on their wall clock or in UTC as a model reads aware ones
    (`Forecaster.wall_clock`), back in time zone `zone`: local dates localised (a time a
    daylight-saving change skips moves on to the next valid one, a repeated one takes
    standard time), UTC instants converted."""
    if wall_clock:
        # False per value: the form pandas documents for "standard time".
        return ds.dt.tz_localize(
            zone, nonexistent="shift_forward", ambiguous=np.zeros(len(ds), dtype=bool)
        )
    return ds.dt.tz_localize("UTC").dt.tz_convert(zone)


def on_wall_clock(wall: np.ndarray) -> bool:
    """Whether aware timestamps are read on their zone's wall clock rather than in UTC, given
    their wall-clock values (naive datetime64): when at least two differ and all fall at one
    time of day (daily, weekly, monthly data), or they are business hours (`business_hours`).
    Identical values say nothing about the spacing.
    """
    wall = np.asarray(wall).reshape(-1)
    if wall.size < 2 or (wall == wall[0]).all():
        return False
    time_of_day = wall - wall.astype("datetime64[D]")
    return bool((time_of_day == time_of_day[0]).all()) or business_hours(wall) is not None


def pandas_timestamps(col: pd.Series) -> pd.Series:
    """pyarrow timestamps (what `pd.read_parquet(..., dtype_backend="pyarrow")` gives) as
    pandas' own datetime dtype, zone and unit kept; anything else as it is. The zone checks
    here know pandas' aware dtype only, and an aware pyarrow column cast to a naive one
    fails."""
    arrow = getattr(col.dtype, "pyarrow_dtype", None)
    if arrow is None or not hasattr(arrow, "tz"):  # not a pyarrow timestamp (date32 has no tz)
        return col
    unit = arrow.unit
    return col.astype(pd.DatetimeTZDtype(unit, arrow.tz) if arrow.tz else f"datetime64[{unit}]")


def zone_of(col: pd.Series | np.ndarray, wall_clock: bool) -> Any:
    """The time zone the forecasts of a history whose `ds` is `col` come back in (`in_zone`),
    for a model that reads aware timestamps on their wall clock or in UTC (`wall_clock`): an
    aware column's own; UTC for text or datetimes with UTC offsets read in UTC, so that the
    instants are labelled rather than left naive (no zone name came with them, and their
    offsets may change); None for naive input and for such offsets on local dates, which stay
    naive."""
    zone = getattr(pandas_timestamps(pd.Series(col)).dtype, "tz", None)
    if zone is None and not wall_clock and is_aware(col):
        return "UTC"
    return zone


def is_aware(col: pd.Series | np.ndarray) -> bool:
    """Whether timestamps carry a zone or a UTC offset: an aware column, or text such as
    '2024-01-01T00:00+01:00' (judged on the first value)."""
    return bool(_awareness(col))


def _awareness(col: pd.Series | np.ndarray) -> bool | None:
    """`is_aware`, or None when no value tells: none is present, or the first is not a
    timestamp (reading the column names the problem)."""
    values = pandas_timestamps(pd.Series(col))
    if isinstance(values.dtype, pd.DatetimeTZDtype):
        return True
    if pd.api.types.is_datetime64_any_dtype(values):
        return False
    present = values.dropna()
    if present.empty:
        return None
    try:
        return pd.Timestamp(present.iat[0]).tzinfo is not None
    except (ValueError, TypeError):
        return None


def same_clock(
    history: pd.Series | np.ndarray, future: pd.Series | np.ndarray
) -> pd.Series | np.ndarray:
    """`future` timestamps on the history's clock: refused when given with a zone while the
    history's have none, or the other way round (naive times are read as they stand, aware
    ones as instants, so the two would disagree by the zone's offset: every covariate an
    hour off in Paris); converted to the history's zone when both are aware columns of
    different zones (daily data is read on that zone's wall clock). A future column with no
    readable first value is left to the reader, which names the value."""
    history_aware, future_aware = _awareness(history), _awareness(future)
    if None not in (history_aware, future_aware) and history_aware != future_aware:
        with_zone = {True: "with a time zone or UTC offset", False: "without either"}
        raise InvalidTimestampsError(
            f"future frame: {TIME} is given {with_zone[future_aware]} but the history's is "
            f"{with_zone[history_aware]}; give both the same way",
            field=TIME,
        )
    zone = getattr(pd.Series(history).dtype, "tz", None)
    future_zone = getattr(getattr(future, "dtype", None), "tz", None)
    if zone is not None and future_zone is not None and str(future_zone) != str(zone):
        return pd.Series(future).dt.tz_convert(zone)
    return future


def on_weekend(ns: np.ndarray) -> np.ndarray:
    """Per timestamp (int64 nanoseconds), whether it falls on a Saturday or Sunday."""
    return (ns // DAY_NS + 3) % 7 >= 5  # 1970-01-01 was a Thursday; Monday is 0


def business_hours(wall: np.ndarray) -> tuple[int, int] | None:
    """(opening, closing) hour when timestamps look like hourly business hours: whole hours,
    mostly an hour apart, on weekdays only, on at least two days, every one within an opening
    of at most 16 hours (09:00-16:00 readings open at 9 and close at 17). None otherwise.

    Such data read as hourly would be two-thirds gaps and be forecast through the night."""
    ns = np.unique(np.asarray(wall, dtype="datetime64[ns]").reshape(-1).astype(np.int64))
    if ns.size < 2 or (ns % HOUR_NS).any():
        return None
    steps, counts = np.unique(np.diff(ns), return_counts=True)
    if steps[np.argmax(counts)] != HOUR_NS:  # mostly an hour apart, as business hours are
        return None
    days = ns // DAY_NS
    if on_weekend(ns).any() or (days == days[0]).all():
        return None
    hours = (ns % DAY_NS) // HOUR_NS
    opening, closing = int(hours.min()), int(hours.max()) + 1
    if closing - opening > _MAX_BUSINESS_HOURS or closing - opening < 2:
        return None
    return opening, closing


def parse_timestamps(
    col: pd.Series | np.ndarray,
    ids: np.ndarray | None = None,
    *,
    wall_clock: bool | None = None,
    column: str = TIME,
    freq: str | None = None,
) -> np.ndarray:
    """`ds` as a tz-naive datetime64[ns] numpy array; see `read_timestamps`."""
    return read_timestamps(col, ids, wall_clock=wall_clock, column=column, freq=freq)[0]


def read_timestamps(
    col: pd.Series | np.ndarray,
    ids: np.ndarray | None = None,
    *,
    wall_clock: bool | None = None,
    column: str = TIME,
    freq: str | None = None,
) -> tuple[np.ndarray, bool | None]:
    """`ds` as a tz-naive datetime64[ns] numpy array, and whether it was read on its zone's wall
    clock (None for naive input, which has no zone to read).

    Aware input is read on its wall clock or in UTC as `on_wall_clock` decides, or as
    `wall_clock` says (a frame that must be read as another one was, a single start).
    Integers are steps, read as nanoseconds after 1970-01-01 (module docstring). With a
    model's `freq`, `ds` must be of the kind it was fitted on: integers for an integer axis
    (`is_integer_axis`), timestamps for any other.
    `ids` (the series id of each row; None where the timestamps are no series' own, as a wide
    file's time column) and `column` (the column's name) only serve the error message.
    """
    if isinstance(col, np.ndarray) and col.dtype == _NS and not np.isnat(col).any():
        return col, None  # already what this returns (the service's road)
    col = pandas_timestamps(pd.Series(col))

    def error_at(i: int, what: str) -> InvalidTimestampsError:
        """An error of row i: `column` `what`, named with the row's series when known."""
        sid = None if ids is None else str(ids[i])
        where = "" if sid is None else f"series {sid!r}: "
        return InvalidTimestampsError(f"{where}{column} {what}", series_id=sid, field=column)

    integers = is_integer_time(col)
    if not integers and is_integer_axis(freq) and _is_text(col):
        # A CSV read as text (a batch job's): the steps it spells, each checked
        col, integers = _steps_from_text(col, error_at, freq), True
    if freq is not None and integers != is_integer_axis(freq):
        # `freq` is a model's, or the one a request gives beside its start: named, not assumed
        wanted = (
            f"timestamps at frequency {freq!r}"
            if integers
            else f"integer steps, as freq {freq!r} is that of integer ds"
        )
        given = f"integers (dtype {col.dtype})" if integers else "timestamps"
        first = col.iat[0]
        shown = repr(first) if isinstance(first, str) else str(first)
        raise error_at(0, f"holds {given}, expected {wanted}; first value {shown}")
    if integers:
        return _integer_steps(col, error_at), None
    if pd.api.types.is_bool_dtype(col) or pd.api.types.is_numeric_dtype(col):
        raise error_at(
            0,
            f"holds numbers (dtype {col.dtype}), expected timestamps such as "
            f"'2024-01-01 00:00' or integer steps; first value {col.iat[0]}",
        )
    try:
        parsed, error = _to_datetime(col), None
    except InvalidTimestampsError as exc:
        parsed, error = None, exc
    # pandas refuses offsets that change between values (raising for text, NaT for datetimes).
    if parsed is None or (parsed.isna() & col.notna()).any():
        with_offsets = _with_offsets(col)
        if with_offsets is not None:
            return read_datetimes(with_offsets, wall_clock=wall_clock, ids=ids)
        if error is not None:
            raise error
    nat = parsed.isna().to_numpy()
    if nat.any():
        i = int(np.argmax(nat))
        raw = col.iat[i]
        what = "is missing" if pd.isna(raw) else f"value {raw!r} is not a timestamp"
        if not pd.isna(raw) and _mixes_zones(col, raw):
            what = (
                f"value {raw!r} is given without a time zone or UTC offset while other values "
                "have one (or the other way round)"
            )
        raise error_at(i, f"{what} at row {i}; expected a timestamp such as '2024-01-01 00:00'")
    on_wall = None
    if isinstance(parsed.dtype, pd.DatetimeTZDtype):
        wall = parsed.dt.tz_localize(None)
        on_wall = on_wall_clock(wall.to_numpy()) if wall_clock is None else wall_clock
        parsed = wall if on_wall else parsed.dt.tz_convert("UTC").dt.tz_localize(None)
    try:
        # astype checks the bounds; to_numpy(dtype=...) would silently wrap around.
        return parsed.astype("datetime64[ns]").to_numpy(), on_wall
    except (OverflowError, ValueError, pd.errors.OutOfBoundsDatetime) as exc:
        as_us = parsed.astype("datetime64[us]").to_numpy()  # microseconds hold any year
        outside = (as_us < _MIN_US) | (as_us > _MAX_US)
        if not outside.any():
            raise InvalidTimestampsError(
                f"{column} could not be read as timestamps in {RANGE}: {exc}", field=column
            ) from None
        i = int(np.argmax(outside))
        raise error_at(
            i, f"{col.iat[i]!r} at row {i} is outside the supported range {RANGE}"
        ) from None


def is_integer_time(col: pd.Series | np.ndarray) -> bool:
    """Whether a `ds` column holds integer steps rather than timestamps (`bool` is neither):
    an integer dtype, or Python ints in an object column (JSON parsed into a frame)."""
    dtype = col.dtype
    if dtype.kind == "O":
        return pd.api.types.infer_dtype(col, skipna=False) == "integer"
    return pd.api.types.is_integer_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype)


def is_integer_axis(freq: str | None) -> bool:
    """Whether a frequency is that of integer `ds`: a step of nanoseconds (module docstring)."""
    return freq is not None and isinstance(parse_freq(freq), Nano)


def time_point(value: Any) -> pd.Timestamp | int:
    """One `ds` value of a caller's frame as a point of time: an int for integer steps, else a
    Timestamp."""
    return int(value) if isinstance(value, int | np.integer) else pd.Timestamp(value)


def time_label(point: pd.Timestamp | int) -> str:
    """A `time_point` as text for logs and run tags: the integer step, or ISO 8601."""
    return str(point) if isinstance(point, int) else point.isoformat()


def time_text(ns: int | np.integer | np.datetime64, integers: bool) -> str:
    """A point of the time axis as a message names it: the integer step it was given as for
    integer `ds`, else its timestamp."""
    value = pd.Timestamp(ns)
    return str(value.value) if integers else str(value)


def _is_text(col: pd.Series) -> bool:
    return pd.api.types.is_string_dtype(col.dtype) and pd.api.types.infer_dtype(col) == "string"


def _steps_from_text(
    col: pd.Series, error_at: Callable[[int, str], InvalidTimestampsError], freq: str
) -> pd.Series:
    """Text that spells integer steps ("1760"), as int64; `error_at` the first value that
    does not."""
    stripped = col.str.strip()
    numbers = pd.to_numeric(stripped, errors="coerce")
    # 19 digits at most: the int64 the steps are held in (the range is checked after)
    good = numbers.notna() & stripped.str.fullmatch(r"[+-]?\d{1,19}").fillna(False)
    if not good.all():
        i = int(np.argmin(good.to_numpy()))
        raise error_at(
            i,
            f"value {col.iat[i]!r} at row {i} is not an integer step, as freq {freq!r} (that of "
            "integer ds) needs",
        )
    try:
        return stripped.astype("int64")
    except (OverflowError, ValueError):
        return pd.Series([int(v) for v in stripped], dtype=object)  # `_integer_steps` names it


def _integer_steps(
    col: pd.Series, error_at: Callable[[int, str], InvalidTimestampsError]
) -> np.ndarray:
    """Integer `ds` as datetime64[ns]; `error_at` a missing value or a step past int64 (whose
    least value is NaT's)."""
    missing = col.isna().to_numpy()
    if missing.any():
        i = int(np.argmax(missing))
        raise error_at(i, f"is missing at row {i}; expected an integer step")
    values = col.to_numpy(dtype=object if col.dtype.kind in "uO" else np.int64)
    low, high = np.iinfo(np.int64).min + 1, np.iinfo(np.int64).max
    outside = (values < low) | (values > high)
    if outside.any():
        i = int(np.argmax(outside))
        raise error_at(
            i, f"{values[i]} at row {i} is outside the integer steps supported, {low}..{high}"
        )
    return values.astype(np.int64).view(_NS)


def _mixes_zones(col: pd.Series, raw: object) -> bool:
    """Whether `raw`, a value pandas did not read, is a timestamp given with a zone or offset
    while the column's first or last value is one without (or the other way round): pandas
    reads such a mix as NaT, not as timestamps."""
    present = col.dropna()
    try:
        aware = {pd.Timestamp(v).tzinfo is not None for v in (raw, present.iat[0], present.iat[-1])}
    except (ValueError, TypeError):
        return False
    return len(aware) == 2


def _to_datetime(col: pd.Series) -> pd.Series:
    if pd.api.types.is_datetime64_any_dtype(col):
        return col
    # Inferred format first (fast, consistent input), then inferred day first: "13/01/2024"
    # does not read month first, and "mixed" would read "10/01/2024" as 1 October beside it.
    # ISO 8601 covers "2024-01-01" mixed with "2024-01-01 01:00"; "mixed" parses element by
    # element, only reached for odd input.
    parsed = None
    for fmt, dayfirst in ((None, False), (None, True), ("ISO8601", False), ("mixed", False)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                attempt = pd.to_datetime(col, errors="coerce", format=fmt, dayfirst=dayfirst)
        except (ValueError, TypeError, OverflowError):
            continue
        if parsed is None or attempt.isna().sum() < parsed.isna().sum():
            parsed = attempt
        if not (parsed.isna() & col.notna()).any():
            break
    if parsed is None:  # every attempt raised (e.g. a column of mixed tz offsets)
        raise InvalidTimestampsError(
            f"{TIME} could not be parsed as timestamps (dtype {col.dtype}); expected values such "
            "as '2024-01-01 00:00' in one time zone",
            field=TIME,
        )
    return parsed


def parse_iso(values: Sequence[str]) -> np.ndarray | None:
    """Naive ISO 8601 strings as datetime64[ns] through numpy's fast parser; None when numpy
    cannot read all of them (time zones, other formats: `parse_timestamps` then decides).

    Parsed at microsecond precision first, where years up to 294247 fit, so that a value past
    the nanosecond range does not wrap around: None then too, and `parse_timestamps`, which
    knows each value's series, names it.
    """
    if not all(isinstance(v, str) for v in values):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy warns on time zones
            coarse = np.array(values, dtype="datetime64[us]")
    except (ValueError, TypeError, Warning):
        return None
    if ((coarse < _MIN_US) | (coarse > _MAX_US)).any():
        return None  # `parse_timestamps` names the series
    return _to_nanoseconds(coarse, values)


def read_datetimes(
    values: Sequence[datetime], *, wall_clock: bool | None = None, ids: np.ndarray | None = None
) -> tuple[np.ndarray, bool | None]:
    """Python datetimes as datetime64[ns], range-checked, and whether they were read on their
    wall clock (None when none is aware): the fast road for timestamps a JSON parser already read.

    Aware ones (usually fixed offsets such as +01:00, which change at daylight-saving changes)
    are read on their wall clock when all are aware and `on_wall_clock` (or `wall_clock`) says
    so, else converted to UTC.
    """
    if values and all(v.tzinfo is not None for v in values):
        wall = _microseconds([v.replace(tzinfo=None) for v in values])
        if on_wall_clock(wall) if wall_clock is None else wall_clock:
            return _to_nanoseconds(wall, values, ids), True
    aware = any(v.tzinfo is not None for v in values)
    if aware and not all(v.tzinfo is not None for v in values):
        # As for text (`read_timestamps`): the naive ones would be read as UTC, an hour or two
        # from what their writer meant beside the others.
        i = next(k for k, v in enumerate(values) if v.tzinfo is None)
        sid = None if ids is None else str(ids[i])
        where = "" if sid is None else f"series {sid!r}: "
        raise InvalidTimestampsError(
            f"{where}{TIME} value {values[i].isoformat()!r} is given without a time zone or UTC "
            f"offset while other values have one (or the other way round) at row {i}; expected "
            "a timestamp such as '2024-01-01 00:00' with all or none of them",
            series_id=sid,
            field=TIME,
        )
    naive = [v.astimezone(UTC).replace(tzinfo=None) if v.tzinfo is not None else v for v in values]
    return _to_nanoseconds(_microseconds(naive), values, ids), False if aware else None


def _with_offsets(col: pd.Series) -> list[datetime] | None:
    """ISO 8601 strings or datetimes whose UTC offsets differ between values, as aware
    datetimes: local time across a daylight-saving change, as pandas writes an aware column to
    CSV (or a JSON parser reads it), which pandas refuses as one column. None unless every
    value is such a timestamp."""
    try:
        parsed = [v if isinstance(v, datetime) else datetime.fromisoformat(v) for v in col.tolist()]
    except (TypeError, ValueError):
        return None
    return parsed if all(v.tzinfo is not None for v in parsed) else None


def _microseconds(naive: Sequence[datetime]) -> np.ndarray:
    # pandas' converter: ten times numpy's on datetime objects; microseconds hold any year.
    return pd.DatetimeIndex(naive).as_unit("us").to_numpy()


def _to_nanoseconds(
    coarse: np.ndarray, values: Sequence[object], ids: np.ndarray | None = None
) -> np.ndarray:
    """Microsecond timestamps as nanoseconds, or InvalidTimestampsError naming the first value
    outside the range (`values`: what the caller sent, and `ids` each one's series, for the
    message)."""
    outside = (coarse < _MIN_US) | (coarse > _MAX_US)
    if outside.any():
        i = int(np.argmax(outside))
        sid = None if ids is None else str(ids[i])
        raise InvalidTimestampsError(
            ("" if sid is None else f"series {sid!r}: ")
            + f"{TIME}: {str(values[i])!r} is outside the supported range {RANGE}",
            series_id=sid,
            field=TIME,
        )
    return coarse.astype("datetime64[ns]")


def regular_range(
    start: datetime | str | pd.Timestamp,
    periods: int,
    freq: str,
    roll_forward: bool = True,
    wall_clock: bool | None = None,
) -> np.ndarray:
    """``periods`` timestamps on ``freq`` from ``start``, as ``datetime64[ns]``.

    A start off an anchored grid (a Monday for "W-SUN", mid-month for "ME") is rolled forward
    onto it, as ``pd.date_range`` does, or with ``roll_forward=False`` is an
    `InvalidTimestampsError` (a user's start that means a point in time). An aware start is
    read on its wall clock or in UTC as `wall_clock` says (a model's reading), by default as
    `wall_clock_for(freq)` says.
    """
    offset = parse_freq(freq)
    if wall_clock is None:
        wall_clock = wall_clock_for(freq)
    given = parse_timestamps(pd.Series([start]), wall_clock=wall_clock, column="start", freq=freq)
    # to_datetime64: numpy would read a Timestamp as a datetime, dropping its nanoseconds
    first = np.array([offset.rollforward(pd.Timestamp(given[0])).as_unit("ns").to_datetime64()])
    if not roll_forward and first[0] != given[0]:
        raise InvalidTimestampsError(
            f"start {pd.Timestamp(given[0])} is not on the {freq!r} grid; the next step on it "
            f"is {pd.Timestamp(first[0])}",
            field="start",
        )
    return (
        np.concatenate([first, shift(first, freq, np.arange(1, periods))])
        if periods > 1
        else first[:periods]
    )


def synthetic_range(start: str, periods: int, freq: str) -> np.ndarray:
    """``periods`` steps of ``freq`` for a synthetic history (a reference forecast, a smoke
    test), typed as a caller's `ds` of that frequency is: timestamps from ``start``, or
    integer steps from 0 for integer ds (`is_integer_axis`)."""
    if is_integer_axis(freq):
        return regular_range(0, periods, freq).view(np.int64)
    return regular_range(start, periods, freq)


def steps_after(
    last: np.ndarray, freq: str, horizon: int, series_ids: np.ndarray | None = None
) -> np.ndarray:
    """(S, horizon) timestamps of the steps after each of S last timestamps, on ``freq``.

    ``series_ids`` (S,) lets an out-of-range error name the series.
    """
    if horizon < 1:
        raise InvalidConfigError(f"horizon: expected >= 1, got {horizon}", field="horizon")
    last = np.asarray(last, dtype="datetime64[ns]").reshape(-1)
    try:
        return shift(last[:, None], freq, np.arange(1, horizon + 1)[None, :])
    except InvalidTimestampsError as exc:
        if series_ids is None:
            raise
        # Only on the error path: find the first series whose last step is out of range.
        for k, sid in enumerate(series_ids):
            try:
                shift(last[k : k + 1], freq, horizon)
            except InvalidTimestampsError:
                raise InvalidTimestampsError(
                    f"series {str(sid)!r}: the forecast would run past the supported range: {exc}",
                    series_id=str(sid),
                    field=TIME,
                ) from None
        raise


def shift(
    timestamps: np.ndarray,
    freq: str,
    steps: np.ndarray | int,
    errors: Literal["raise", "coerce"] = "raise",
) -> np.ndarray:
    """``timestamps`` moved by ``steps`` periods of ``freq`` (broadcast), as datetime64[ns].

    A result outside pandas' range is an InvalidTimestampsError naming the first such
    timestamp, or with ``errors="coerce"`` NaT.
    """
    offset = parse_freq(freq)
    ts = np.asarray(timestamps, dtype="datetime64[ns]")
    steps = np.asarray(steps, dtype=np.int64)
    shape = np.broadcast_shapes(ts.shape, steps.shape)
    ts_b = np.broadcast_to(ts, shape).reshape(-1)
    steps_b = np.broadcast_to(steps, shape).reshape(-1)
    nanos = fixed_nanos(offset)
    if nanos is not None:
        start = ts_b.astype(np.int64)
        low, high = pd.Timestamp.min.value, pd.Timestamp.max.value
        moved = start + steps_b * nanos
        if start.size:
            # Bounds in Python ints (exact): inside the range, no int64 result can overflow;
            # only when they are not is each value checked.
            moves = (int(steps_b.min()) * nanos, int(steps_b.max()) * nanos)
            if int(start.min()) + min(moves) < low or int(start.max()) + max(moves) > high:
                exact = start.astype(object) + steps_b.astype(object) * nanos
                outside = np.array([not low <= value <= high for value in exact], dtype=bool)
                if outside.any():
                    if errors == "raise":
                        i = int(np.argmax(outside))
                        raise _out_of_range(ts_b[i], int(steps_b[i]), offset)
                    moved = np.where(outside, np.iinfo(np.int64).min, moved)  # NaT
        return moved.view("datetime64[ns]").reshape(shape)
    # Calendar offsets (months, business days) are not fixed durations: one step at a time.
    out = np.empty(ts_b.size, dtype="datetime64[ns]")
    for n in np.unique(steps_b):
        rows = steps_b == n
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                moved = pd.DatetimeIndex(ts_b[rows]) + int(n) * offset
            out[rows] = moved.as_unit("ns").to_numpy()
        except (OverflowError, pd.errors.OutOfBoundsDatetime, ValueError):
            # Some of them fall outside: find which, one at a time.
            out[rows] = [_shift_one(t, int(n), offset, errors) for t in ts_b[rows]]
    return out.reshape(shape)


def _shift_one(
    timestamp: np.datetime64, steps: int, offset: BaseOffset, errors: str
) -> np.datetime64:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return (pd.Timestamp(timestamp) + steps * offset).as_unit("ns").to_datetime64()
    except (OverflowError, pd.errors.OutOfBoundsDatetime, ValueError):
        if errors == "raise":
            raise _out_of_range(timestamp, steps, offset) from None
        return np.datetime64("NaT", "ns")


def _out_of_range(origin: np.datetime64, steps: int, offset: BaseOffset) -> InvalidTimestampsError:
    return InvalidTimestampsError(
        f"{TIME}: {steps} step(s) of {freq_alias(offset)!r} from {pd.Timestamp(origin)} fall outside "
        f"the supported range {RANGE}",
        field=TIME,
    )


# -- frequencies --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)  # offsets are immutable; aliases repeat on every request
def parse_freq(freq: str) -> BaseOffset:
    """The pandas offset of an alias (older spellings such as "H" or "M" accepted; a bare
    integer "7" is a step of integer ds, Nixtla's `freq=7`, as "7ns"), or
    `FrequencyInferenceError` naming a bad alias or a step that is not positive."""
    if str(freq).isdigit():
        freq = f"{freq}ns"
    match = _LEGACY_RE.match(str(freq))
    if match is not None:
        n, alias, anchor = match.groups()
        freq = f"{n}{_LEGACY[alias]}{anchor or ''}"
    if (match := _BUSINESS_HOURS_RE.match(str(freq))) is not None:
        n, opening, closing = match.groups()
        if not 0 <= int(opening) < int(closing) <= 24:
            raise FrequencyInferenceError(
                f"freq: {freq!r} opens at or after it closes; expected e.g. 'bh=08:00-18:00'",
                field="freq",
            )
        if int(closing) - int(opening) == 24:  # pandas refuses a business day that never closes
            raise FrequencyInferenceError(
                f"freq: {freq!r} is open around the clock; expected business hours shorter than "
                "a day, or 'h' for hourly data",
                field="freq",
            )
        return BusinessHour(int(n or 1), start=time(int(opening)), end=time(int(closing) % 24))
    if (match := _MONTH_DAY_RE.match(str(freq))) is not None:
        months = int(match.group(1) or 1)
        if months < 1:
            raise FrequencyInferenceError(
                f"freq: expected a positive step (e.g. 'MD', '3MD'), got {freq!r}", field="freq"
            )
        return pd.DateOffset(months=months)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            offset = to_offset(freq)
    except (ValueError, TypeError, OverflowError) as exc:
        raise FrequencyInferenceError(
            f"freq: {freq!r} is not a pandas offset alias (expected e.g. 'h', 'D', '15min', "
            f"'MS'): {exc}",
            field="freq",
        ) from None
    if offset.n < 1:  # "0h" would stamp every step alike, "-1h" run backwards
        raise FrequencyInferenceError(
            f"freq: expected a positive step (e.g. 'h', 'D', '15min'), got {freq!r}",
            field="freq",
        )
    nanos = fixed_nanos(offset)
    if nanos is not None and nanos > _MAX_STEP_NS:
        raise FrequencyInferenceError(
            f"freq: a step of {freq!r} is too long for timestamps, which span {RANGE}",
            field="freq",
        )
    return offset


def freq_alias(offset: BaseOffset) -> str:
    """The alias `parse_freq` reads back as `offset`: its `freqstr`, except for business hours
    other than 09:00-17:00, which pandas spells "bh" too ("bh=08:00-18:00" here; a close at
    midnight is "24:00")."""
    if (months := month_day_months(offset)) is not None:
        return f"{months if months > 1 else ''}MD"
    if isinstance(offset, BusinessHour) and (offset.start, offset.end) != (
        (time(9),),
        (time(17),),
    ):
        n = "" if offset.n == 1 else str(offset.n)
        closing = f"{offset.end[0]:%H:%M}" if offset.end[0] != time(0) else "24:00"
        return f"{n}bh={offset.start[0]:%H:%M}-{closing}"
    return offset.freqstr


def month_day_months(offset: BaseOffset) -> int | None:
    """The months of a step of months on a day inside the month ("MD", "3MD"), else None."""
    if type(offset) is pd.DateOffset and set(offset.kwds) == {"months"}:
        return int(offset.n * offset.kwds["months"])
    return None


def fixed_nanos(offset: BaseOffset) -> int | None:
    try:
        return int(offset.nanos)
    except ValueError:
        return None


def add_offset(dti: pd.DatetimeIndex, offset: BaseOffset) -> pd.DatetimeIndex:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PerformanceWarning for offsets without a fast path
        return dti + offset


# Days a step of that many months can span: (shortest, longest, months).
_MONTH_SPANS = ((28, 31, 1), (59, 62, 2), (89, 92, 3), (120, 123, 4), (181, 184, 6), (365, 366, 12))


def infer_offset(
    ds_i8: np.ndarray,
    same: np.ndarray,
    uniques: pd.Index,
    codes: np.ndarray,
    integers: bool = False,
) -> BaseOffset:
    """Guess the offset from the most common step between consecutive timestamps; for
    `integers` (integer `ds`), that step in nanoseconds, whatever its length."""
    diffs = np.diff(ds_i8)[same]
    if diffs.size == 0:
        sid = str(uniques[0])
        raise FrequencyInferenceError(
            f"cannot infer a frequency: every series has a single timestamp (e.g. {sid!r}); "
            "give at least two points in some series (the frequency is read from the steps "
            "between them)",
            series_id=sid,
            field=TIME,
        )
    steps, counts = np.unique(diffs, return_counts=True)
    step = int(steps[np.argmax(counts)])
    if integers:
        return Nano(step)
    if step == HOUR_NS and (hours := business_hours(ds_i8)) is not None:
        return BusinessHour(start=time(hours[0]), end=time(hours[1] % 24))
    if step % DAY_NS:
        offset = to_offset(pd.Timedelta(step, unit="ns"))
        if isinstance(offset, Nano):  # it would read back as integer steps (`is_integer_axis`)
            raise FrequencyInferenceError(
                f"cannot infer a frequency: the timestamps are {step} ns apart; expected a step "
                "of whole microseconds, or integer ds for steps with no calendar",
                series_id=str(uniques[0]),
                field=TIME,
            )
        return offset
    days = step // DAY_NS
    first = pd.Timestamp(ds_i8[0])
    # Before daily and weekly: the 1st and 2nd of each month step by 1 day, then by 27-30;
    # the 1st and 8th by 7 days, then by 21-24.
    if days <= 27 and steps.size > 1 and (semi := _semi_month_offset(ds_i8)) is not None:
        return semi
    if days == 1:
        if not on_weekend(ds_i8).any() and (diffs == 3 * DAY_NS).any():
            return to_offset("B")
        return to_offset("D")
    if days == 7:
        return to_offset(f"W-{_WEEKDAYS[first.day_of_week]}")
    for low, high, months in _MONTH_SPANS:
        if low <= days <= high:
            return _calendar_offset(ds_i8, months, str(uniques[codes[0]]))
    return to_offset(f"{days}D")


def _semi_month_offset(ds_i8: np.ndarray) -> BaseOffset | None:
    """Twice-monthly data: every timestamp on the 1st or one other day d of the month
    (SemiMonthBegin, 'SMS-d'), or on day d or the month's end (SemiMonthEnd, 'SME-d'), both
    kinds present. None for anything else, such as 14-day steps, which drift through the
    month's days. Its steps are uneven (14 and 13-16 days for 'SMS', 9 and 19-22 for
    'SMS-10'), so the caller asks only when the steps are not all alike."""
    # Daily data with gaps asks too: a month of it has more than one other day, so a look at
    # its first timestamps spares reading the days of all of them.
    head = pd.DatetimeIndex(ds_i8[:64])
    if np.unique(head.day[(head.day != 1) & ~head.is_month_end]).size > 1:
        return None
    index = pd.DatetimeIndex(ds_i8)
    day, month_end = index.day.to_numpy(), index.is_month_end
    mid = np.unique(day[(day != 1) & ~month_end])
    if mid.size != 1 or not 2 <= mid[0] <= 27:
        return None
    d = int(mid[0])
    if np.all((day == 1) | (day == d)) and (day == 1).any():
        return SemiMonthBegin(day_of_month=d)
    if np.all(month_end | (day == d)) and month_end.any():
        return SemiMonthEnd(day_of_month=d)
    return None


def _calendar_offset(ds_i8: np.ndarray, months: int, sid: str) -> BaseOffset:
    """Month, quarter or year offset anchored where most of the data is: calendar month
    starts or ends, or the first or last business day of the month (a market's monthly close,
    'BME'), so that validation names the timestamps off that grid; steps of 2, 4 or 6 months as
    that many months."""
    index, first = pd.DatetimeIndex(ds_i8), pd.Timestamp(ds_i8[0])
    # (side, business) -> timestamps on that anchor; calendar ones first, as ties go.
    held = {("S", ""): index.is_month_start.sum(), ("E", ""): index.is_month_end.sum()}
    if max(held.values()) < len(index):  # business days are read only when needed: slower
        # n = 0 rolls a timestamp forward to the offset: one on it stays where it is.
        held["E", "B"] = (index + 0 * BMonthEnd() == index).sum()
        held["S", "B"] = (index + 0 * BMonthBegin() == index).sum()
    side, business = max(held, key=held.__getitem__)
    if 2 * held[side, business] <= len(index) and index.day.max() <= _MAX_MONTH_DAY:
        # Mostly inside the month (the 15th): steps of months from each series' own day.
        return pd.DateOffset(months=months)
    if held[side, business]:
        return _month_offset(first, months, side, business)
    unit = {1: "monthly", 3: "quarterly", 12: "yearly"}.get(months, f"{months}-monthly")
    raise FrequencyInferenceError(
        f"series {sid!r} looks {unit} but its timestamps fall on day {first.day} of the month "
        f"(e.g. {first}); expected month starts or month ends (calendar or business days), "
        f"or a day up to the {_MAX_MONTH_DAY}th, the same in every month",
        series_id=sid,
        field=TIME,
    )


def _month_offset(first: pd.Timestamp, months: int, side: str, business: str) -> BaseOffset:
    """'MS' / 'ME' (side S or E) and their quarter and year forms anchored at `first`'s month,
    with business 'B' the same on business days ('BME', 'BQE-DEC', ...)."""
    if months == 3:
        month = (first.month - 1) % 3 if side == "S" else 11 - (12 - first.month) % 3
        return to_offset(f"{business}Q{side}-{_MONTHS[month]}")
    if months == 12:
        return to_offset(f"{business}Y{side}-{_MONTHS[first.month - 1]}")
    return to_offset(f"{months if months > 1 else ''}{business}M{side}")


# -- what a frequency implies ------------------------------------------------------------------


def calendar_features(ds: pd.DatetimeIndex | pd.Series | np.ndarray) -> np.ndarray:
    """(T, 6) float32 array of `CALENDAR_FEATURES` for each timestamp, each in [-0.5, 0.5]."""
    index = pd.DatetimeIndex(np.asarray(ds, dtype="datetime64[ns]"))
    out = np.empty((len(index), len(CALENDAR_FEATURES)), dtype=np.float32)
    out[:, 0] = index.minute / 59.0 - 0.5
    out[:, 1] = index.hour / 23.0 - 0.5
    out[:, 2] = index.day_of_week / 6.0 - 0.5
    out[:, 3] = (index.day - 1) / 30.0 - 0.5
    out[:, 4] = (index.day_of_year - 1) / 365.0 - 0.5
    out[:, 5] = (index.month - 1) / 11.0 - 0.5
    return out


def season_length(freq: str) -> int:
    """The main seasonal period of a frequency, in steps; 1 when there is none or it is unknown.

    Sub-daily frequencies get the daily cycle (h -> 24, 30min -> 48, 15min -> 96), or where
    that exceeds 1440 steps the minute's or the second's (30s -> 2, 1ms -> 1000), else 1;
    daily -> 7 (weekly cycle), business daily -> 5, business hours -> the hours of a business
    day (8 for 09:00-17:00), weekly -> 52, semi-monthly -> 24,
    monthly -> 12, quarterly -> 4, yearly -> 1.
    """
    try:
        offset = parse_freq(freq)
    except FrequencyInferenceError:
        return 1
    if isinstance(offset, Nano):
        return 1  # integer steps have no calendar to give them a cycle
    n = max(abs(offset.n), 1)
    per_year = {
        SemiMonthBegin: 24,
        SemiMonthEnd: 24,
        MonthBegin: 12,
        MonthEnd: 12,
        QuarterBegin: 4,
        QuarterEnd: 4,
        YearBegin: 1,
        YearEnd: 1,
        BMonthBegin: 12,
        BMonthEnd: 12,
        BQuarterBegin: 4,
        BQuarterEnd: 4,
        BYearBegin: 1,
        BYearEnd: 1,
    }
    if (months := month_day_months(offset)) is not None:
        return 12 // months if 12 % months == 0 else 1
    for kind, steps in per_year.items():
        if isinstance(offset, kind):
            return steps // n if steps % n == 0 else 1
    if isinstance(offset, BusinessDay):
        return 5 if n == 1 else 1
    if isinstance(offset, BusinessHour) and n == 1:
        # The business day: its opening hours (a single opening, as `business_hours` infers).
        opening, closing = offset.start[0].hour, offset.end[0].hour or 24
        return closing - opening if len(offset.start) == 1 and closing > opening else 1
    if isinstance(offset, Week):
        return 52 if n == 1 else 1
    try:
        nanos = int(offset.nanos)
    except ValueError:
        return 1
    if nanos == DAY_NS:
        return 7
    # The daily cycle; for finer steps, whose day holds more than 1440, the minute's or the
    # second's (30s -> 2, 1s -> 60, 1ms -> 1000); none beyond that.
    for cycle in (DAY_NS, 60 * 10**9, 10**9):
        if nanos < cycle and cycle % nanos == 0 and cycle // nanos <= _MAX_SEASON:
            return int(cycle // nanos)
    return 1


def long_season_length(freq: str) -> int:
    """The data's second, longer cycle in steps: a week of its daily cycle for sub-daily data
    whose main season is the day (hourly 168, half-hourly 336, 15-minute 672), as MSTL and TBATS
    model hourly demand; 1 for every other frequency, whose main season is already the longest
    cycle a context of the default length holds."""
    season = season_length(freq)
    try:
        nanos = int(parse_freq(freq).nanos)
    except (FrequencyInferenceError, ValueError):
        return 1
    daily = nanos < DAY_NS and DAY_NS % nanos == 0 and DAY_NS // nanos == season
    return 7 * season if daily else 1


# Bounds on steps per token. A cycle shorter than _MIN_CYCLE is no season worth aligning to. A
# cycle shorter than _MIN_PATCH is grouped into whole cycles: quarterly data in tokens of one
# quarter made 84 tokens of a 336-step context and trained twice as long as tokens of two
# quarters, to a validation loss 1 % worse on average over three quarterly competitions
# (docs/model-choices.md). Longer patches than _MAX_PATCH make too few tokens for a short
# series.
_MIN_CYCLE, _MIN_PATCH, _MAX_PATCH, _DEFAULT_PATCH = 4, 8, 48, 16


def patch_length_for(season: int) -> int:
    """Steps per model token for data whose main seasonal period is `season` steps (the
    frequency's, `season_length`, or the one a configuration gives): whole cycles of it, so
    that tokens line up with the cycle (24 for hourly, 12 for monthly data).

    A period under 8 steps is grouped into the fewest whole cycles of at least 8 steps
    (quarterly 4 -> 8, daily 7 -> 14); a period above 48 steps uses its largest divisor up to
    48 (quarter-hourly 96 -> 48, weekly 52 -> 26); data with no cycle of at least 4 steps uses
    16 (PatchTST's patch).
    """
    m = season
    if m < _MIN_CYCLE:
        return _DEFAULT_PATCH
    if m <= _MAX_PATCH:
        return m * -(-_MIN_PATCH // m)  # ceil(_MIN_PATCH / m) whole cycles
    divisor = max(d for d in range(1, _MAX_PATCH + 1) if m % d == 0)
    return divisor if divisor >= _MIN_CYCLE else _DEFAULT_PATCH
