"""Calendar features, seasonal periods and future timestamps."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forecaster.errors import FrequencyInferenceError, InvalidConfigError
from forecaster.features import (
    CALENDAR_FEATURES,
    calendar_features,
    future_timestamps,
    season_length,
)


def test_calendar_features_are_scaled_and_ordered():
    ds = pd.DatetimeIndex(["2024-01-01 00:00", "2024-12-31 23:59", "2024-06-15 12:30"])
    out = calendar_features(ds)
    assert out.dtype == np.float32 and out.shape == (3, len(CALENDAR_FEATURES))
    # Monday 1 January, midnight: every feature at its minimum.
    np.testing.assert_allclose(out[0], -0.5)
    # 31 December 2024 (a Tuesday, day 366 of a leap year), 23:59.
    minute, hour, weekday, day, day_of_year, month = out[1]
    assert minute == pytest.approx(0.5) and hour == pytest.approx(0.5)
    assert weekday == pytest.approx(1 / 6 - 0.5)
    assert day == pytest.approx(0.5) and month == pytest.approx(0.5)
    assert day_of_year == pytest.approx(0.5)
    assert np.all(np.abs(out) <= 0.5 + 1e-6)


def test_calendar_features_accept_series_and_arrays():
    ds = pd.date_range("2024-03-01", periods=48, freq="h")
    expected = calendar_features(ds)
    np.testing.assert_array_equal(calendar_features(pd.Series(ds)), expected)
    np.testing.assert_array_equal(calendar_features(ds.to_numpy()), expected)
    # Hour of day cycles with period 24.
    np.testing.assert_array_equal(expected[:24, 1], expected[24:, 1])


@pytest.mark.parametrize(
    ("freq", "expected"),
    [
        ("h", 24),
        ("30min", 48),
        ("15min", 96),
        ("D", 7),
        ("B", 5),
        ("W", 52),
        ("W-MON", 52),
        ("MS", 12),
        ("ME", 12),
        ("M", 12),
        ("QS", 4),
        ("Q", 4),
        ("YS", 1),
        ("2h", 12),
        ("not-a-freq", 1),
    ],
)
def test_season_length(freq, expected):
    assert season_length(freq) == expected


def test_future_timestamps():
    assert future_timestamps(pd.Timestamp("2024-01-01 23:00"), "h", 2).tolist() == [
        pd.Timestamp("2024-01-02 00:00"),
        pd.Timestamp("2024-01-02 01:00"),
    ]
    assert future_timestamps(pd.Timestamp("2024-01-01"), "MS", 2).tolist() == [
        pd.Timestamp("2024-02-01"),
        pd.Timestamp("2024-03-01"),
    ]
    friday = pd.Timestamp("2024-01-05")
    assert future_timestamps(friday, "B", 1)[0] == pd.Timestamp("2024-01-08")
    assert future_timestamps(friday, "h", 3).dtype == "datetime64[ns]"
    with pytest.raises(InvalidConfigError):
        future_timestamps(friday, "h", 0)
    with pytest.raises(FrequencyInferenceError):
        future_timestamps(friday, "sometimes", 3)
