"""Regrouping row batches into chunks of whole series, as file scoring and batch jobs read."""

from __future__ import annotations

import pandas as pd
import pytest

from forecaster.errors import SeriesNotContiguousError
from pipelines.series_chunks import whole_series_chunks


def long_frame(ids: list[str], rows_each: int = 5) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "unique_id": [sid for sid in ids for _ in range(rows_each)],
            "ds": [f"2024-01-01 {h:02d}:00" for _ in ids for h in range(rows_each)],
            "y": range(len(ids) * rows_each),
        }
    )


def batches(frame: pd.DataFrame, *cuts: int) -> list[pd.DataFrame]:
    """The frame cut at the row offsets `cuts`."""
    bounds = [0, *cuts, len(frame)]
    return [frame.iloc[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def test_chunks_hold_whole_series_and_are_the_same_on_every_pass():
    frame = long_frame([f"s{i}" for i in range(7)])
    cuts = range(4, len(frame), 4)  # batches of 4 rows cut series of 5
    first = list(whole_series_chunks(batches(frame, *cuts), chunk_series=3))
    assert [c["unique_id"].unique().tolist() for c in first] == [
        ["s0", "s1", "s2"],
        ["s3", "s4", "s5"],
        ["s6"],
    ]
    assert pd.concat(first, ignore_index=True).equals(frame)
    again = list(whole_series_chunks(batches(frame, *cuts), chunk_series=3))
    assert all(a.equals(b) for a, b in zip(first, again, strict=True))


@pytest.mark.parametrize(
    ("ids", "cuts"),
    [
        (["a", "b", "c", "a"], [5, 10, 15]),  # back in a later batch
        (["a", "b", "a", "c"], []),  # back within one batch
        (["x", "a", "b", "a"], [7]),  # runs on into the next batch, then comes back in it
    ],
)
def test_a_series_whose_rows_resume_after_others_is_named(ids, cuts):
    chunks = whole_series_chunks(batches(long_frame(ids), *cuts), chunk_series=100)
    with pytest.raises(SeriesNotContiguousError, match="series 'a': .*not contiguous") as e:
        list(chunks)
    assert (e.value.series_id, e.value.field) == ("a", "unique_id")
