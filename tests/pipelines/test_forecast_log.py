"""The forecast log: rows as forecast, complete files only, duplicates counted once, retention."""

from __future__ import annotations

import os
import time

import numpy as np
import pandas as pd
import pytest

from forecaster.outputs import ForecastArrays
from pipelines.forecast_log import ForecastLog, read_log, records, records_from_frames


def _forecast(ids=("a", "b"), h=3, start="2024-01-02 00:00", offset=0.0) -> pd.DataFrame:
    rows = []
    for k, sid in enumerate(ids):
        for step, ds in enumerate(pd.date_range(start, periods=h, freq="h")):
            value = 10.0 * k + step + offset
            rows.append((sid, ds, value, value - 1, value + 1))
    return pd.DataFrame(rows, columns=["unique_id", "ds", "mean", "q0.1", "q0.9"])


def _history(ids=("a", "b"), end="2024-01-01 23:00", n=5) -> pd.DataFrame:
    ds = pd.date_range(end=end, periods=n, freq="h")
    return pd.DataFrame(
        {
            "unique_id": np.repeat(ids, n),
            "ds": np.tile(ds.astype(str), len(ids)),  # as text, as a CSV gives it
            "y": 1.0,
        }
    )


def test_rows_carry_version_origin_step_and_interval():
    table = records_from_frames(_forecast(), _history(), model_name="forecaster", model_version="3")
    frame = table.to_pandas()
    assert len(frame) == 6
    assert set(frame["model_version"]) == {"3"}
    assert frame["step"].tolist() == [1, 2, 3, 1, 2, 3]
    assert (frame["origin"] == pd.Timestamp("2024-01-01 23:00")).all()
    np.testing.assert_array_equal(frame["lower"], frame["mean"] - 1)
    np.testing.assert_array_equal(frame["upper"], frame["mean"] + 1)
    np.testing.assert_allclose(frame["level"], 0.8)


def test_future_covariate_rows_do_not_move_the_origin():
    history = pd.concat(
        [_history(ids=("a",)), _history(ids=("a",), end="2024-01-02 02:00", n=3)],
        ignore_index=True,
    )
    table = records_from_frames(
        _forecast(ids=("a",)), history, model_name="forecaster", model_version="1"
    )
    assert (table.to_pandas()["origin"] == pd.Timestamp("2024-01-01 23:00")).all()


def test_without_two_quantiles_the_interval_is_missing():
    forecast = _forecast().drop(columns=["q0.1"])
    frame = records_from_frames(forecast, _history(), model_name="m", model_version="1").to_pandas()
    assert frame["lower"].isna().all() and frame["level"].isna().all()


def test_flushed_files_read_back_and_repeated_forecasts_count_once(tmp_path):
    log = ForecastLog(tmp_path / "log")
    first = records_from_frames(_forecast(), _history(), model_name="m", model_version="1")
    log.append(first)
    log.flush()
    # The same forecast asked again later (with a different answer, say after a reload).
    again = records_from_frames(
        _forecast(offset=0.5), _history(), model_name="m", model_version="1"
    )
    log.append(again)
    log.append(records_from_frames(_forecast(), _history(), model_name="other", model_version="1"))
    assert log.flush() is not None
    assert log.flush() is None  # nothing buffered
    files = sorted(p.name for p in (tmp_path / "log").iterdir())
    assert len(files) == 2 and all(f.startswith("part-") and f.endswith(".parquet") for f in files)
    frame = read_log(tmp_path / "log", model_name="m")
    assert len(frame) == 6
    np.testing.assert_allclose(frame["mean"], _forecast(offset=0.5)["mean"])


def test_buffer_flushes_when_full_and_drops_past_its_bound(tmp_path):
    log = ForecastLog(tmp_path / "log", flush_rows=6, max_buffer_rows=6)
    rows = records_from_frames(_forecast(), _history(), model_name="m", model_version="1")
    log.append(rows)  # 6 rows: full, flushed
    assert len(list((tmp_path / "log").glob("part-*"))) == 1
    log.flush_rows = 100
    log.append(rows)
    log.append(rows)  # 12 buffered would pass the bound of 6
    assert log.dropped_rows == 6


def test_unwritable_directory_keeps_the_rows_for_the_next_flush(tmp_path):
    blocker = tmp_path / "log"
    blocker.write_text("a file where the directory should be")
    log = ForecastLog(blocker)
    log.append(records_from_frames(_forecast(), _history(), model_name="m", model_version="1"))
    with pytest.raises(OSError):
        log.flush()
    blocker.unlink()
    assert log.flush() is not None
    assert len(read_log(blocker)) == 6


def test_old_files_are_pruned_and_junk_files_skipped(tmp_path):
    directory = tmp_path / "log"
    log = ForecastLog(directory, retention_days=1)
    log.append(records_from_frames(_forecast(), _history(), model_name="m", model_version="1"))
    old = log.flush()
    two_days_ago = time.time() - 2 * 86400
    os.utime(old, (two_days_ago, two_days_ago))
    (directory / "part-junk.parquet").write_text("not parquet")
    later = ForecastLog(directory, retention_days=1)  # e.g. the next run, or a restart
    later.append(records_from_frames(_forecast(), _history(), model_name="m", model_version="2"))
    later.flush()  # a writer's first flush prunes
    assert not old.exists()
    frame = read_log(directory)
    assert set(frame["model_version"]) == {"2"}


def test_records_from_arrays_match_the_frame_form():
    forecast, history = _forecast(), _history()
    arrays = ForecastArrays(
        series_ids=np.array(["a", "b"], dtype=object),
        origins=np.array(["2024-01-01T23:00", "2024-01-01T23:00"], dtype="datetime64[ns]"),
        timestamps=forecast["ds"].to_numpy().reshape(2, 3),
        mean=forecast["mean"].to_numpy().reshape(2, 3),
        quantiles=np.stack(
            [forecast["q0.1"].to_numpy().reshape(2, 3), forecast["q0.9"].to_numpy().reshape(2, 3)],
            axis=-1,
        ),
        levels=(0.1, 0.9),
    )
    table = records(arrays, model_name="m", model_version="1")
    expected = records_from_frames(forecast, history, model_name="m", model_version="1")
    pd.testing.assert_frame_equal(
        table.to_pandas().drop(columns="logged_at"), expected.to_pandas().drop(columns="logged_at")
    )
