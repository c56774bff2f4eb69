"""The time axis: calendar features, seasonal periods, future timestamps, range checks."""

from __future__ import annotations

from datetime import date, datetime

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from forecaster.errors import (
    FrequencyInferenceError,
    InvalidConfigError,
    InvalidTimestampsError,
    IrregularTimestampsError,
)
from forecaster.time_axis import (
    CALENDAR_FEATURES,
    business_hours,
    calendar_features,
    freq_alias,
    in_zone,
    long_season_length,
    on_wall_clock,
    parse_freq,
    parse_iso,
    parse_timestamps,
    patch_length_for,
    read_datetimes,
    regular_range,
    season_length,
    shift,
    steps_after,
    wall_clock_for,
)
from forecaster.validation import infer_frequency, validate_long_frame


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
        ("2B", 1),  # a business week of 5 days is no whole number of 2-day steps
        ("W", 52),
        ("2W", 1),
        ("W-MON", 52),
        ("MS", 12),
        ("ME", 12),
        ("M", 12),
        ("bh", 8),  # a business day
        ("bh=07:00-19:00", 12),
        ("2bh", 1),
        ("bh=08:00-08:00", 1),  # no opening hours: not a frequency
        ("SMS", 24),
        ("SM", 24),  # pandas 2's spelling of "SME"
        ("QS", 4),
        ("Q", 4),
        ("YS", 1),
        ("BME", 12),  # business days' months, quarters and years are still months...
        ("BMS", 12),
        ("BQE-MAR", 4),
        ("BYS", 1),
        ("2BME", 6),
        ("2h", 12),
        ("min", 1440),
        ("30s", 2),
        ("s", 60),
        ("100ms", 600),
        ("ms", 1000),  # a day or a minute of steps would be a cycle of millions
        ("us", 1),
        ("ns", 1),
        ("not-a-freq", 1),
    ],
)
def test_season_length(freq, expected):
    assert season_length(freq) == expected


@pytest.mark.parametrize(
    ("freq", "expected"),
    [
        ("h", 168),  # a week of hours
        ("30min", 336),
        ("15min", 672),
        ("2h", 84),
        ("D", 1),  # the week is daily data's main season already
        ("W-SUN", 1),
        ("MS", 1),
        ("bh", 1),  # a business week is not seven business days
        ("30s", 1),  # its season is the minute's, not the day's
        ("not-a-freq", 1),
    ],
)
def test_long_season_length_is_a_week_of_sub_daily_steps(freq, expected):
    assert long_season_length(freq) == expected


@pytest.mark.parametrize(
    ("freq", "expected"),
    [
        ("h", 24),  # one day a token
        ("MS", 12),  # one year
        ("QS", 8),  # two years: tokens of one quarter cost twice as much
        ("D", 14),  # two weeks
        ("B", 10),
        ("bh", 8),
        ("4h", 12),  # a daily cycle of 6 steps, twice
        ("15min", 48),  # half a day: the largest divisor of 96 up to 48
        ("W", 26),  # half a year of 52 weeks
        ("YS", 16),  # no cycle: PatchTST's patch
        (None, 16),
    ],
)
def test_patch_length_is_whole_cycles_of_at_least_8_steps(freq, expected):
    season = season_length(freq) if freq else 1
    patch = patch_length_for(season)
    assert patch == expected
    if 4 <= season <= 48:
        assert patch % season == 0  # tokens stay aligned with the cycle


def _after(last: str, freq: str, horizon: int) -> list[pd.Timestamp]:
    return [
        pd.Timestamp(t) for t in steps_after(np.array([last], "datetime64[ns]"), freq, horizon)[0]
    ]


def test_steps_after():
    assert _after("2024-01-01 23:00", "h", 2) == [
        pd.Timestamp("2024-01-02 00:00"),
        pd.Timestamp("2024-01-02 01:00"),
    ]
    assert _after("2024-01-01", "MS", 2) == [pd.Timestamp("2024-02-01"), pd.Timestamp("2024-03-01")]
    assert _after("2024-01-05", "B", 1) == [pd.Timestamp("2024-01-08")]  # a Friday
    # A monthly close on the last business day: March 2024 ends on a Sunday.
    assert _after("2024-02-29", "BME", 2) == [
        pd.Timestamp("2024-03-29"),
        pd.Timestamp("2024-04-30"),
    ]
    last = np.array(["2024-01-01", "2024-02-01"], "datetime64[ns]")
    out = steps_after(last, "h", 3)
    assert out.shape == (2, 3) and out.dtype == "datetime64[ns]"
    with pytest.raises(InvalidConfigError):
        steps_after(last, "h", 0)
    with pytest.raises(FrequencyInferenceError):
        steps_after(last, "sometimes", 3)


@pytest.mark.parametrize("freq", ["h", "D", "MS", "B"])
def test_steps_past_the_range_are_errors_not_wrapped(freq):
    last = np.array(["2262-04-01"], "datetime64[ns]")
    with pytest.raises(InvalidTimestampsError, match="2262-04-11"):
        steps_after(last, freq, 24 * 30)


def test_a_fixed_step_may_land_on_either_end_of_the_range():
    """The range's ends are timestamps too: a step onto one is a step, not an error."""
    for end, back in ((pd.Timestamp.max, 1), (pd.Timestamp.min, -1)):
        start = np.array([(end - back * pd.Timedelta("1ns")).to_datetime64()], "datetime64[ns]")
        assert pd.Timestamp(shift(start, "ns", back)[0]) == end
        # Beside a step past the end, which alone is refused (or NaT).
        moved = shift(start, "ns", np.array([back, 2 * back]), errors="coerce")
        assert pd.Timestamp(moved[0]) == end and np.isnat(moved[1])
        with pytest.raises(InvalidTimestampsError, match="outside"):
            shift(start, "ns", 2 * back)


def test_shifting_back_before_the_range_is_an_error():
    with pytest.raises(InvalidTimestampsError, match="outside"):
        shift(np.array(["1677-09-25"], "datetime64[ns]"), "D", -10)


@pytest.mark.parametrize("freq", ["YS", "D"])
def test_a_shift_outside_the_range_names_its_timestamp_or_is_coerced_to_nat(freq):
    """Of several timestamps moved alike, the error names the one that leaves the range (not
    the first), and errors="coerce" makes only that one NaT."""
    timestamps = np.array(["2000-01-01", "1700-01-01", "2010-01-01"], "datetime64[ns]")
    steps = -50 if freq == "YS" else -365 * 50
    with pytest.raises(InvalidTimestampsError, match="from 1700-01-01"):
        shift(timestamps, freq, steps)
    moved = shift(timestamps, freq, steps, errors="coerce")
    assert np.isnat(moved).tolist() == [False, True, False]
    np.testing.assert_array_equal(moved[[0, 2]], shift(timestamps[[0, 2]], freq, steps))


@pytest.mark.parametrize("freq", ["W-SUN", "ME", "QS", "YE", "B", "h"])
def test_regular_range_rolls_onto_anchored_grids_as_pandas_does(freq):
    expected = pd.date_range("2024-01-03 00:00", periods=5, freq=freq).to_numpy()
    np.testing.assert_array_equal(regular_range("2024-01-03", 5, freq), expected)
    if expected[0] != np.datetime64("2024-01-03"):
        with pytest.raises(InvalidTimestampsError, match=f"not on the '{freq}' grid"):
            regular_range("2024-01-03", 5, freq, roll_forward=False)


def test_regular_range_and_parse_timestamps_check_the_range():
    # An aware start of hourly steps is converted to UTC (whole days: test below).
    got = regular_range("2024-01-01T00:00:00+01:00", 2, "h")
    np.testing.assert_array_equal(
        got, np.array(["2023-12-31T23:00", "2024-01-01T00:00"], "datetime64[ns]")
    )
    with pytest.raises(InvalidTimestampsError):
        regular_range("2262-04-01", 24 * 30, "h")
    with pytest.raises(InvalidTimestampsError):
        parse_timestamps(pd.Series(["9016-01-01"]))


@pytest.mark.parametrize(
    ("wall", "expected"),
    [
        (pd.date_range("2024-03-20", periods=30, freq="D"), True),
        (pd.date_range("2024-01-01 09:30", periods=6, freq="W-MON"), True),
        (pd.date_range("2024-01-31", periods=6, freq="ME"), True),
        (pd.date_range("2024-03-30", periods=48, freq="h"), False),
        (pd.DatetimeIndex(["2024-01-01", "2024-01-02 01:00"]), False),
        (pd.date_range("2024-03-28 09:00", periods=40, freq="bh"), True),  # business hours
        (pd.DatetimeIndex(["2024-01-01"]), False),  # one timestamp says nothing of the spacing
        (pd.DatetimeIndex(["2024-01-01"] * 3), False),
    ],
)
def test_on_wall_clock_for_one_local_time_of_day(wall, expected):
    assert on_wall_clock(wall.to_numpy()) is expected


@pytest.mark.parametrize(
    ("freq", "expected"),
    [(None, None), ("D", True), ("7D", True), ("W-SUN", True), ("MS", True), ("B", True)]
    + [("bh", True), ("bh=08:00-18:00", True)]  # opening hours are local
    + [("h", False), ("12h", False), ("15min", False)],
)
def test_wall_clock_for_a_known_frequency(freq, expected):
    assert wall_clock_for(freq) is expected


def test_a_known_daily_frequency_reads_even_one_timestamp_as_a_local_date():
    """A history of one timestamp says nothing of its spacing; the model's frequency does."""
    one = pd.Series(pd.DatetimeIndex(["2024-04-01"]).tz_localize("Europe/Berlin"))
    assert parse_timestamps(one) == np.datetime64("2024-03-31T22:00")  # no frequency: UTC
    assert parse_timestamps(one, wall_clock=wall_clock_for("D")) == np.datetime64("2024-04-01")
    text = ["2024-03-31T00:00:00+01:00", "2024-04-01T00:00:00+02:00"]
    assert (
        read_datetimes([datetime.fromisoformat(t) for t in text])[0]
        == np.array(["2024-03-31", "2024-04-01"], "datetime64[ns]")
    ).all()
    hourly = read_datetimes([datetime.fromisoformat(t) for t in text], wall_clock=False)[0]
    assert (hourly == np.array(["2024-03-30T23:00", "2024-03-31T22:00"], "datetime64[ns]")).all()


@pytest.mark.parametrize("zone", ["Europe/Berlin", "Asia/Tokyo"])
def test_daily_aware_timestamps_are_read_as_local_dates(zone):
    # In UTC, Berlin midnights move from 23:00 to 22:00 at the March change; Tokyo's are 15:00
    # the day before.
    local = pd.date_range("2024-03-20", periods=30, freq="D")
    got = parse_timestamps(pd.Series(local.tz_localize(zone)))
    np.testing.assert_array_equal(got, local.to_numpy())


def test_hourly_aware_timestamps_across_dst_are_read_in_utc():
    # On the local clock 02:00-03:00 on 31 March does not exist; in UTC every step is an hour.
    aware = pd.date_range("2024-03-30 12:00", periods=48, freq="h", tz="Europe/Berlin")
    got = parse_timestamps(pd.Series(aware))
    np.testing.assert_array_equal(got, aware.tz_convert("UTC").tz_localize(None).to_numpy())
    assert (np.diff(got) == np.timedelta64(1, "h")).all()


def test_read_datetimes_reads_daily_offsets_on_the_wall_clock():
    local = pd.date_range("2024-03-20", periods=30, freq="D")
    # Fixed offsets as a JSON parser gives them: +01:00, then +02:00 from 31 March.
    given = [t.tz_localize("Europe/Berlin").to_pydatetime() for t in local]
    assert {v.utcoffset() for v in given} == {pd.Timedelta(hours=1), pd.Timedelta(hours=2)}
    assert read_datetimes(given)[1] is True  # a model fitted on them reads its wall clock
    np.testing.assert_array_equal(read_datetimes(given)[0], local.to_numpy())
    hourly = pd.date_range("2024-03-30 12:00", periods=48, freq="h", tz="Europe/Berlin")
    in_utc, on_wall = read_datetimes(list(hourly.to_pydatetime()))
    np.testing.assert_array_equal(in_utc, hourly.tz_convert("UTC").tz_localize(None).to_numpy())
    assert on_wall is False
    assert read_datetimes(list(local.to_pydatetime()))[1] is None  # naive: no zone to read
    # Naive and aware values mixed: refused as such text is (the naive ones read as UTC
    # would be an hour or two from what their writer meant), naming the series and value.
    mixed = [local[0].to_pydatetime(), given[1]]
    with pytest.raises(InvalidTimestampsError, match=r"'s1': ds value '2024-03-20T00:00:00'"):
        read_datetimes(mixed, ids=np.array(["s1", "s1"]))


def test_a_column_of_datetimes_with_changing_offsets_is_read_by_the_same_rule():
    """Datetimes with fixed offsets (as a JSON parser gives them) in an object column: pandas
    turns the ones whose offset differs into NaT; they read as the service reads them."""
    daily = pd.date_range("2024-03-28", periods=6, freq="D")
    column = pd.Series(
        [t.tz_localize("Europe/Berlin").to_pydatetime() for t in daily], dtype=object
    )
    np.testing.assert_array_equal(parse_timestamps(column), daily.to_numpy())


def test_text_with_offsets_that_change_is_read_by_the_same_rule():
    """ISO strings whose offset changes at a daylight-saving change, as pandas writes an aware
    column to CSV: pandas refuses to read them as one column; they read as aware values do."""
    daily = pd.date_range("2024-03-20", periods=30, freq="D")
    text = pd.Series([str(t) for t in daily.tz_localize("Europe/Berlin")])
    assert text.str.endswith("+01:00").any() and text.str.endswith("+02:00").any()
    np.testing.assert_array_equal(parse_timestamps(text), daily.to_numpy())
    hourly = pd.date_range("2024-03-30 12:00", periods=48, freq="h", tz="Europe/Berlin")
    np.testing.assert_array_equal(
        parse_timestamps(pd.Series([t.isoformat() for t in hourly])),
        hourly.tz_convert("UTC").tz_localize(None).to_numpy(),
    )
    with pytest.raises(InvalidTimestampsError, match="could not be parsed"):
        parse_timestamps(pd.Series(["2024-03-30T00:00:00+01:00", "2024-03-31T00:00:00+02:00", "x"]))


@pytest.mark.parametrize("freq", ["D", "W-WED", "MS"])
def test_regular_range_reads_an_aware_start_on_the_wall_clock_for_whole_days(freq):
    got = regular_range("2024-03-20T00:00:00+01:00", 5, freq)
    np.testing.assert_array_equal(got, pd.date_range("2024-03-20", periods=5, freq=freq))


@pytest.mark.parametrize("freq", ["0h", "-1h", "-2D", "0MS"])
def test_a_step_that_is_not_positive_is_a_frequency_error(freq):
    with pytest.raises(FrequencyInferenceError, match="expected a positive step"):
        parse_freq(freq)


def test_business_hours_other_than_pandas_default_keep_their_hours():
    """pandas spells every BusinessHour "bh"; the alias keeps the opening hours, so a model
    saved with it forecasts on the same hours."""
    offset = parse_freq("bh=08:00-18:00")
    assert freq_alias(offset) == "bh=08:00-18:00"
    assert freq_alias(parse_freq("bh")) == "bh"
    late = parse_freq("bh=16:00-24:00")  # a close at midnight round-trips
    assert freq_alias(late) == "bh=16:00-24:00" and freq_alias(parse_freq(freq_alias(late))) == (
        "bh=16:00-24:00"
    )
    assert season_length("bh=16:00-24:00") == 8
    friday = np.array(["2024-01-05T17:00"], dtype="datetime64[ns]")
    np.testing.assert_array_equal(
        steps_after(friday, "bh=08:00-18:00", 3)[0],
        np.array(["2024-01-08T08:00", "2024-01-08T09:00", "2024-01-08T10:00"], "datetime64[ns]"),
    )
    for shut in ("bh=18:00-08:00", "bh=08:00-08:00"):
        with pytest.raises(FrequencyInferenceError, match="opens at or after it closes"):
            parse_freq(shut)
    # pandas has no business day that never closes: named, not its own ValueError
    with pytest.raises(FrequencyInferenceError, match="around the clock.*'h'"):
        parse_freq("bh=00:00-24:00")
    assert season_length("bh=00:00-24:00") == 1


def _weekday_readings(first: str, last: str) -> pd.DatetimeIndex:
    """Hourly readings from `first` to `last` (inclusive) on each weekday of 1-5 January 2024."""
    days = [
        pd.date_range(f"2024-01-0{d} {first}", f"2024-01-0{d} {last}", freq="h")
        for d in range(1, 6)
    ]
    return days[0].append(days[1:])


@pytest.mark.parametrize(
    ("wall", "expected"),
    [
        (pd.date_range("2024-01-01 09:00", periods=40, freq="bh"), (9, 17)),
        (pd.date_range("2024-01-01 07:00", periods=40, freq="h"), None),  # every hour of the day
        # a weekend reading: not business hours
        (
            pd.date_range("2024-01-04 09:00", periods=40, freq="bh").append(
                pd.DatetimeIndex(["2024-01-06 10:00"])
            ),
            None,
        ),
        (pd.date_range("2024-01-01 09:00", periods=8, freq="h"), None),  # one day only
        (pd.date_range("2024-01-01 09:00", periods=10, freq="D"), None),  # a day apart
        (_weekday_readings("09:00", "10:00"), (9, 11)),  # the shortest opening
        (_weekday_readings("06:00", "21:00"), (6, 22)),  # the longest
        (_weekday_readings("06:00", "22:00"), None),  # longer: hourly data with quiet nights
        (_weekday_readings("09:30", "16:30"), None),  # not on whole hours
    ],
)
def test_business_hours_are_recognised_only_as_such(wall, expected):
    assert business_hours(wall.to_numpy()) == expected


@pytest.mark.parametrize(
    "sentinel", ["1500-01-01 00:00:00", "9999-12-31T00:00:00+02:00"], ids=["text", "offset"]
)
def test_a_timestamp_outside_the_range_names_its_series(sentinel):
    """An export's sentinel date failed a whole batch job: the error named no series."""
    first = "2024-01-01 00:00:00" if "+" not in sentinel else "2024-01-01T00:00:00+01:00"
    col = pd.Series([first, first.replace("01 00", "01 01"), sentinel])
    with pytest.raises(InvalidTimestampsError, match="series 'b'.*outside the supported") as info:
        parse_timestamps(col, np.array(["a", "a", "b"], dtype=object))
    assert info.value.series_id == "b"
    assert parse_iso(["2024-01-01T00:00:00", "1500-01-01T00:00:00"]) is None


# The first and last whole microseconds nanosecond timestamps hold.
FIRST, LAST = "1677-09-21T00:12:43.145225", "2262-04-11T23:47:16.854775"


@pytest.mark.parametrize(("bound", "outside"), [(FIRST, "1500-01-01"), (LAST, "9000-01-01")])
def test_the_range_holds_its_bounds_and_names_the_first_value_past_them(bound, outside):
    expected = np.array([FIRST, LAST], dtype="datetime64[ns]")
    np.testing.assert_array_equal(parse_iso([FIRST, LAST]), expected)
    np.testing.assert_array_equal(parse_timestamps(pd.Series([FIRST, LAST])), expected)
    np.testing.assert_array_equal(
        read_datetimes([datetime.fromisoformat(v) for v in (FIRST, LAST)])[0], expected
    )
    ids = np.array(["at the bound", "past it"], dtype=object)
    with pytest.raises(InvalidTimestampsError, match="series 'past it'"):
        parse_timestamps(pd.Series([bound, outside]), ids)
    values = [datetime.fromisoformat(bound), datetime.fromisoformat(outside)]
    with pytest.raises(InvalidTimestampsError, match="series 'past it'"):
        read_datetimes(values, ids=ids)


def test_pyarrow_dates_read_as_midnights():
    """`pd.read_parquet(..., dtype_backend="pyarrow")` gives a date column as date32, a pyarrow
    type with no zone or unit to convert."""
    col = pd.Series([date(2024, 1, 1), date(2024, 1, 2)], dtype=pd.ArrowDtype(pa.date32()))
    np.testing.assert_array_equal(
        parse_timestamps(col), np.array(["2024-01-01", "2024-01-02"], dtype="datetime64[ns]")
    )


def test_weekly_data_reads_without_pandas_deprecations():
    """Inferring a weekly anchor and the day-of-week feature used `dayofweek`, which pandas 3
    deprecates (a warning on every weekly frame) and pandas 4 removes."""
    import warnings

    from forecaster.validation import infer_frequency

    weeks = pd.date_range("2024-01-07", periods=10, freq="W-SUN")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert infer_frequency(pd.Series(weeks)) == "W-SUN"
        assert calendar_features(weeks).shape[0] == len(weeks)


def test_ambiguous_slashed_dates_read_month_first_as_pandas_reads_them():
    got = parse_timestamps(pd.Series(["01/02/2024", "01/03/2024", "01/04/2024"]))
    np.testing.assert_array_equal(got, pd.date_range("2024-01-02", periods=3).to_numpy())


def test_day_first_text_reads_day_first_throughout():
    """'01/01/2024' .. '20/01/2024' (a European export): read as 20 consecutive days, not
    value by value, which read '10/01/2024' as 1 October beside '13/01/2024' as 13 January and
    refused the sorted data as unsorted."""
    days = pd.date_range("2024-01-01", periods=20, freq="D")
    parsed = parse_timestamps(pd.Series(days.strftime("%d/%m/%Y")))
    np.testing.assert_array_equal(parsed, days.to_numpy())
    # Month first stays month first where it reads.
    parsed = parse_timestamps(pd.Series(days.strftime("%m/%d/%Y")))
    np.testing.assert_array_equal(parsed, days.to_numpy())


@pytest.mark.parametrize(
    ("legacy", "current"),
    [
        ("M", "ME"),
        ("3M", "3ME"),
        ("Q", "QE-DEC"),
        ("Y", "YE-DEC"),
        ("A", "YE-DEC"),
        ("SM", "SME-15"),
        ("H", "h"),
        ("2H", "2h"),
        ("T", "min"),
        ("S", "s"),
    ],
)
def test_legacy_aliases_read_as_their_current_spelling(legacy, current):
    assert parse_freq(legacy) == parse_freq(current)


def test_legacy_month_alias_means_month_ends():
    """freq='M' (pandas < 2.2) is month ends: month-end data validates under it and its
    forecast steps land on month ends, not on the 1st."""
    df = pd.DataFrame(
        {"unique_id": "a", "ds": pd.date_range("2024-01-31", periods=6, freq="ME"), "y": 1.0}
    )
    assert validate_long_frame(df, freq="M").freq == "ME"
    after = steps_after(np.array(["2024-06-30"], dtype="datetime64[ns]"), "M", 2)
    assert list(pd.DatetimeIndex(after[0])) == [
        pd.Timestamp("2024-07-31"),
        pd.Timestamp("2024-08-31"),
    ]


def test_local_times_a_daylight_saving_change_skips_or_repeats_come_back_in_one_way():
    """Forecast steps read on the wall clock, back in the history's zone: 02:30 on 31 March
    does not exist in Berlin and moves on to 03:00 summer time; 02:30 on 27 October happens
    twice and takes standard time (+01:00). Neither is an error or NaT."""
    ds = pd.Series(pd.to_datetime(["2024-03-31 02:30", "2024-10-27 02:30"]))
    got = in_zone(ds, "Europe/Berlin", wall_clock=True)
    assert got.tolist() == [
        pd.Timestamp("2024-03-31 03:00", tz="Europe/Berlin"),
        pd.Timestamp("2024-10-27 02:30+01:00", tz="Europe/Berlin"),
    ]
    assert got.dt.tz_convert("UTC").tolist() == [
        pd.Timestamp("2024-03-31 01:00", tz="UTC"),
        pd.Timestamp("2024-10-27 01:30", tz="UTC"),
    ]


@pytest.mark.parametrize(
    ("ds", "expected"),
    [
        (["2023-02-01", "2023-03-01"], "MS"),  # February: 28 days, still a month
        (["2023-01-31", "2023-02-28"], "ME"),
        (["2024-01-01", "2024-02-01"], "MS"),  # 31 days
        (["2024-01-01", "2024-01-28", "2024-02-24"], "27D"),  # shorter than any month
        (["2024-01-01", "2024-02-02"], "32D"),  # longer than any month
    ],
)
def test_month_long_steps_are_monthly(ds, expected):
    assert infer_frequency(pd.Series(pd.to_datetime(ds))) == expected


@pytest.mark.parametrize("freq", ["SMS-2", "SMS-27", "SME-27", "SME-2"])
def test_twice_monthly_data_on_day_2_to_27_is_semi_monthly(freq):
    """The 1st and 2nd of each month step by 1 day more often than by any other: read as
    daily, half the month would be gaps. So would February's 27th and 28th in 'SME-27'."""
    ds = pd.date_range("2023-01-01", periods=24, freq=freq)
    assert infer_frequency(pd.Series(ds)) == freq


def test_daily_data_with_gaps_on_two_days_of_one_month_is_still_daily():
    """Only every timestamp on the 1st or one other day makes data semi-monthly: a daily
    history with a gap past its first 64 days is daily whatever its first days look like."""
    gappy = pd.date_range("2024-01-01", periods=100, freq="D").delete(slice(70, 80))
    mixed = pd.DatetimeIndex(["2024-01-01", "2024-01-02", "2024-02-01", "2024-02-05"])
    for ds in (gappy, mixed):
        with pytest.raises(IrregularTimestampsError, match="the inferred 'D'"):
            infer_frequency(pd.Series(ds))


def test_two_timestamps_a_fortnight_apart_are_a_fixed_step():
    """One step says nothing of a semi-month's uneven ones: the 1st and 15th are 14 days."""
    assert infer_frequency(pd.Series(pd.to_datetime(["2024-01-01", "2024-01-15"]))) == "14D"


def test_data_on_the_1st_and_28th_is_refused_as_irregular():
    """pandas' semi-month offsets stop at day 27: data on the 1st and 28th of each month has
    no frequency, and is an error of the library's, not pandas' ValueError."""
    ds = pd.DatetimeIndex([f"2024-{m:02d}-{d:02d}" for m in range(1, 7) for d in (1, 28)])
    with pytest.raises(IrregularTimestampsError, match="off-grid"):
        infer_frequency(pd.Series(ds))


@pytest.mark.parametrize(
    ("start", "freq", "months", "season"),
    [
        ("2024-01-15", "MS", 1, 12),  # the 15th of every month: rent, billing, reports
        ("2024-02-10", "QS", 3, 4),  # the 10th of a quarter's first month
        ("2024-06-28", "YS", 12, 1),  # once a year, on the 28th of June
    ],
)
def test_data_on_a_day_inside_the_month_steps_by_months_from_it(start, freq, months, season):
    day = pd.Timestamp(start).day
    ds = pd.date_range(pd.Timestamp(start).replace(day=1), periods=30, freq=freq)
    df = pd.DataFrame({"unique_id": "a", "ds": ds + pd.Timedelta(days=day - 1), "y": 1.0})
    alias = f"{months if months > 1 else ''}MD"
    assert infer_frequency(df) == alias and freq_alias(parse_freq(alias)) == alias
    assert season_length(alias) == season and wall_clock_for(alias)  # dates, as monthly
    last = df["ds"].iloc[-1]
    after = steps_after(df["ds"].to_numpy()[-1:], alias, 3)[0]
    assert list(after) == [last + pd.DateOffset(months=months * k) for k in (1, 2, 3)]
    assert {pd.Timestamp(t).day for t in after} == {day}
    # A gap is a missing month; each series keeps its own day.
    other = df.assign(unique_id="b", ds=df["ds"] - pd.Timedelta(days=3)).drop(index=[4, 5])
    validated = validate_long_frame(pd.concat([df, other]), allow_missing=True)
    assert validated.freq == alias and len(validated.frame) == 60


def test_a_day_past_the_28th_is_not_a_step_of_months():
    """The 30th has no February, where pandas would clip it to the 29th and drift: such
    readings are read as the month ends some of them are, the others named off that grid."""
    ds = pd.date_range("2024-03-01", periods=12, freq="MS") + pd.Timedelta(days=29)
    with pytest.raises(IrregularTimestampsError, match="2024-03-30 .* not on the 'ME' grid"):
        infer_frequency(pd.Series(ds))
