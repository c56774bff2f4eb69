"""The forecast log: rows as forecast, complete files only, duplicates counted once, retention."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from forecaster.outputs import ForecastArrays, no_glitches
from pipelines import forecast_log
from pipelines.forecast_log import ForecastLog, read_log, read_log_parts, records

ORIGIN = np.datetime64("2024-01-01T23:00", "ns")


def _forecast(ids=("a", "b"), h=3, offset=0.0, levels=(0.1, 0.9)) -> ForecastArrays:
    s = len(ids)
    mean = 10.0 * np.arange(s)[:, None] + np.arange(h)[None, :] + offset  # (S, H)
    spread = {0.1: -1.0, 0.5: 0.0, 0.9: 1.0}
    return ForecastArrays(
        series_ids=np.array(ids, dtype=object),
        origins=np.full(s, ORIGIN),
        timestamps=ORIGIN + np.timedelta64(1, "h") * np.tile(np.arange(1, h + 1), (s, 1)),
        mean=mean,
        quantiles=np.stack([mean + spread[q] for q in levels], axis=-1)
        if levels
        else np.zeros((s, h, 0)),
        levels=tuple(levels),
        glitches=no_glitches(s),
    )


def _rows(version="1", name="m", **kwargs):
    return records(_forecast(**kwargs), model_name=name, model_version=version)


def test_rows_carry_version_origin_step_and_interval():
    frame = _rows(version="3").to_pandas()
    assert len(frame) == 6
    assert set(frame["model_version"].astype(str)) == {"3"}
    assert frame["unique_id"].astype(str).tolist() == ["a"] * 3 + ["b"] * 3
    assert frame["step"].tolist() == [1, 2, 3, 1, 2, 3]
    assert (frame["origin"] == pd.Timestamp("2024-01-01 23:00")).all()
    assert frame["ds"].iloc[0] == pd.Timestamp("2024-01-02 00:00")
    np.testing.assert_array_equal(frame["lower"], frame["mean"] - 1)
    np.testing.assert_array_equal(frame["upper"], frame["mean"] + 1)
    np.testing.assert_allclose(frame["level"], 0.8)


def test_without_two_quantiles_the_interval_is_missing():
    frame = _rows(levels=(0.5,)).to_pandas()
    assert frame["lower"].isna().all() and frame["level"].isna().all()


def test_flushed_files_read_back_and_repeated_forecasts_count_once(tmp_path):
    log = ForecastLog(tmp_path / "log")
    log.append(_rows())
    log.flush()
    # The same forecast asked again later (with a different answer, say after a reload).
    log.append(_rows(offset=0.5))
    log.append(_rows(name="other"))
    assert log.flush() is not None
    assert log.flush() is None  # nothing buffered
    files = sorted(p.name for p in (tmp_path / "log").iterdir())
    assert len(files) == 2 and all(f.startswith("part-") and f.endswith(".parquet") for f in files)
    frame = read_log(tmp_path / "log", model_name="m")
    assert len(frame) == 6
    np.testing.assert_allclose(frame["mean"], _forecast(offset=0.5).mean.reshape(-1))
    assert frame["unique_id"].tolist() == ["a"] * 3 + ["b"] * 3


def test_buffer_flushes_when_full_and_drops_past_its_bound(tmp_path):
    log = ForecastLog(tmp_path / "log", flush_rows=6, max_buffer_rows=6)
    log.append(_rows())  # 6 rows: full, flushed
    assert len(list((tmp_path / "log").glob("part-*"))) == 1
    log.flush_rows = 100
    log.append(_rows())
    log.append(_rows())  # 12 buffered would pass the bound of 6
    assert log.dropped_rows == 6


def test_unwritable_directory_keeps_the_rows_for_the_next_flush(tmp_path):
    blocker = tmp_path / "log"
    blocker.write_text("a file where the directory should be")
    log = ForecastLog(blocker)
    log.append(_rows())
    with pytest.raises(OSError):
        log.flush()
    blocker.unlink()
    assert log.flush() is not None
    assert len(read_log(blocker)) == 6


def test_old_files_are_pruned_and_junk_files_skipped(tmp_path, monkeypatch):
    # A machine booted seconds ago, where "pruned at monotonic 0" would read as just pruned.
    monkeypatch.setattr(forecast_log.time, "monotonic", lambda: 5.0)
    directory = tmp_path / "log"
    log = ForecastLog(directory, retention_days=1)
    log.append(_rows())
    old = log.flush()
    two_days_ago = time.time() - 2 * 86400
    os.utime(old, (two_days_ago, two_days_ago))
    (directory / "part-junk.parquet").write_text("not parquet")
    # A writer killed between writing and renaming leaves its temporary file behind.
    orphan = directory / f".{old.name}.tmp"
    orphan.write_text("half a file")
    os.utime(orphan, (two_days_ago, two_days_ago))
    later = ForecastLog(directory, retention_days=1)  # e.g. the next run, or a restart
    later.append(_rows(version="2"))
    later.flush()  # a writer's first flush prunes
    assert not old.exists() and not orphan.exists()
    frame = read_log(directory)
    assert set(frame["model_version"]) == {"2"}


def test_each_row_carries_its_own_series_origin_and_timestamp():
    """Series forecast from different origins: a row with another series' origin, or the
    timestamps of the steps in another order, is joined to the wrong actual."""
    origins = ORIGIN + np.timedelta64(1, "h") * np.array([0, 5])
    steps = np.arange(1, 4)
    forecast = ForecastArrays(
        series_ids=np.array(["a", "b"], dtype=object),
        origins=origins,
        timestamps=origins[:, None] + np.timedelta64(1, "h") * steps[None, :],
        mean=np.zeros((2, 3)),
        quantiles=np.zeros((2, 3, 0)),
        levels=(),
        glitches=no_glitches(2),
    )
    frame = records(forecast, model_name="m", model_version="1").to_pandas()
    by_id = {"a": pd.Timestamp(origins[0]), "b": pd.Timestamp(origins[1])}
    assert frame["origin"].tolist() == [by_id[u] for u in frame["unique_id"].astype(str)]
    expected = frame["origin"] + pd.to_timedelta(frame["step"], unit="h")
    assert (frame["ds"] == expected).all()


def _logged_at(table, when: str):
    at = table.schema.get_field_index("logged_at")
    stamps = pa.array([pd.Timestamp(when, tz="UTC")] * table.num_rows, table.schema[at].type)
    return table.set_column(at, "logged_at", stamps)


def test_the_latest_logged_row_of_a_forecast_wins_and_rows_come_in_order(tmp_path):
    """Which repeat counts is decided by when it was logged, not by the file it landed in
    (a batch job hands its staged rows over after the service logged later ones); on a tie
    the one written last wins. Rows come by version, series, origin and step, as text."""
    log = ForecastLog(tmp_path / "log")
    log.append(_logged_at(_rows(version="9", ids=("b", "a"), offset=2.0), "2024-01-02 10:00"))
    log.flush()
    log.append(_logged_at(_rows(version="9", ids=("b", "a"), offset=1.0), "2024-01-02 09:00"))
    log.append(_logged_at(_rows(version="10", offset=1.0), "2024-01-02 09:00"))
    log.flush()
    log.append(_logged_at(_rows(version="10", offset=3.0), "2024-01-02 09:00"))
    log.flush()
    frame = read_log(tmp_path / "log")
    assert frame["model_version"].tolist() == ["10"] * 6 + ["9"] * 6
    assert frame["unique_id"].tolist() == (["a"] * 3 + ["b"] * 3) * 2
    assert frame["step"].tolist() == [1, 2, 3] * 4
    latest_9 = _forecast(ids=("b", "a"), offset=2.0).mean[::-1].reshape(-1)  # a first
    expected = np.concatenate([_forecast(offset=3.0).mean.reshape(-1), latest_9])
    np.testing.assert_allclose(frame["mean"], expected)


def _reference_read(directory) -> pd.DataFrame:
    """read_log's contract in plain pandas: the latest logged of each forecast (the last
    written on a tie), by version, series, origin, step and model name."""
    files = sorted(Path(directory).glob("part-*.parquet"))
    frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    text = ["model_name", "model_version", "unique_id"]
    frame = frame.astype({c: "str" for c in text})
    key = ["model_version", "unique_id", "origin", "step", "model_name"]
    frame = frame.sort_values("logged_at", kind="stable").drop_duplicates(key, keep="last")
    return frame.sort_values(key, kind="stable").reset_index(drop=True)


def _write_many_repeats(directory: Path) -> None:
    """Many files, each with its own dictionary order, with forecasts repeated within and
    across them and logging times that tie."""
    rng = np.random.default_rng(0)
    log = ForecastLog(directory, retention_days=None)
    for file in range(6):
        n = int(rng.integers(1, 400))
        table = _rows()
        columns = {
            "model_name": (["m", "other"], 2),
            "model_version": (["9", "10", "2"], 3),
            "unique_id": (["x", "é", "Z", "y1"][:: 1 if file % 2 else -1], 4),
        }
        data = {
            name: pa.DictionaryArray.from_arrays(
                pa.array(rng.integers(0, k, n).astype(np.int32)), pa.array(values)
            )
            for name, (values, k) in columns.items()
        }
        hours = rng.integers(0, 3, n).astype("timedelta64[h]")
        data["origin"] = pa.array((ORIGIN + hours).astype("datetime64[ns]"))
        data["step"] = pa.array(rng.integers(1, 4, n).astype(np.int32))
        data["ds"] = pa.array((ORIGIN + hours + np.timedelta64(1, "h")).astype("datetime64[ns]"))
        for name in ("mean", "lower", "upper"):
            data[name] = pa.array(rng.random(n))
        data["level"] = pa.array(np.full(n, 0.8))
        millis = rng.integers(0, 3, n).astype("timedelta64[ms]")
        data["logged_at"] = pa.array(
            np.datetime64("2024-01-02T00:00:00.000") + millis, table.schema.field("logged_at").type
        )
        log.append(pa.table(data, schema=table.schema))
        log.flush()


def test_read_log_equals_its_definition_on_a_log_of_many_repeats(tmp_path):
    _write_many_repeats(tmp_path / "log")
    expected = _reference_read(tmp_path / "log")
    assert 100 < len(expected) < 6 * 200  # repeats were dropped
    pd.testing.assert_frame_equal(read_log(tmp_path / "log"), expected)
    only_m = expected[expected["model_name"] == "m"].reset_index(drop=True)
    pd.testing.assert_frame_equal(read_log(tmp_path / "log", model_name="m"), only_m)


@pytest.mark.parametrize("max_rows", [1, 150, 10_000])
def test_the_log_read_in_parts_is_the_log_read_whole_series_by_series(tmp_path, max_rows):
    """Monitoring reads the log part by part to hold one part in memory: together the parts
    are the log (the same rows, repeats dropped the same way), a series is never split
    between parts, and the files parts were sorted into are gone once they are read."""
    _write_many_repeats(tmp_path / "log")
    spill = tmp_path / "spill"
    spill.mkdir()
    parts, left = [], []
    for part in read_log_parts(tmp_path / "log", max_rows=max_rows, spill_dir=spill):
        parts.append(part.decoded())
        left.append(len([*spill.glob("*/*.arrow")]))  # a part's file goes once it is read
    assert len(parts) == {1: 4, 150: 4, 10_000: 1}[max_rows]  # 4 series, about 700 rows
    whole = read_log(tmp_path / "log")
    key = ["model_version", "unique_id", "origin", "step", "model_name"]
    together = pd.concat(parts, ignore_index=True).sort_values(key, kind="stable")
    pd.testing.assert_frame_equal(together.reset_index(drop=True), whole)
    ids = [set(part["unique_id"]) for part in parts]
    assert sum(map(len, ids)) == len(set().union(*ids))
    assert left == ([3, 2, 1, 0] if len(parts) > 1 else [0])
    assert not any(spill.iterdir())


def test_a_log_with_no_rows_of_the_model_reads_as_no_part(tmp_path):
    log = ForecastLog(tmp_path / "log")
    log.append(_rows())
    log.flush()
    assert list(read_log_parts(tmp_path / "log", model_name="another", max_rows=1)) == []
    assert read_log(tmp_path / "log", model_name="another").empty


def test_forecasts_of_other_versions_or_origins_are_not_duplicates(tmp_path):
    """Only the same forecast logged twice counts once: two versions forecasting the same
    steps, and one version forecasting again from a later origin, are all kept."""
    log = ForecastLog(tmp_path / "log")
    log.append(_rows(version="1"))
    log.append(_rows(version="2"))
    later = _forecast()
    later.origins[:] += np.timedelta64(1, "h")
    later.timestamps[:] += np.timedelta64(1, "h")
    log.append(records(later, model_name="m", model_version="1"))
    log.flush()
    frame = read_log(tmp_path / "log")
    assert len(frame) == 18
    assert frame.groupby("model_version").size().to_dict() == {"1": 12, "2": 6}
    assert frame.loc[frame["model_version"] == "1", "origin"].nunique() == 2


def test_a_failed_write_leaves_nothing_in_the_directory(tmp_path, monkeypatch):
    """A write that fails halfway (a full disk) must leave no half file where readers look,
    and no temporary file behind; the rows are written by the next flush, and only then
    counted as written."""
    directory = tmp_path / "log"
    log = ForecastLog(directory, retention_days=None)
    real_write = forecast_log.pq.write_table

    def half_then_fail(table, where, **kwargs):
        Path(where).write_bytes(b"PAR1 half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(forecast_log.pq, "write_table", half_then_fail)
    log.append(_rows())
    with pytest.raises(OSError):
        log.flush()
    assert list(directory.iterdir()) == []
    assert (log.buffered_rows, log.written_rows) == (6, 0)
    monkeypatch.setattr(forecast_log.pq, "write_table", real_write)
    path = log.flush()
    assert [p.name for p in directory.iterdir()] == [path.name]
    assert log.written_rows == 6 and len(read_log(directory)) == 6


def test_prune_keeps_files_younger_than_the_retention(tmp_path):
    directory = tmp_path / "log"
    log = ForecastLog(directory, retention_days=None)
    ages = {}
    for days in (0.5, 1.5):
        log.append(_rows())
        path = log.flush()
        stamp = time.time() - days * 86400
        os.utime(path, (stamp, stamp))
        ages[days] = path
    assert forecast_log.prune(directory, retention_days=1) == 1
    assert ages[0.5].exists() and not ages[1.5].exists()
