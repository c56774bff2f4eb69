"""Every series-validation rule raises its own error naming the series; valid frames pass."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from forecaster.errors import (
    DuplicateTimestampsError,
    EmptyDataError,
    ForecasterInputError,
    FrequencyInferenceError,
    InvalidConfigError,
    InvalidTimestampsError,
    IrregularTimestampsError,
    MissingColumnsError,
    MissingCovariatesError,
    MissingValuesError,
    NonNumericValuesError,
    SeriesTooShortError,
)
from forecaster.time_axis import parse_freq
from forecaster.validation import (
    infer_frequency,
    validate_future_frame,
    validate_long_frame,
)


def frame(freq: str = "h", n: int = 10, ids=("a", "b"), start: str = "2024-01-01", **cols):
    parts = []
    for k, sid in enumerate(ids):
        part = pd.DataFrame(
            {
                "unique_id": sid,
                "ds": pd.date_range(start, periods=n, freq=parse_freq(freq)),
                "y": np.arange(n, dtype=float) + 100 * k,
            }
        )
        for name, values in cols.items():
            part[name] = values
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def set_cell(df: pd.DataFrame, row: int, column: str, value) -> pd.DataFrame:
    df = df.copy()
    df[column] = df[column].astype(object)
    df.loc[row, column] = value
    return df


@pytest.mark.parametrize(
    ("freq", "start", "expected"),
    [
        ("h", "2024-01-01", "h"),
        ("D", "2024-01-01", "D"),
        ("15min", "2024-01-01", "15min"),
        ("MS", "2024-01-01", "MS"),
        ("ME", "2024-01-31", "ME"),
        ("W-MON", "2024-01-01", "W-MON"),
        ("B", "2024-01-05", "B"),
        ("bh", "2024-01-05 15:00", "bh"),  # over a weekend
        ("bh=08:00-18:00", "2024-01-01 08:00", "bh=08:00-18:00"),
        ("QS", "2024-01-01", "QS-JAN"),
        ("2MS", "2024-01-01", "2MS"),
        ("4ME", "2024-01-31", "4ME"),
        ("6MS", "2024-07-01", "6MS"),
        ("SMS", "2024-01-01", "SMS-15"),  # 1st and 15th: payroll, twice-monthly reports
        ("SMS-10", "2024-01-10", "SMS-10"),
        ("SME", "2024-01-15", "SME-15"),  # 15th and month end, February's included
        ("14D", "2024-01-01", "14D"),  # fortnights drift through the month: no semi-month
        # A market's monthly close falls on the month's last business day (2024-03-29); its
        # first ones here are calendar month ends too.
        ("BME", "2024-01-31", "BME"),
        ("BMS", "2024-01-01", "BMS"),  # 2024-06-03: not a calendar month start
        ("BQE", "2024-03-29", "BQE-DEC"),
        ("BQS", "2024-01-01", "BQS-JAN"),
        ("BYE", "2024-12-31", "BYE-DEC"),
        ("2BME", "2024-01-31", "2BME"),
    ],
)
def test_valid_frame_passes_and_frequency_is_inferred(freq, start, expected):
    df = frame(freq, n=30, start=start)
    result = validate_long_frame(df)
    assert result.freq == expected
    assert infer_frequency(df) == expected
    assert result.n_series == 2
    out = result.frame
    assert list(out.columns) == ["unique_id", "ds", "y"]
    assert out["ds"].dtype == "datetime64[ns]"
    assert out["y"].dtype == "float64"
    assert out["unique_id"].tolist() == df["unique_id"].tolist()
    np.testing.assert_array_equal(out["y"].to_numpy(), df["y"].to_numpy())


def test_normalises_types_and_groups_interleaved_series():
    df = frame("h", n=5, promo=1)
    df["ds"] = df["ds"].astype(str)  # as read from a CSV
    df["y"] = df["y"].astype(str)  # numbers as text still parse
    df["promo"] = df["promo"].astype(bool)
    df["extra"] = "ignored"
    shuffled = df.sort_values(["ds", "unique_id"], kind="stable")  # rows by time, not by series
    result = validate_long_frame(shuffled, covariates=["promo"])
    out = result.frame
    assert list(out.columns) == ["unique_id", "ds", "y", "promo"]
    assert out["unique_id"].tolist() == ["a"] * 5 + ["b"] * 5
    assert out["ds"].is_monotonic_increasing is False  # two series, each increasing
    assert (out.groupby("unique_id")["ds"].diff().dropna() == pd.Timedelta("1h")).all()
    assert out["promo"].dtype == "float64" and (out["promo"] == 1.0).all()
    assert out.index.equals(pd.RangeIndex(10))


def test_other_target_column_is_renamed_to_y():
    df = frame("D", n=5).rename(columns={"y": "sales"})
    out = validate_long_frame(df, target="sales").frame
    assert "y" in out.columns and "sales" not in out.columns


def test_tz_aware_timestamps_are_converted_to_utc():
    df = frame("h", n=5)
    df["ds"] = df["ds"].dt.tz_localize("Europe/Paris")
    out = validate_long_frame(df).frame
    assert out["ds"].iloc[0] == pd.Timestamp("2023-12-31 23:00")


def test_daily_aware_timestamps_across_dst_are_local_dates():
    df = frame("D", n=30, start="2024-03-20")
    df["ds"] = df["ds"].dt.tz_localize("Europe/Berlin")
    out = validate_long_frame(df)
    assert out.freq == "D" and out.wall_clock
    assert (out.frame["ds"].dt.hour == 0).all()


def test_empty_frame():
    with pytest.raises(EmptyDataError, match="no rows"):
        validate_long_frame(frame().iloc[:0])


def test_missing_columns_lists_missing_and_present():
    with pytest.raises(MissingColumnsError) as info:
        validate_long_frame(frame().drop(columns="y"), covariates=["promo"])
    message = str(info.value)
    assert "['y', 'promo']" in message and "['unique_id', 'ds']" in message
    assert info.value.field == "y"


def test_unparseable_timestamps_name_series_and_value():
    df = set_cell(frame(), 13, "ds", "not a date")
    with pytest.raises(InvalidTimestampsError, match="'not a date'") as info:
        validate_long_frame(df)
    assert info.value.series_id == "b"
    assert info.value.field == "ds"
    assert "'b'" in str(info.value)


def test_fractional_numbers_as_timestamps_are_rejected():
    df = frame()
    df["ds"] = np.arange(len(df)) + 0.5  # integers are steps (test_integer_time)
    with pytest.raises(InvalidTimestampsError, match="numbers"):
        validate_long_frame(df)


@pytest.mark.parametrize("dtype", [object, "str"])
def test_non_numeric_target_names_value_and_series(dtype):
    df = frame()
    df["y"] = df["y"].astype(dtype)
    df.loc[14, "y"] = "abc"
    with pytest.raises(NonNumericValuesError) as info:
        validate_long_frame(df)
    assert "'abc'" in str(info.value) and "'b'" in str(info.value)
    assert "2024-01-01 04:00:00" in str(info.value)
    assert (info.value.series_id, info.value.field) == ("b", "y")


@pytest.mark.parametrize("dtype", [object, "str"])
def test_text_that_spells_a_missing_value_is_one_in_a_frame_as_in_a_csv(dtype):
    df = frame()
    df["y"] = df["y"].astype(dtype)
    df.loc[[1, 2, 14], "y"] = ["NA", "", "null"]
    values = validate_long_frame(df, allow_missing=True).columns["y"]
    assert np.isnan(values[[1, 2, 14]]).all() and np.isfinite(np.delete(values, [1, 2, 14])).all()
    with pytest.raises(MissingValuesError):  # missing, where no missing value is allowed
        validate_long_frame(df)


@pytest.mark.parametrize(
    "target",
    [
        lambda df: df["ds"],  # read as nanoseconds since 1970, a forecast mean of 1.7e18
        lambda df: df["ds"] - df["ds"].min(),
        lambda df: df["y"].astype(complex) + 5j,  # the imaginary part silently lost
    ],
    ids=["timestamps", "durations", "complex"],
)
def test_a_target_of_timestamps_durations_or_complex_numbers_is_refused(target):
    df = frame()
    with pytest.raises(NonNumericValuesError, match="expected real numbers") as info:
        validate_long_frame(df.assign(y=target(df)))
    assert info.value.field == "y"


def test_non_numeric_covariate():
    df = set_cell(frame(promo=0), 3, "promo", "yes")
    with pytest.raises(NonNumericValuesError) as info:
        validate_long_frame(df, covariates=["promo"])
    assert (info.value.series_id, info.value.field) == ("a", "promo")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, None])
def test_missing_or_infinite_values(bad):
    df = frame()
    df.loc[12, "y"] = bad
    with pytest.raises(MissingValuesError) as info:
        validate_long_frame(df)
    assert (info.value.series_id, info.value.field) == ("b", "y")
    assert "'b'" in str(info.value) and "2024-01-01 02:00:00" in str(info.value)


def test_missing_series_id():
    df = set_cell(frame(), 4, "unique_id", None)
    with pytest.raises(MissingValuesError) as info:
        validate_long_frame(df)
    assert info.value.field == "unique_id"


def test_duplicate_timestamps():
    df = frame()
    df = pd.concat([df, df.iloc[[13]]], ignore_index=True)
    with pytest.raises(DuplicateTimestampsError) as info:
        validate_long_frame(df)
    assert info.value.series_id == "b"
    assert "2024-01-01 03:00:00" in str(info.value)


@pytest.mark.parametrize("allow_missing", [False, True])
def test_rows_in_any_order_are_read_in_series_and_time_order(allow_missing):
    """A query without ORDER BY returns rows in any order: each series is read in time order,
    its values and covariates with their timestamps, as Nixtla's libraries read it."""
    df = frame(n=10, promo=np.arange(10.0))
    ordered = validate_long_frame(df, covariates=["promo"], allow_missing=allow_missing)
    for rows in (
        df.iloc[[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 11, 13, 14, 15, 16, 17, 18, 19]],
        df.sample(frac=1, random_state=0),
        df.iloc[::-1],
    ):
        result = validate_long_frame(rows, covariates=["promo"], allow_missing=allow_missing)
        # Series in order of first appearance, as always; each in time order.
        by_series = result.frame.sort_values("unique_id", kind="stable", ignore_index=True)
        pd.testing.assert_frame_equal(by_series, ordered.frame)
    shuffled = df.sample(frac=1, random_state=1)
    repeated = pd.concat([shuffled, df.iloc[[13]]], ignore_index=True)
    with pytest.raises(DuplicateTimestampsError, match="'b'.*2024-01-01 03:00:00.*1 duplicate"):
        validate_long_frame(repeated)


def test_gap_names_series_and_expected_vs_found():
    df = frame().drop(index=15)
    with pytest.raises(IrregularTimestampsError) as info:
        validate_long_frame(df)
    message = str(info.value)
    assert info.value.series_id == "b"
    assert "expected 2024-01-01 05:00:00" in message and "found 2024-01-01 06:00:00" in message


def test_off_grid_point():
    df = frame()
    df.loc[3, "ds"] = pd.Timestamp("2024-01-01 03:30")
    with pytest.raises(IrregularTimestampsError, match="off-grid") as info:
        validate_long_frame(df)
    assert info.value.series_id == "a"


def test_gap_in_monthly_data():
    df = frame("MS", n=12).drop(index=5)
    with pytest.raises(IrregularTimestampsError, match="expected 2024-06-01") as info:
        validate_long_frame(df)
    assert info.value.series_id == "a"


@pytest.mark.parametrize("allow_missing", [False, True])
def test_off_anchor_point_in_calendar_data_names_its_series(allow_missing):
    """Series share their dates, and the calendar check runs once per distinct date: a date
    off the month starts is still traced to the series and row that hold it."""
    df = frame("MS", n=12, ids=("a", "b", "c"))
    df.loc[12 + 4, "ds"] = pd.Timestamp("2024-05-15")  # b's fifth month
    with pytest.raises(IrregularTimestampsError, match="'b'.*2024-05-15") as info:
        validate_long_frame(df, freq="MS", allow_missing=allow_missing)
    assert info.value.series_id == "b"


def test_monthly_data_off_every_anchor_is_named():
    """A calendar month end among business ones is off the business grid. (Readings on a day
    inside the month are a step of months: test_time_axis.)"""
    df = frame("BME", n=12, start="2024-01-31")
    df.loc[2, "ds"] = pd.Timestamp("2024-03-31")  # a Sunday, where 2024-03-29 belongs
    with pytest.raises(IrregularTimestampsError, match="2024-03-31"):
        validate_long_frame(df)


def test_frequency_cannot_be_inferred_from_single_points():
    with pytest.raises(FrequencyInferenceError, match="single timestamp") as info:
        validate_long_frame(frame(n=1))
    assert "pass freq" not in str(info.value)  # fit takes none: the message asks for points
    # ...but a given freq makes single-point series valid.
    assert validate_long_frame(frame(n=1), freq="h").freq == "h"


def test_mixed_frequencies_name_the_odd_series():
    df = pd.concat([frame("h", ids=["a", "b"]), frame("D", ids=["c"])], ignore_index=True)
    with pytest.raises(FrequencyInferenceError, match="mixed") as info:
        validate_long_frame(df)
    assert info.value.series_id == "c"
    assert "'D'" in str(info.value) and "'h'" in str(info.value)


def test_given_frequency_must_match():
    with pytest.raises(FrequencyInferenceError) as info:
        validate_long_frame(frame("h"), freq="D")
    assert "'D'" in str(info.value) and "'h'" in str(info.value)
    with pytest.raises(FrequencyInferenceError, match="not a pandas offset alias"):
        validate_long_frame(frame("h"), freq="fortnightly")


def test_monthly_data_on_the_15th_is_a_step_of_months():
    df = frame("MS", n=6)
    df["ds"] = df["ds"] + pd.Timedelta(days=14)
    assert validate_long_frame(df).freq == "MD"


def test_series_too_short_names_series_length_and_minimum():
    df = pd.concat([frame(n=10, ids=["long"]), frame(n=4, ids=["short"])], ignore_index=True)
    with pytest.raises(SeriesTooShortError) as info:
        validate_long_frame(df, min_length=5)
    assert info.value.series_id == "short"
    assert "'short' has 4 observed points, expected at least 5" in str(info.value)


def test_every_error_is_a_value_error():
    with pytest.raises(ValueError):
        validate_long_frame(frame().drop(columns="ds"))
    with pytest.raises(ForecasterInputError):
        validate_long_frame("not a frame")


def test_validation_of_many_series_names_the_series_at_fault():
    n_series, n = 20_000, 50
    df = pd.DataFrame(
        {
            "unique_id": np.repeat(np.arange(n_series).astype(str), n),
            "ds": np.tile(pd.date_range("2024-01-01", periods=n, freq="h").to_numpy(), n_series),
            "y": np.random.default_rng(0).normal(size=n_series * n),
        }
    )
    # A million rows: what it costs is measured by benchmarks.fit_scale, not here.
    result = validate_long_frame(df, min_length=n)
    assert result.n_series == n_series and result.freq == "h"
    df.loc[len(df) - 3, "ds"] += pd.Timedelta("1h")
    with pytest.raises(DuplicateTimestampsError) as info:
        validate_long_frame(df)
    assert info.value.series_id == str(n_series - 1)


class TestFutureFrame:
    def history(self):
        return validate_long_frame(frame("h", n=10, promo=0.0), covariates=["promo"])

    def future(self, n=5, ids=("b", "a")):
        return frame("h", n=n, ids=ids, start="2024-01-01 10:00").assign(promo=1.0)

    def test_a_repeated_future_timestamp_is_refused_not_returned_twice(self):
        future = self.future()
        future = pd.concat([future, future.iloc[[1]].assign(promo=0.0)], ignore_index=True)
        with pytest.raises(
            DuplicateTimestampsError, match="2024-01-01 11:00:00 more than once"
        ) as info:
            validate_future_frame(future, history=self.history(), horizon=3, covariates=["promo"])
        assert (info.value.series_id, info.value.field) == ("b", "ds")

    def test_returns_exactly_the_horizon_in_history_order(self):
        out = validate_future_frame(
            self.future(), history=self.history(), horizon=3, covariates=["promo"]
        )
        assert list(out.columns) == ["unique_id", "ds", "promo"]
        assert out["unique_id"].tolist() == ["a"] * 3 + ["b"] * 3
        expected = pd.date_range("2024-01-01 10:00", periods=3, freq="h")
        assert out["ds"].iloc[:3].tolist() == expected.tolist()
        assert (out["promo"] == 1.0).all()

    def test_missing_step_names_series_and_timestamp(self):
        future = self.future().drop(index=1)  # series b, 11:00
        with pytest.raises(MissingCovariatesError) as info:
            validate_future_frame(future, history=self.history(), horizon=3, covariates=["promo"])
        assert info.value.series_id == "b"
        assert "2024-01-01 11:00:00" in str(info.value)

    def test_missing_frame_and_column(self):
        with pytest.raises(MissingCovariatesError, match="no future frame"):
            validate_future_frame(None, history=self.history(), horizon=3, covariates=["promo"])
        with pytest.raises(MissingCovariatesError, match="promo"):
            validate_future_frame(
                self.future().drop(columns="promo"),
                history=self.history(),
                horizon=3,
                covariates=["promo"],
            )

    def test_bad_covariate_values(self):
        future = self.future()
        future.loc[2, "promo"] = np.nan
        with pytest.raises(MissingValuesError) as info:
            validate_future_frame(future, history=self.history(), horizon=3, covariates=["promo"])
        assert (info.value.series_id, info.value.field) == ("b", "promo")

    def test_a_one_step_future_is_read_as_its_daily_history(self):
        # One timestamp alone would be read in UTC (the day before, at 15:00).
        history = frame("D", n=10, ids=["a"], promo=0.0)
        history["ds"] = history["ds"].dt.tz_localize("Asia/Tokyo")
        validated = validate_long_frame(history, covariates=["promo"])
        future = frame("D", n=1, ids=["a"], start="2024-01-11").assign(promo=1.0)
        future["ds"] = future["ds"].dt.tz_localize("Asia/Tokyo")
        out = validate_future_frame(future, history=validated, horizon=1, covariates=["promo"])
        assert out["ds"].tolist() == [pd.Timestamp("2024-01-11")]
        assert out["promo"].tolist() == [1.0]

    def test_monthly_future_steps(self):
        history = validate_long_frame(frame("MS", n=6, promo=0.0), covariates=["promo"])
        future = frame("MS", n=2, start="2024-07-01").assign(promo=1.0)
        out = validate_future_frame(future, history=history, horizon=2, covariates=["promo"])
        assert out["ds"].iloc[:2].tolist() == [
            pd.Timestamp("2024-07-01"),
            pd.Timestamp("2024-08-01"),
        ]


def test_out_of_range_timestamps_do_not_wrap_around():
    df = frame("D", n=3)
    df["ds"] = ["1500-01-01", "1500-01-02", "1500-01-03"] * 2
    with pytest.raises(InvalidTimestampsError, match="outside"):
        validate_long_frame(df)


def test_repeated_required_column():
    df = frame("h", n=3)
    df["y2"] = df["y"]
    df.columns = ["unique_id", "ds", "y", "y"]
    with pytest.raises(MissingColumnsError, match="more than once"):
        validate_long_frame(df)


def test_values_too_large_to_scale_are_rejected_naming_the_series():
    from forecaster.errors import NonNumericValuesError
    from forecaster.validation import validate_long_frame

    frame = pd.DataFrame(
        {
            "unique_id": ["a"] * 3 + ["b"] * 3,
            "ds": list(pd.date_range("2024-01-01", periods=3, freq="h")) * 2,
            "y": [1.0, 2.0, 3.0, 1.0, 1e300, 3.0],
        }
    )
    with pytest.raises(NonNumericValuesError, match="series 'b'.*at most 1e\\+30") as error:
        validate_long_frame(frame)
    assert error.value.series_id == "b"


def columns_of(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """The service's road: ids as a Python-string object array, `ds` parsed, values float."""
    return {
        "unique_id": np.array(df["unique_id"].tolist(), dtype=object),
        "ds": pd.to_datetime(df["ds"]).to_numpy(dtype="datetime64[ns]"),
        "y": df["y"].to_numpy(dtype=np.float64),
    }


def test_columns_give_the_same_result_as_the_frame():
    df = frame("h", n=6, ids=("a", "b", "c")).drop(index=[3]).reset_index(drop=True)
    df.loc[7, "y"] = np.nan
    df = df.sample(frac=1.0, random_state=0).sort_values("ds", kind="stable")  # interleaved
    from_frame = validate_long_frame(df, allow_missing=True)
    from_columns = validate_long_frame(columns_of(df), allow_missing=True)
    assert from_columns.freq == from_frame.freq == "h"
    pd.testing.assert_frame_equal(from_columns.frame, from_frame.frame)
    # Series boundaries, gap rows included, as the model's panel reads them.
    ids = from_frame.frame["unique_id"].to_numpy()
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    for result in (from_frame, from_columns):
        assert result.series_ids == [str(ids[i]) for i in starts]
        np.testing.assert_array_equal(result.offsets, np.r_[starts, len(ids)])


@pytest.mark.parametrize(
    "spoil",
    [
        lambda df: pd.concat([df, df.iloc[[13]]], ignore_index=True),  # duplicate timestamp
        lambda df: df.drop(index=15),  # gap (an error without allow_missing)
        lambda df: df.assign(y=df["y"].where(df.index != 12, np.inf)),  # not finite
        lambda df: df.assign(y=df["y"].where(df.index != 12, 1e40)),  # too large to scale
    ],
)
def test_columns_fail_with_the_frames_error(spoil):
    bad = spoil(frame())
    with pytest.raises(ForecasterInputError) as on_frame:
        validate_long_frame(bad)
    with pytest.raises(ForecasterInputError) as on_columns:
        validate_long_frame(columns_of(bad))
    assert type(on_columns.value) is type(on_frame.value)
    assert str(on_columns.value) == str(on_frame.value)
    assert on_columns.value.series_id == on_frame.value.series_id


def test_columns_of_other_types_are_converted_like_a_frames():
    df = frame("D", n=4, ids=(7, 8))  # integer ids, as a database would give them
    columns = {"unique_id": df["unique_id"].to_numpy(), "ds": df["ds"].astype(str).to_numpy()}
    result = validate_long_frame({**columns, "y": df["y"].astype(str).to_numpy()})
    assert result.frame["unique_id"].tolist() == ["7"] * 4 + ["8"] * 4
    assert result.frame["ds"].dtype == "datetime64[ns]"


def test_columns_missing_or_of_different_lengths_are_named():
    columns = columns_of(frame())
    with pytest.raises(MissingColumnsError, match=r"missing required columns \['y'\]"):
        validate_long_frame({k: v for k, v in columns.items() if k != "y"})
    with pytest.raises(ForecasterInputError, match="different lengths"):
        validate_long_frame({**columns, "y": columns["y"][:-1]})
    with pytest.raises(EmptyDataError):
        validate_long_frame({k: v[:0] for k, v in columns.items()})


@pytest.mark.parametrize("gap", [True, False])
def test_calendar_step_at_another_time_of_day_is_an_error_not_a_shift(gap):
    """A month end at noon is on the anchor but not on the series' grid (midnight month ends):
    it must be named, not placed on a neighbouring step or another series' row."""
    ds = pd.date_range("2020-01-31", periods=12, freq="ME")
    if gap:
        ds = ds.delete(5)
    ds = ds[:-1].append(pd.DatetimeIndex([ds[-1] + pd.Timedelta(hours=12)]))
    a = pd.DataFrame({"unique_id": "a", "ds": ds, "y": np.arange(len(ds), dtype=float)})
    b = pd.DataFrame(
        {"unique_id": "b", "ds": pd.date_range("2020-01-31", periods=12, freq="ME"), "y": 1.0}
    )
    for frame in (pd.concat([a, b]), pd.concat([b, a])):
        with pytest.raises(IrregularTimestampsError, match=r"'a'.*2020-12-31 12:00:00.*'ME' grid"):
            validate_long_frame(frame, allow_missing=True)


def test_a_coarser_series_among_finer_ones_is_named_not_filled():
    """A 2-hourly series beside an hourly one would be half missing once filled: an error."""
    hourly = pd.DataFrame(
        {"unique_id": "hourly", "ds": pd.date_range("2024-01-01", periods=48, freq="h"), "y": 1.0}
    )
    two_hourly = pd.DataFrame(
        {"unique_id": "two", "ds": pd.date_range("2024-01-01", periods=24, freq="2h"), "y": 1.0}
    )
    with pytest.raises(FrequencyInferenceError, match=r"'two': .*2 steps of 'h'"):
        validate_long_frame(pd.concat([hourly, two_hourly]), allow_missing=True)
    with pytest.raises(FrequencyInferenceError, match=r"'two'"):
        validate_long_frame(two_hourly, freq="h", allow_missing=True)
    # Gaps of any length in a series that does take single steps are gaps.
    gappy = hourly.drop(index=[3, 4, 10, 11, 12])
    assert validate_long_frame(gappy, allow_missing=True).frame["y"].isna().sum() == 5


@pytest.mark.parametrize("freq", ["MS", "2MS", "B", "W-SUN", "SMS", "SME"])
def test_calendar_gaps_are_filled_on_each_series_own_grid(freq):
    """Series of a calendar frequency share grids (one built per time of day or phase); the
    filled frame must be what each series' own `pd.date_range` gives, whatever the sharing."""
    rng = np.random.default_rng(0)
    parts = []
    for k in range(12):
        # Other start dates (two phases of "2MS"), and a third of the series at noon.
        start = (
            pd.Timestamp("2001-01-01")
            + pd.offsets.MonthBegin(k)
            + pd.Timedelta(hours=12 * (k % 3 == 0))
        )
        ds = pd.date_range(start, periods=int(rng.integers(2, 40)), freq=freq)
        kept = np.sort(rng.choice(len(ds), size=max(2, len(ds) // 2), replace=False))
        kept[[0, -1]] = 0, len(ds) - 1  # first and last stay: they bound the grid
        parts.append(pd.DataFrame({"unique_id": f"s{k}", "ds": ds[np.unique(kept)], "y": 1.0}))
    given = pd.concat(parts, ignore_index=True)
    filled = validate_long_frame(given, freq=freq, allow_missing=True).frame
    expected = pd.concat(
        [
            pd.DataFrame(
                {
                    "unique_id": p["unique_id"].iloc[0],
                    "ds": pd.date_range(p.ds.min(), p.ds.max(), freq=freq),
                }
            ).merge(p, on=["unique_id", "ds"], how="left")
            for p in parts
        ],
        ignore_index=True,
    )
    assert filled["ds"].tolist() == expected["ds"].tolist()
    assert filled["unique_id"].tolist() == expected["unique_id"].tolist()
    np.testing.assert_array_equal(filled["y"].isna(), expected["y"].isna())


def test_business_hours_beside_round_the_clock_series_are_warned_of():
    """Fitted together, a shop's opening hours are read as hourly with their nights missing
    (and forecast through them); nothing else says so when gaps are allowed."""
    web = frame("h", n=300, ids=("web",))
    shop = frame("bh", n=100, ids=("shop",), start="2024-01-01 09:00")
    with pytest.warns(UserWarning, match="keep business hours \\(e.g. 'shop'\\)"):
        assert validate_long_frame(pd.concat([web, shop]), allow_missing=True).freq == "h"
    assert validate_long_frame(shop, allow_missing=True).freq == "bh"


def test_business_days_beside_daily_series_are_warned_of():
    """Fitted together, a market's business days are read as daily with their weekends
    missing (and forecast through them); a weekday series too short to hold a weekend is not
    named."""
    daily = frame("D", n=60, ids=("sales",))
    market = frame("B", n=40, ids=("market",), start="2024-01-01")
    three = frame("B", n=3, ids=("new",), start="2024-01-02")  # Tue-Thu: no Friday to Monday
    with pytest.warns(UserWarning, match="1 of 3 series keep business days \\(e.g. 'market'\\)"):
        found = validate_long_frame(pd.concat([daily, market, three]), allow_missing=True)
    assert found.freq == "D"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert validate_long_frame(pd.concat([daily, three]), allow_missing=True).freq == "D"
    assert validate_long_frame(market, allow_missing=True).freq == "B"


def test_timestamps_with_and_without_a_zone_are_named_as_such():
    """pandas reads the mix as NaT: the message called a valid timestamp 'not a timestamp'."""
    aware = pd.date_range("2024-01-01", periods=24, freq="h", tz="Europe/Berlin")
    naive = pd.date_range("2024-01-01", periods=24, freq="h")
    df = pd.DataFrame(
        {
            "unique_id": ["a"] * 24 + ["b"] * 24,
            "ds": pd.Series([*aware, *naive], dtype=object),
            "y": 1.0,
        }
    )
    with pytest.raises(InvalidTimestampsError, match="without a time zone or UTC offset") as info:
        validate_long_frame(df)
    assert info.value.series_id == "b"


def test_a_covariate_too_large_for_the_model_is_refused_in_the_history_too():
    """Covariates reach the float32 model unscaled: a history covariate of 1e20 made every
    forecast NaN without a word, as a future one did."""
    df = frame(promo=[0.0] * 9 + [1e20])
    with pytest.raises(NonNumericValuesError, match=r"column 'promo' is 1e\+20") as error:
        validate_long_frame(df, covariates=["promo"])
    assert (error.value.series_id, error.value.field) == ("a", "promo")


def test_min_length_counts_observed_values_not_rows():
    """With missing values allowed, a series of 10 rows of which 3 are observed is 3 long:
    the backtest's `min_length` must not pass it as 10."""
    df = frame(n=10, ids=("a",))
    df.loc[3:, "y"] = np.nan
    with pytest.raises(SeriesTooShortError, match="'a' has 3 observed points, expected at least 5"):
        validate_long_frame(df, min_length=5, allow_missing=True)
    assert validate_long_frame(df, min_length=3, allow_missing=True).n_series == 1


@pytest.mark.parametrize(
    ("target", "name"),
    [("y", "unique_id"), ("y", "ds"), ("y", "y"), ("sales", "sales"), ("sales", "y")],
)
def test_a_covariate_named_after_a_required_column_is_refused(target, name):
    """Also `y` beside another target: the result holds the target as `y`, and a covariate
    of that name replaced it there without a word."""
    df = frame("h", n=5).rename(columns={"y": target}).assign(y=7.0)
    with pytest.raises(InvalidConfigError, match=f"got \\['{name}'\\]") as info:
        validate_long_frame(df, covariates=[name], target=target)
    assert info.value.field == "covariates"


def test_a_covariate_named_twice_is_refused():
    with pytest.raises(InvalidConfigError, match="expected distinct names") as info:
        validate_long_frame(frame("h", n=5, promo=1.0), covariates=["promo", "promo"])
    assert info.value.field == "covariates"


def test_a_single_covariate_name_is_one_covariate_not_its_letters():
    out = validate_long_frame(frame("h", n=5, promo=1.0), covariates="promo").frame
    assert list(out.columns) == ["unique_id", "ds", "y", "promo"]


@pytest.mark.parametrize("min_length", [0, -1, 2.5, "3"])
def test_min_length_must_be_a_positive_int(min_length):
    with pytest.raises(InvalidConfigError, match="min_length: expected an int >= 1"):
        validate_long_frame(frame(), min_length=min_length)


def test_a_series_with_no_observed_value_is_named_as_such_not_as_too_short():
    df = frame(n=5)
    df.loc[5:, "y"] = np.nan  # every value of series b
    with pytest.raises(MissingValuesError, match="'b' has no observed value") as info:
        validate_long_frame(df, allow_missing=True)
    assert (info.value.series_id, info.value.field) == ("b", "y")


def test_at_most_ten_missing_steps_per_observed_one_are_filled():
    """Three observed hours may span 33 (30 missing); one more missing step is refused as a
    wrong frequency rather than filled."""

    def with_sparse(last_hour: int) -> pd.DataFrame:
        ds = pd.Timestamp("2024-01-01") + pd.to_timedelta([0, 1, last_hour], unit="h")
        sparse = pd.DataFrame({"unique_id": "sparse", "ds": ds, "y": 1.0})
        return pd.concat([frame("h", n=40, ids=("dense",)), sparse], ignore_index=True)

    filled = validate_long_frame(with_sparse(32), freq="h", allow_missing=True).frame
    sparse = filled[filled["unique_id"] == "sparse"]
    assert len(sparse) == 33 and sparse["y"].isna().sum() == 30
    with pytest.raises(
        IrregularTimestampsError,
        match="'sparse': 3 timestamps span 34 steps of frequency 'h'; expected at most 10 missing",
    ) as info:
        validate_long_frame(with_sparse(33), freq="h", allow_missing=True)
    assert (info.value.series_id, info.value.field) == ("sparse", "ds")


def test_business_days_warning_says_how_they_are_read_and_points_at_the_caller():
    daily = frame("D", n=60, ids=("sales",))
    market = frame("B", n=40, ids=("market",), start="2024-01-01")
    with pytest.warns(UserWarning) as record:
        validate_long_frame(pd.concat([daily, market]), allow_missing=True)
    [warning] = record
    assert (
        "but are read as daily, with weekends missing, beside series read every day; fit them "
        "apart to forecast their next business days" in str(warning.message)
    )
    assert warning.filename == __file__


def test_business_days_are_not_warned_of_when_the_frequency_is_given():
    """A fitted model passes its frequency at every forecast: the caller has said daily."""
    daily = frame("D", n=60, ids=("sales",))
    market = frame("B", n=40, ids=("market",), start="2024-01-01")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = validate_long_frame(pd.concat([daily, market]), freq="D", allow_missing=True)
    assert found.freq == "D"


def test_weekdays_that_never_step_from_friday_to_monday_are_not_business_days():
    """Monday to Wednesday, then Tuesday to Thursday of the next week: read as daily on its
    own, so not named beside a daily series."""
    days = ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-09", "2024-01-10", "2024-01-11"]
    weekdays = pd.DataFrame({"unique_id": "odd", "ds": pd.to_datetime(days), "y": 1.0})
    assert validate_long_frame(weekdays, allow_missing=True).freq == "D"
    daily = frame("D", n=60, ids=("sales",))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = validate_long_frame(pd.concat([daily, weekdays]), allow_missing=True)
    assert found.freq == "D"


def test_a_missing_timestamp_in_datetime64_columns_is_named():
    """The service's road hands `ds` over already as datetime64[ns]: a NaT in it is a missing
    timestamp, named like one in a frame."""
    columns = columns_of(frame())
    columns["ds"] = columns["ds"].copy()
    columns["ds"][13] = np.datetime64("NaT")
    with pytest.raises(InvalidTimestampsError, match="'b': ds is missing at row 13") as info:
        validate_long_frame(columns)
    assert (info.value.series_id, info.value.field) == ("b", "ds")
