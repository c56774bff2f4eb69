"""Loaders (long/wide, CSV/Parquet), the quantile column name and time-ordered splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forecaster.data import (
    load_frame,
    quantile_column,
    read_wide_csv,
    split_future_rows,
    time_split,
    wide_to_long,
)
from forecaster.errors import (
    EmptyDataError,
    ForecasterInputError,
    InvalidConfigError,
    InvalidTimestampsError,
    MissingColumnsError,
    NonNumericValuesError,
    SeriesTooShortError,
)
from forecaster.validation import validate_long_frame

ETTH1 = Path(__file__).parents[2].parent / "shared/data/ETTh1.csv"


def wide_frame(n: int = 6) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "date": pd.date_range("2024-01-01", periods=n, freq="h").strftime("%Y-%m-%d %H:%M:%S"),
            "HUFL": np.arange(n, dtype=float),
            "OT": np.arange(n, dtype=float) * 10,
            "note": ["x"] * n,  # non-numeric: not a series
        }
    )


def test_quantile_column_names():
    assert [quantile_column(q) for q in (0.1, 0.5, 0.9, 0.05)] == ["q0.1", "q0.5", "q0.9", "q0.05"]


def test_wide_to_long_round_trip(tmp_path):
    wide = wide_frame()
    path = tmp_path / "wide.csv"
    wide.to_csv(path, index=False)
    long = load_frame(path)
    assert list(long.columns) == ["unique_id", "ds", "y"]
    assert long["unique_id"].unique().tolist() == ["HUFL", "OT"]
    assert long["ds"].dtype == "datetime64[ns]"
    back = long.pivot(index="ds", columns="unique_id", values="y")
    np.testing.assert_array_equal(back["HUFL"].to_numpy(), wide["HUFL"].to_numpy())
    np.testing.assert_array_equal(back["OT"].to_numpy(), wide["OT"].to_numpy())
    assert validate_long_frame(long).freq == "h"
    pd.testing.assert_frame_equal(read_wide_csv(path), long)


def test_a_typo_in_a_wide_column_names_the_cell_instead_of_dropping_the_series(tmp_path):
    """One "?" among OT's numbers: refused naming the column, the cell and its time, where it
    once made OT's whole series vanish; blank cells stay missing values."""
    wide = wide_frame()
    path = tmp_path / "wide.csv"
    wide.astype({"OT": object}).assign(OT=lambda d: d["OT"].where(d.index != 3, "?")).to_csv(
        path, index=False
    )
    with pytest.raises(NonNumericValuesError, match="'OT'.*'\\?'.*2024-01-01 03:00:00") as info:
        load_frame(path)
    assert info.value.field == "OT"
    blank = wide.astype({"OT": object}).assign(OT=lambda d: d["OT"].where(d.index != 3, " "))
    long = wide_to_long(blank)
    assert long["unique_id"].unique().tolist() == ["HUFL", "OT"]  # "note" is a label column
    assert long["y"].isna().sum() == 1


def test_a_bad_date_in_a_wide_file_is_named_by_its_column_not_a_series(tmp_path):
    """The time column is no series' own: its bad cell was reported in "series 'series'"."""
    path = tmp_path / "wide.csv"
    wide = wide_frame().rename(columns={"date": "timestamp"}).astype({"timestamp": object})
    wide.assign(timestamp=lambda d: d["timestamp"].where(d.index != 4, "yesterday")).to_csv(
        path, index=False
    )
    with pytest.raises(
        InvalidTimestampsError, match="^timestamp value 'yesterday'.* row 4"
    ) as info:
        load_frame(path, time_column="timestamp")
    assert (info.value.field, info.value.series_id) == ("timestamp", None)


def test_wide_with_other_time_column():
    wide = wide_frame().rename(columns={"date": "timestamp"})
    long = wide_to_long(wide, time_column="timestamp")
    assert len(long) == 12
    # A flag column (True/False, as a maintenance flag beside the readings) is no series.
    flagged = wide.assign(maintenance=[True, False] * 3)
    pd.testing.assert_frame_equal(wide_to_long(flagged, time_column="timestamp"), long)
    with pytest.raises(MissingColumnsError, match="'date'"):
        wide_to_long(wide)


def test_long_csv_and_parquet_keep_ids_as_text(tmp_path):
    df = pd.DataFrame(
        {
            "unique_id": ["007"] * 3 + ["010"] * 3,
            "ds": list(pd.date_range("2024-01-01", periods=3, freq="D")) * 2,
            "y": np.arange(6, dtype=float),
            "promo": [0, 1, 0, 1, 0, 1],
        }
    )
    df.to_csv(tmp_path / "long.csv", index=False)
    df.to_parquet(tmp_path / "long.parquet")
    for name in ("long.csv", "long.parquet"):
        loaded = load_frame(tmp_path / name)
        assert loaded["unique_id"].tolist() == df["unique_id"].tolist()
        assert loaded["ds"].dtype == "datetime64[ns]"
        assert list(loaded.columns) == ["unique_id", "ds", "y", "promo"]


def test_load_errors_name_the_path(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(EmptyDataError, match="empty.csv"):
        load_frame(empty)
    header_only = tmp_path / "header.csv"
    header_only.write_text("unique_id,ds,y\n")
    with pytest.raises(EmptyDataError, match="header.csv"):
        load_frame(header_only)
    unknown = tmp_path / "data.xlsx"
    unknown.write_text("x")
    with pytest.raises(ForecasterInputError, match="data.xlsx.*unknown file type"):
        load_frame(unknown)
    with pytest.raises(ForecasterInputError, match="no such file"):
        load_frame(tmp_path / "absent.csv")
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"not parquet at all")
    with pytest.raises(ForecasterInputError, match="corrupt.parquet"):
        load_frame(corrupt)
    neither = tmp_path / "neither.csv"
    pd.DataFrame({"when": ["2024-01-01"], "v": [1.0]}).to_csv(neither, index=False)
    with pytest.raises(MissingColumnsError, match="'date'"):
        load_frame(neither)


def test_etth1_loads_as_seven_hourly_series():
    if not ETTH1.is_file():
        pytest.skip(f"{ETTH1} is not present")
    long = load_frame(ETTH1)
    wide = pd.read_csv(ETTH1)
    assert long["unique_id"].unique().tolist() == list(wide.columns[1:])
    assert len(long) == 7 * len(wide)
    ot = long[long["unique_id"] == "OT"]["y"].to_numpy()
    np.testing.assert_array_equal(ot, wide["OT"].to_numpy())
    result = validate_long_frame(long)
    assert (result.freq, result.n_series) == ("h", 7)


def series(n: int, ids=("a", "b")) -> pd.DataFrame:
    return pd.concat(
        [
            pd.DataFrame(
                {
                    "unique_id": sid,
                    "ds": pd.date_range("2024-01-01", periods=n, freq="h"),
                    "y": np.arange(n, dtype=float),
                }
            )
            for sid in ids
        ],
        ignore_index=True,
    )


def test_time_split_is_ordered_and_overlaps_only_by_context():
    df = series(30)
    split = time_split(df, val_length=5, test_length=4, context_length=3)
    for sid in ("a", "b"):
        train = split.train[split.train["unique_id"] == sid]["y"].tolist()
        val = split.val[split.val["unique_id"] == sid]["y"].tolist()
        test = split.test[split.test["unique_id"] == sid]["y"].tolist()
        assert train == list(range(21))
        assert val == list(range(18, 26))  # 3 context points, then 5 of its own
        assert test == list(range(23, 30))  # 3 context points, then 4 of its own
        # Beyond the context, the parts do not overlap and follow each other in time.
        assert max(train) < min(val[3:]) and max(val) < min(test[3:])


def test_time_split_sorts_each_series_in_time_and_keeps_columns():
    df = series(10).assign(promo=1.0).sample(frac=1.0, random_state=0)
    split = time_split(df, val_length=2, test_length=2)
    assert split.train["ds"].groupby(split.train["unique_id"]).is_monotonic_increasing.all()
    assert "promo" in split.test.columns
    assert len(split.train) == 12 and len(split.val) == 4 and len(split.test) == 4


def test_time_split_parts_hold_the_frames_columns_and_a_fresh_index():
    """A part is a frame of the caller's columns: the reordering leaves no `index` column."""
    df = series(10).assign(promo=1.0)
    for frame in (df, df.sample(frac=1.0, random_state=0)):
        split = time_split(frame, val_length=2, test_length=2, context_length=1)
        for part in (split.train, split.val, split.test):
            assert list(part.columns) == list(df.columns)
            pd.testing.assert_index_equal(part.index, pd.RangeIndex(len(part)))


def test_a_split_of_length_zero_is_empty_whatever_the_context():
    df = series(10)
    no_val = time_split(df, val_length=0, test_length=2, context_length=3)
    assert no_val.val.empty and len(no_val.train) == 16 and len(no_val.test) == 10
    no_test = time_split(df, val_length=2, test_length=0, context_length=3)
    assert no_test.test.empty and len(no_test.val) == 10
    # Without a context, validation starts right after training.
    flush = time_split(df, val_length=2, test_length=2)
    assert flush.val.groupby("unique_id")["y"].agg(list).tolist() == [[6.0, 7.0]] * 2


@pytest.mark.parametrize("value", [-1, 1.5, "3", None])
def test_split_lengths_must_be_whole_and_not_negative(value):
    with pytest.raises(InvalidConfigError, match="val_length: expected an int >= 0") as info:
        time_split(series(10), val_length=value, test_length=2)
    assert info.value.field == "val_length"


def test_time_split_too_short_names_series():
    df = pd.concat([series(30, ids=["ok"]), series(8, ids=["tiny"])], ignore_index=True)
    with pytest.raises(SeriesTooShortError) as info:
        time_split(df, val_length=3, test_length=3, context_length=4)
    assert info.value.series_id == "tiny"
    assert "'tiny' has 8 points, expected at least 10" in str(info.value)
    # Exactly enough: the context's length of training points.
    exact = pd.concat([series(30, ids=["ok"]), series(10, ids=["just"])], ignore_index=True)
    split = time_split(exact, val_length=3, test_length=3, context_length=4)
    assert (split.train["unique_id"] == "just").sum() == 4


def test_future_rows_are_each_series_trailing_empty_targets():
    """MLflow's single scoring frame: a series' rows with an empty `y` after its last observed
    value are its known future; an empty `y` before it is a missing value of the history."""
    frame = pd.DataFrame(
        {
            "unique_id": ["a"] * 5 + ["b"] * 3,
            "ds": list(pd.date_range("2024-01-01", periods=5, freq="h"))
            + list(pd.date_range("2024-01-01", periods=3, freq="h")),
            "y": [1.0, np.nan, 3.0, np.nan, np.nan, 1.0, 2.0, np.nan],
            "promo": np.arange(8, dtype=float),
        }
    )
    history, future = split_future_rows(frame, ["promo"])
    assert history["promo"].tolist() == [0.0, 1.0, 2.0, 5.0, 6.0]
    assert future["promo"].tolist() == [3.0, 4.0, 7.0]
    for part in (history, future):
        assert list(part.columns) == list(frame.columns)
        pd.testing.assert_index_equal(part.index, pd.RangeIndex(len(part)))
    # Text targets, as a CSV body gives them: the missing-value spellings are empty too.
    as_text = frame.assign(y=["1", "", "3", "NA", "", "1", "2", "NaN"])
    assert split_future_rows(as_text, ["promo"])[1]["promo"].tolist() == [3.0, 4.0, 7.0]
    # Nothing to split: a model without covariates, no target column, no trailing empty.
    for args in ((frame, []), (frame.drop(columns="y"), ["promo"]), (frame.iloc[:3], ["promo"])):
        got, none = split_future_rows(*args)
        assert none is None and got is args[0]


def test_synthetic_data_is_valid_seeded_and_promo_lifts_y():
    from forecaster.synthetic import generate_synthetic

    df = generate_synthetic(n_series=3, n_steps=24 * 7 * 4, seed=7, with_covariates=True)
    result = validate_long_frame(df, covariates=["promo"], min_length=24 * 7 * 4)
    assert (result.n_series, result.freq) == (3, "h")
    assert set(np.unique(df["promo"])) == {0.0, 1.0}
    pd.testing.assert_frame_equal(
        df, generate_synthetic(3, 24 * 7 * 4, seed=7, with_covariates=True)
    )
    assert not df["y"].equals(generate_synthetic(3, 24 * 7 * 4, seed=8, with_covariates=True)["y"])
    # Same series and hour of the week, with and without promotion: the promo lifts y.
    plain = generate_synthetic(n_series=3, n_steps=24 * 7 * 4, seed=7)
    lift = (df["y"] - plain["y"]).to_numpy()
    assert np.all(lift[df["promo"] == 0] == 0) and np.all(lift[df["promo"] == 1] > 0)
    daily = generate_synthetic(n_series=2, n_steps=60, freq="D")
    assert validate_long_frame(daily).freq == "D"


def test_an_id_that_spells_a_missing_value_is_a_series_in_a_csv(tmp_path):
    """ "NA" (Namibia) and "NaN" are ids; as values they are missing; an empty id is missing."""
    path = tmp_path / "long.csv"
    path.write_text(
        "unique_id,ds,y\n"
        "NA,2024-01-01,1\nNA,2024-01-02,NA\nNA,2024-01-03,3\n"
        "NaN,2024-01-01,4\nNaN,2024-01-02,\nNaN,2024-01-03,n/a\n"
    )
    frame = load_frame(path)
    assert frame["unique_id"].tolist() == ["NA"] * 3 + ["NaN"] * 3
    assert frame["y"].isna().tolist() == [False, True, False, False, True, True]
    path.write_text("unique_id,ds,y\nNA,2024-01-01,1\n,2024-01-02,2\n")
    assert load_frame(path)["unique_id"].isna().tolist() == [False, True]
