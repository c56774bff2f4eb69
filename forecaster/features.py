"""Calendar features derived from `ds`, seasonal periods and future timestamps of a frequency."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
from pandas.tseries.offsets import (
    BaseOffset,
    BusinessDay,
    MonthBegin,
    MonthEnd,
    QuarterBegin,
    QuarterEnd,
    Week,
    YearBegin,
    YearEnd,
)

from forecaster.errors import FrequencyInferenceError, InvalidConfigError
from forecaster.validation import parse_freq

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

_DAY_NS = 86_400 * 10**9


def calendar_features(ds: pd.DatetimeIndex | pd.Series | np.ndarray) -> np.ndarray:
    """(T, 6) float32 array of `CALENDAR_FEATURES` for each timestamp, each in [-0.5, 0.5]."""
    index = pd.DatetimeIndex(np.asarray(ds, dtype="datetime64[ns]"))
    out = np.empty((len(index), len(CALENDAR_FEATURES)), dtype=np.float32)
    out[:, 0] = index.minute / 59.0 - 0.5
    out[:, 1] = index.hour / 23.0 - 0.5
    out[:, 2] = index.dayofweek / 6.0 - 0.5
    out[:, 3] = (index.day - 1) / 30.0 - 0.5
    out[:, 4] = (index.dayofyear - 1) / 365.0 - 0.5
    out[:, 5] = (index.month - 1) / 11.0 - 0.5
    return out


def season_length(freq: str) -> int:
    """The main seasonal period of a frequency, in steps; 1 when there is none or it is unknown.

    Sub-daily frequencies get the daily cycle (h -> 24, 30min -> 48, 15min -> 96, capped at
    1440 steps), daily -> 7 (weekly cycle), business daily -> 5, weekly -> 52,
    monthly -> 12, quarterly -> 4, yearly -> 1.
    """
    try:
        offset = _offset(freq)
    except FrequencyInferenceError:
        return 1
    n = max(abs(offset.n), 1)
    per_year = {
        MonthBegin: 12,
        MonthEnd: 12,
        QuarterBegin: 4,
        QuarterEnd: 4,
        YearBegin: 1,
        YearEnd: 1,
    }
    for kind, steps in per_year.items():
        if isinstance(offset, kind):
            return steps // n if steps % n == 0 else 1
    if isinstance(offset, BusinessDay):
        return 5 if n == 1 else 1
    if isinstance(offset, Week):
        return 52 if n == 1 else 1
    try:
        nanos = int(offset.nanos)
    except ValueError:
        return 1
    if nanos == _DAY_NS:
        return 7
    if nanos < _DAY_NS and _DAY_NS % nanos == 0:
        steps = _DAY_NS // nanos
        if steps <= 1440:
            return int(steps)
        minute = 60 * 10**9
        return int(minute // nanos) if minute % nanos == 0 else 1
    return 1


# Bounds on steps per token: shorter patches make too many tokens for a long context, longer ones
# too few for a short series.
_MIN_PATCH, _MAX_PATCH, _DEFAULT_PATCH = 4, 48, 16


def patch_length_for(freq: str | None) -> int:
    """Steps per model token for data of `freq`: its main seasonal period, so that each token
    is one cycle (24 for hourly, 7 for daily, 12 for monthly data).

    A period above 48 steps uses its largest divisor up to 48 (quarter-hourly 96 -> 48, weekly
    52 -> 26); data with no cycle of at least 4 steps uses 16 (PatchTST's patch).
    """
    m = season_length(freq) if freq is not None else 1
    if m < _MIN_PATCH:
        return _DEFAULT_PATCH
    if m <= _MAX_PATCH:
        return m
    divisor = max(d for d in range(1, _MAX_PATCH + 1) if m % d == 0)
    return divisor if divisor >= _MIN_PATCH else _DEFAULT_PATCH


def future_timestamps(last: pd.Timestamp, freq: str, horizon: int) -> pd.DatetimeIndex:
    """The `horizon` timestamps after `last` on `freq`."""
    if horizon < 1:
        raise InvalidConfigError(f"horizon: expected >= 1, got {horizon}", field="horizon")
    offset = _offset(freq)
    start = pd.Timestamp(last) + offset
    return pd.date_range(start, periods=horizon, freq=offset).as_unit("ns")


# Aliases pandas 3 no longer accepts, mapped to their current spelling.
_LEGACY = {"M": "ME", "Q": "QE", "Y": "YE", "A": "YE", "H": "h", "T": "min", "S": "s"}
_LEGACY_RE = re.compile(r"^(\d*)(M|Q|Y|A|H|T|S)(-[A-Za-z]+)?$")


def _offset(freq: str) -> BaseOffset:
    match = _LEGACY_RE.match(str(freq))
    if match is not None:
        n, alias, anchor = match.groups()
        freq = f"{n}{_LEGACY[alias]}{anchor or ''}"
    return parse_freq(freq)
