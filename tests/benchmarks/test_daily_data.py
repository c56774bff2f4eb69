"""The daily stand-ins: hourly files summed into whole days, in M4's layout."""

import numpy as np
import pandas as pd
import pytest

from benchmarks.competition_data import wide_frame
from benchmarks.daily_data import etth1_daily, m4_hourly_as_daily, synthetic_daily
from benchmarks.m4 import read_wide


def test_m4_hourly_series_become_means_of_whole_days_counted_back_from_the_end(tmp_path):
    first = np.arange(50.0)  # 2 whole days after 2 leading hours, which are dropped
    second = np.arange(24.0) + 100
    path = tmp_path / "Hourly-train.csv"
    wide_frame(["H1", "H2"], [first, second]).to_csv(path, index=False)
    daily = m4_hourly_as_daily(path)
    out = tmp_path / "daily.csv"
    daily.to_csv(out, index=False)
    read = read_wide(out)
    np.testing.assert_allclose(read["H1"], [first[2:26].mean(), first[26:].mean()])
    np.testing.assert_allclose(read["H2"], [second.mean()])


def test_etth1_keeps_only_days_it_covers_in_full(tmp_path):
    hours = pd.date_range("2016-07-01 05:00", periods=24 * 3, freq="h")
    pd.DataFrame({"date": hours, "OT": np.arange(len(hours), dtype=float)}).to_csv(
        tmp_path / "ETTh1.csv", index=False
    )
    daily = etth1_daily(tmp_path / "ETTh1.csv")
    assert daily.iloc[:, 0].tolist() == ["OT"]
    # 19 hours of the first day, 24 of the next two, 5 of the last: two whole days.
    values = daily.iloc[0, 1:].to_numpy(dtype=float)
    np.testing.assert_allclose(values, [19 + 11.5, 19 + 24 + 11.5])


@pytest.mark.parametrize("shares", [(0.5, 0.25, 0.25), (1, 0, 0)])
def test_synthetic_catalogue_is_seeded_and_positive(shares):
    a, b = synthetic_daily(n_series=20, shares=shares), synthetic_daily(n_series=20, shares=shares)
    pd.testing.assert_frame_equal(a, b)
    values = a.iloc[:, 1:].to_numpy(dtype=float)
    lengths = np.isfinite(values).sum(axis=1)
    assert lengths.min() >= 107 and lengths.max() <= 3000
    assert (values[np.isfinite(values)] > 0).all()  # sMAPE and MASE need positive data
