"""The M1 / M3 / Tourism export: M4's layout, read back by benchmarks.m4 as written."""

import numpy as np

from benchmarks.competition_data import wide_frame
from benchmarks.m4 import read_wide


def test_series_of_any_length_round_trip_through_m4s_layout(tmp_path):
    histories = [np.array([940.66, 1084.86, 1244.98]), np.arange(1.0, 9.0), np.array([5.0, 0.0])]
    path = tmp_path / "M3-Yearly-train.csv"
    wide_frame(["N0001", "N0002", "N0003"], histories).to_csv(path, index=False)
    read = read_wide(path)
    assert list(read) == ["N0001", "N0002", "N0003"]
    for sid, history in zip(read, histories, strict=True):
        np.testing.assert_array_equal(read[sid], history)
