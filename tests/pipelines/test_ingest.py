"""Ingest's rules on a frame: which series a run leaves out, and what identifies the data."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest

from forecaster.errors import SeriesTooShortError
from pipelines.ingest import ingest


def _frame(lengths: dict[str, int], gaps: dict[str, int] | None = None) -> pd.DataFrame:
    """Hourly series of the given lengths, all ending at the same hour; `gaps` NaNs out the
    first n values of a series."""
    end = pd.Timestamp("2024-03-01")
    parts = []
    for k, (sid, n) in enumerate(lengths.items()):
        y = np.arange(n, dtype=float) + 10 * k
        y[: (gaps or {}).get(sid, 0)] = np.nan
        ds = pd.date_range(end=end, periods=n, freq="h")
        parts.append(pd.DataFrame({"unique_id": sid, "ds": ds, "y": y}))
    return pd.concat(parts, ignore_index=True)


def test_series_with_fewer_observed_points_than_needed_are_left_out_and_named(caplog):
    """A series of exactly `min_length` observed points is kept; one whose NaNs bring it
    below is left out, though its rows are as many."""
    df = _frame({"a": 30, "b": 20, "c": 25, "d": 19}, gaps={"c": 6})
    with caplog.at_level(logging.WARNING, logger="pipelines.ingest"):
        result = ingest(df, min_length=20, leave_out_short=True, requirement="a split of 20")
    assert result.left_out == ("c", "d")
    assert result.n_series == 2
    assert set(result.frame["unique_id"]) == {"a", "b"}
    assert result.as_params()["data.n_series_left_out"] == 2
    assert result.as_params()["data.n_rows"] == 50
    assert "2 of 4 series have fewer than 20 observed points (a split of 20)" in caplog.text
    assert "'c'" in caplog.text


def test_without_leave_out_short_a_short_series_refuses_the_data_with_the_requirement():
    df = _frame({"a": 30, "b": 19})
    with pytest.raises(SeriesTooShortError, match=r"'b'.*; a split of 20") as raised:
        ingest(df, min_length=20, requirement="a split of 20")
    assert raised.value.series_id == "b"
    assert ingest(df, min_length=19).n_series == 2
    # Without a requirement to name, the core's message stands alone.
    with pytest.raises(SeriesTooShortError) as bare:
        ingest(df, min_length=20)
    assert not str(bare.value).rstrip().endswith(";")
    assert bare.value.series_id == "b"


def test_when_every_series_is_short_the_data_is_refused_as_without_the_option():
    df = _frame({"a": 10, "b": 12})
    with pytest.raises(SeriesTooShortError, match="a split of 20"):
        ingest(df, min_length=20, leave_out_short=True, requirement="a split of 20")


def test_the_fingerprint_changes_with_any_value_and_only_then():
    """Retraining is skipped when the fingerprint is unchanged: the same data read again (or
    with columns the run ignores) gives the same value, one changed value or row does not."""
    df = _frame({"a": 30, "b": 30})
    same = ingest(df).fingerprint
    assert same.startswith("sha256:")
    assert ingest(df.copy()).fingerprint == same
    assert ingest(df.assign(note="x")).fingerprint == same
    changed = df.copy()
    changed.loc[7, "y"] += 1e-9
    assert ingest(changed).fingerprint != same
    assert ingest(df.iloc[:-1]).fingerprint != same
    renamed = df.assign(unique_id=df["unique_id"].replace({"b": "B"}))
    assert ingest(renamed).fingerprint != same
    # The same values under another covariate's name are other data for the model.
    temp = ingest(df.assign(temp=1.0), covariates=("temp",)).fingerprint
    assert ingest(df.assign(price=1.0), covariates=("price",)).fingerprint != temp


def test_the_data_span_is_that_of_the_series_kept():
    """start/end describe what the run trained on: a left-out series that stopped long ago
    does not widen it."""
    df = _frame({"a": 30, "c": 24})
    old = pd.DataFrame(
        {"unique_id": "b", "ds": pd.date_range("2023-01-01", periods=5, freq="h"), "y": 1.0}
    )
    result = ingest(pd.concat([df, old], ignore_index=True), min_length=20, leave_out_short=True)
    assert result.left_out == ("b",)
    assert result.start == pd.Timestamp("2024-03-01") - pd.Timedelta(hours=29)
    assert result.end == pd.Timestamp("2024-03-01")
    assert result.freq == "h" and result.source == "<frame>"
