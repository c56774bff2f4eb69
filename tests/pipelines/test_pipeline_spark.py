"""Batch scoring on a real local Spark (``local[2]``): the rows the local predict writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster.synthetic import generate_synthetic
from pipelines.cli import main
from pipelines.predict import predict_file
from pipelines.registry import download_forecaster, resolve_model
from pipelines.spark import _replaced_on_success, forecast_spark, predict_spark, spark_session
from tests.forecaster.conftest import TINY_MODEL, TINY_TRAIN
from tests.pipelines.pipeline_helpers import synthetic

# Starting the JVM and the Python workers (torch, mlflow) takes seconds.
pytestmark = pytest.mark.slow

CHAMPION = "models:/forecaster@champion"


@pytest.fixture(scope="session")
def spark():
    session = spark_session("local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def tracking_uri(champion_store) -> str:
    root, _ = champion_store
    return f"sqlite:///{root / 'mlflow.db'}"


@pytest.fixture(scope="module")
def history() -> pd.DataFrame:
    """Series of different lengths: one of 6 points, one with a NaN inside its history."""
    frame = synthetic(seed=3, n_series=5, n_steps=24 * 4)
    short = (frame["unique_id"] == "series_001") & (frame.groupby("unique_id").cumcount() < 90)
    frame = frame[~short].reset_index(drop=True)
    gap = frame.index[(frame["unique_id"] == "series_002")][40]
    frame.loc[gap, "y"] = np.nan
    glitch = frame.index[(frame["unique_id"] == "series_003")][-10]
    frame.loc[glitch, "y"] = 10 * frame["y"].abs().max()
    return frame


def _rows(frame: pd.DataFrame) -> pd.DataFrame:
    """A forecast as a set of rows: sorted, plain dtypes, so two engines' outputs compare."""
    if getattr(frame["ds"].dtype, "tz", None) is not None:  # aware: compare the instants
        frame = frame.assign(ds=frame["ds"].dt.tz_convert("UTC").dt.tz_localize(None))
    frame = frame.astype({"unique_id": str, "ds": "datetime64[ns]"})
    return frame.sort_values(["unique_id", "ds"]).reset_index(drop=True)


def _assert_same_rows(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    got, expected = _rows(got), _rows(expected)
    assert list(got.columns) == list(expected.columns)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False, rtol=1e-5, atol=1e-6)


def test_library_forecasts_equal_the_local_predict(
    spark, champion_store, tracking_uri, history, tmp_path
):
    model_dir = download_forecaster(
        resolve_model(CHAMPION, tracking_uri=tracking_uri),
        tmp_path / "model",
        tracking_uri=tracking_uri,
    )
    history.to_csv(tmp_path / "in.csv", index=False)
    predict_file(str(model_dir), tmp_path / "in.csv", tmp_path / "local.parquet", progress=False)
    # Rows in any order (a DataFrame keeps none); three buckets for five series, so several
    # series share one pandas call and the calls differ.
    shuffled = spark.createDataFrame(history.sample(frac=1.0, random_state=0))
    forecasts = forecast_spark(shuffled, str(model_dir), buckets=3)
    assert forecasts.schema["ds"].dataType.typeName() == "timestamp_ntz"
    got = forecasts.toPandas()
    assert set(got["unique_id"]) == set(history["unique_id"])  # the short and gappy too
    _assert_same_rows(got, pd.read_parquet(tmp_path / "local.parquet"))


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_cli_spark_engine_with_the_registered_champion(
    spark, tracking_uri, history, tmp_path, capsys, suffix
):
    source = tmp_path / f"in{suffix}"
    if suffix == ".parquet":
        history.to_parquet(source)  # nanosecond timestamps, which Spark reads through a fallback
    else:
        history.to_csv(source, index=False, na_rep="NaN")  # text that read_csv takes as missing
    common = ["predict", "--tracking-uri", tracking_uri, "--model", CHAMPION]
    common += ["--input", str(source), "--horizon", "5", "--quantiles", "0.1,0.9"]
    out = tmp_path / "forecasts"
    spark_glitches, local_glitches = tmp_path / f"g_spark{suffix}", tmp_path / f"g_local{suffix}"
    spark_args = ["--engine", "spark", "--master", "local[2]", "--output", str(out)]
    assert main([*common, *spark_args, "--glitches", str(spark_glitches)]) == 0
    printed = capsys.readouterr().out
    assert "wrote 25 forecast rows for 5 series with forecaster v1" in printed
    assert "1 readings of 1 series were read as glitches" in printed
    assert list(out.glob("part-*.parquet")), "Spark's layout: a directory of part files"
    local_args = ["--output", str(tmp_path / "local.parquet"), "--no-progress"]
    assert main([*common, *local_args, "--glitches", str(local_glitches)]) == 0
    local = pd.read_parquet(tmp_path / "local.parquet")
    assert list(local.columns) == ["unique_id", "ds", "mean", "q0.1", "q0.9"]
    _assert_same_rows(pd.read_parquet(out), local)
    read = pd.read_parquet if suffix == ".parquet" else pd.read_csv
    listed = read(spark_glitches)
    pd.testing.assert_frame_equal(listed, read(local_glitches))
    assert listed["unique_id"].tolist() == ["series_003"]


def test_cli_spark_engine_names_bad_input(spark, tracking_uri, history, tmp_path, capsys):
    args = ["predict", "--engine", "spark", "--tracking-uri", tracking_uri, "--model", CHAMPION]
    args += ["--output", str(tmp_path / "out")]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "earlier.parquet").touch()  # a failed run must leave it as it was
    history.drop(columns="y").to_csv(tmp_path / "no_y.csv", index=False)
    assert main([*args, "--input", str(tmp_path / "no_y.csv")]) == 2
    assert "missing columns ['y']" in capsys.readouterr().err
    # Found by a Python worker, reported as the local path reports it.
    bad = history.astype({"y": object})
    bad.loc[bad.index[-1], "y"] = "abc"
    bad.to_csv(tmp_path / "bad.csv", index=False)
    assert main([*args, "--input", str(tmp_path / "bad.csv")]) == 2
    assert "series 'series_004': column 'y' holds 'abc'" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["earlier.parquet"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "no_y.csv", "out"]


def test_the_previous_output_is_kept_until_the_new_one_is_in_place(tmp_path):
    """The last step of a Spark run moves its output into place; when that move fails (here
    the job wrote nothing), the previous output is still there."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "earlier.parquet").write_text("kept")
    with pytest.raises(FileNotFoundError), _replaced_on_success(str(out)):
        pass
    assert (out / "earlier.parquet").read_text() == "kept"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    with _replaced_on_success(str(out)) as written:
        Path(written).mkdir()
        (Path(written) / "part-0.parquet").write_text("new")
    assert [p.name for p in out.iterdir()] == ["part-0.parquet"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize("freq", ["D", "h"])
def test_aware_parquet_is_read_and_written_as_the_local_path_does(spark, tmp_path, freq):
    """Spark reads an aware column as instants; a daily model reads local dates on both paths
    (the history spans the March daylight-saving change, off the daily grid in UTC), an
    hourly one UTC times, and both engines write the same instants."""
    naive = generate_synthetic(n_series=2, n_steps=100, freq=freq, start="2024-03-20", seed=0)
    train = TrainConfig(**{**TINY_TRAIN, "max_epochs": 1})
    model = Forecaster(ModelConfig(**TINY_MODEL), train)
    model.fit(naive).save(tmp_path / "model")
    aware = naive.assign(ds=naive["ds"].dt.tz_localize("Europe/Berlin"))
    aware.to_parquet(tmp_path / "in.parquet", index=False)
    predict_file(str(tmp_path / "model"), tmp_path / "in.parquet", tmp_path / "local.parquet")
    predict_spark(str(tmp_path / "model"), str(tmp_path / "in.parquet"), str(tmp_path / "out"))
    local = pd.read_parquet(tmp_path / "local.parquet")
    assert str(local["ds"].dt.tz) == "Europe/Berlin"
    if freq == "D":
        assert (local["ds"].dt.hour == 0).all()
    _assert_same_rows(pd.read_parquet(tmp_path / "out"), local)


def test_integer_steps_are_forecast_as_the_local_path_does(spark, tmp_path):
    """Steps in, steps out: from a DataFrame, and from a CSV (text) through the CLI."""
    t = np.arange(150)
    frame = pd.concat(
        [
            pd.DataFrame({"unique_id": sid, "ds": 3 * t, "y": k + np.sin(t / 3.0)})
            for k, sid in enumerate(["a", "b"])
        ],
        ignore_index=True,
    )
    frame.loc[140, "y"] = 50.0  # a glitch in the context, listed as the step it was read at
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**{**TINY_TRAIN, "max_epochs": 1}))
    model.fit(frame).save(tmp_path / "model")
    expected = model.predict(frame)
    rows = spark.createDataFrame(frame.astype({"unique_id": object}))  # Arrow: no "str" column
    forecasts = forecast_spark(rows, str(tmp_path / "model"), buckets=2)
    assert forecasts.schema["ds"].dataType.typeName() == "long"
    got = forecasts.toPandas().sort_values(["unique_id", "ds"], ignore_index=True)
    assert got["ds"].tolist() == expected["ds"].tolist()
    np.testing.assert_allclose(got["mean"], expected["mean"], rtol=1e-5, atol=1e-6)

    frame.to_csv(tmp_path / "in.csv", index=False)
    summary = predict_spark(
        str(tmp_path / "model"),
        str(tmp_path / "in.csv"),
        str(tmp_path / "out"),
        glitches_output=str(tmp_path / "glitches.csv"),
    )
    assert summary.n_series == 2
    written = pd.read_parquet(tmp_path / "out").sort_values(["unique_id", "ds"], ignore_index=True)
    assert written["ds"].tolist() == expected["ds"].tolist()
    assert pd.read_csv(tmp_path / "glitches.csv").to_dict("records") == [
        {"unique_id": "a", "ds": 420}
    ]
