"""ForecastArrays: the arrays `Forecaster.forecast` returns and the tables built from them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from forecaster.outputs import ForecastArrays, no_glitches

H = 3


def _arrays(ids=("a", "b"), glitches=None) -> ForecastArrays:
    """S series of H steps; series k's mean at step j is 10 k + j, its quantile q is the mean
    plus 100 q."""
    s = len(ids)
    origins = np.datetime64("2024-01-01T00", "ns") + np.timedelta64(1, "D") * np.arange(s)
    timestamps = origins[:, None] + np.timedelta64(1, "h") * np.arange(1, H + 1)[None, :]
    mean = 10.0 * np.arange(s)[:, None] + np.arange(H)[None, :]
    levels = (0.1, 0.5, 0.9)
    quantiles = mean[:, :, None] + 100 * np.array(levels)[None, None, :]
    if glitches is None:
        glitches = [np.empty(0, dtype="datetime64[ns]")] * s
    glitch_column = np.empty(s, dtype=object)
    for k, g in enumerate(glitches):
        glitch_column[k] = np.asarray(g, dtype="datetime64[ns]")
    return ForecastArrays(
        np.array(ids, dtype=object), origins, timestamps, mean, quantiles, levels, glitch_column
    )


def test_the_long_frame_lists_each_series_steps_in_order_with_one_column_per_level():
    frame = _arrays().to_frame()
    assert list(frame.columns) == ["unique_id", "ds", "mean", "q0.1", "q0.5", "q0.9"]
    assert frame["unique_id"].tolist() == ["a"] * H + ["b"] * H
    assert frame["mean"].tolist() == [0, 1, 2, 10, 11, 12]
    np.testing.assert_allclose(frame["q0.9"], frame["mean"] + 90)
    np.testing.assert_allclose(frame["q0.1"], frame["mean"] + 10)
    b = frame[frame["unique_id"] == "b"]
    assert b["ds"].tolist() == list(pd.date_range("2024-01-02 01:00", periods=H, freq="h"))


def test_the_arrow_table_is_the_long_frame():
    """File writers take the Arrow table, the API the frame: both must say the same."""
    arrays = _arrays(ids=("b", "a", "c"))
    table = arrays.to_arrow().to_pandas()
    frame = arrays.to_frame()
    assert list(table.columns) == list(frame.columns)
    assert table["unique_id"].tolist() == frame["unique_id"].tolist()
    pd.testing.assert_frame_equal(
        table.drop(columns="unique_id"), frame.drop(columns="unique_id"), check_dtype=False
    )


def test_select_keeps_the_first_steps_and_the_asked_levels_in_the_asked_order():
    picked = _arrays().select(2, [0.9, 0.1])
    assert picked.levels == (0.9, 0.1)
    assert picked.mean.shape == (2, 2) and picked.timestamps.shape == (2, 2)
    np.testing.assert_allclose(picked.quantiles[..., 0], picked.mean + 90)
    np.testing.assert_allclose(picked.quantiles[..., 1], picked.mean + 10)
    assert list(picked.to_frame().columns) == ["unique_id", "ds", "mean", "q0.9", "q0.1"]
    with pytest.raises(ValueError):
        _arrays().select(2, [0.25])  # not a level the model forecasts


def test_rows_and_concat_keep_every_field_of_a_series_together():
    arrays = _arrays(ids=("a", "b", "c"), glitches=[[], ["2023-12-31T20"], []])
    parts = [arrays.rows(np.array([2, 0])), arrays.rows(slice(1, 2))]
    joined = ForecastArrays.concat(parts)
    order = [2, 0, 1]
    assert joined.series_ids.tolist() == ["c", "a", "b"]
    np.testing.assert_array_equal(joined.origins, arrays.origins[order])
    np.testing.assert_array_equal(joined.timestamps, arrays.timestamps[order])
    np.testing.assert_array_equal(joined.mean, arrays.mean[order])
    np.testing.assert_array_equal(joined.quantiles, arrays.quantiles[order])
    assert [len(g) for g in joined.glitches] == [0, 0, 1]
    assert len(joined) == 3 and joined.levels == arrays.levels
    assert ForecastArrays.concat([arrays]) is arrays


def test_the_glitch_frame_has_one_row_per_glitch_under_its_series():
    arrays = _arrays(
        ids=("a", "b", "c"),
        glitches=[["2023-12-31T20", "2023-12-31T22"], [], ["2024-01-02T05"]],
    )
    frame = arrays.glitch_frame()
    assert frame["unique_id"].tolist() == ["a", "a", "c"]
    assert frame["ds"].tolist() == [
        pd.Timestamp("2023-12-31 20:00"),
        pd.Timestamp("2023-12-31 22:00"),
        pd.Timestamp("2024-01-02 05:00"),
    ]
    empty = _arrays().glitch_frame()
    assert len(empty) == 0 and list(empty.columns) == ["unique_id", "ds"]
    assert empty["ds"].dtype == "datetime64[ns]"


def test_the_arrow_table_keeps_the_frames_column_types():
    """Files written from the table are read back next to frames from `to_frame`: timestamps
    stay in nanoseconds (as `ds` everywhere else), ids text, values float64."""
    arrays = _arrays()
    table = arrays.to_arrow()
    assert table.schema.field("ds").type == pa.timestamp("ns")
    assert table.schema.field("unique_id").type == pa.string()
    assert all(table.schema.field(c).type == pa.float64() for c in ["mean", "q0.1", "q0.9"])
    assert table.to_pandas()["ds"].dtype == arrays.to_frame()["ds"].dtype


def test_no_glitches_gives_every_series_an_empty_list_of_timestamps():
    glitches = no_glitches(3)
    assert glitches.shape == (3,)
    assert all(g.dtype == "datetime64[ns]" and len(g) == 0 for g in glitches)
    frame = replace(_arrays(ids=("a", "b", "c")), glitches=glitches).glitch_frame()
    assert len(frame) == 0 and frame["ds"].dtype == "datetime64[ns]"
