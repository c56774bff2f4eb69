"""Batch scoring of files: streamed in chunks, same forecasts as one predict call, atomic output."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest

import pipelines.predict as predict_module
from forecaster import Forecaster, ModelConfig
from forecaster.errors import MissingColumnsError
from pipelines.cli import main
from pipelines.predict import predict_file
from pipelines.registry import download_forecaster, resolve_model
from tests.pipelines.pipeline_helpers import synthetic


@pytest.fixture(scope="module")
def model_dir(champion_store, tmp_path_factory):
    root, _ = champion_store
    uri = f"sqlite:///{root / 'mlflow.db'}"
    ref = resolve_model("models:/forecaster@champion", tracking_uri=uri)
    return download_forecaster(ref, tmp_path_factory.mktemp("model") / "v1", tracking_uri=uri)


@pytest.fixture(scope="module")
def history() -> pd.DataFrame:
    return synthetic(seed=3, n_series=7, n_steps=24 * 4)


@pytest.fixture(scope="module")
def expected(model_dir, history) -> pd.DataFrame:
    return Forecaster.load(model_dir, device="cpu").predict(history)


@pytest.mark.parametrize("suffix_in", [".csv", ".parquet"])
@pytest.mark.parametrize("suffix_out", [".csv", ".parquet"])
def test_chunked_streaming_matches_one_predict_call(
    model_dir, history, expected, tmp_path, monkeypatch, suffix_in, suffix_out
):
    source = tmp_path / f"in{suffix_in}"
    if suffix_in == ".csv":
        history.to_csv(source, index=False)
    else:
        history.to_parquet(source, row_group_size=50)
    # Reads of 37 rows split series across chunks; 3 series per predict call.
    monkeypatch.setattr(predict_module, "ROWS_PER_READ", 37)
    read, sizes = predict_module.read_chunks, []

    def recording_read(*args, **kwargs):
        chunks, total = read(*args, **kwargs)
        return (sizes.append(len(chunk)) or chunk for chunk in chunks), total

    monkeypatch.setattr(predict_module, "read_chunks", recording_read)
    out = tmp_path / f"out{suffix_out}"
    summary = predict_file(str(model_dir), source, out, chunk_series=3, progress=False)
    assert max(sizes) <= 37 and sum(sizes) == len(history) and len(sizes) > len(history) // 37
    got = pd.read_csv(out, parse_dates=["ds"]) if suffix_out == ".csv" else pd.read_parquet(out)
    assert (summary.n_series, summary.n_input_rows) == (7, len(history))
    assert summary.n_output_rows == len(expected) == len(got)
    assert list(got.columns) == list(expected.columns)
    assert got["unique_id"].astype(str).tolist() == expected["unique_id"].astype(str).tolist()
    np.testing.assert_array_equal(got["ds"].to_numpy(), expected["ds"].to_numpy())
    np.testing.assert_allclose(got["mean"], expected["mean"], rtol=1e-6)
    np.testing.assert_allclose(got["q0.9"], expected["q0.9"], rtol=1e-6)


def test_cli_predict_with_the_registered_champion(
    champion_store, history, expected, tmp_path, capsys
):
    root, _ = champion_store
    history.to_csv(tmp_path / "in.csv", index=False)
    code = main(
        [
            "predict",
            "--tracking-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--model",
            "models:/forecaster@champion",
            "--input",
            str(tmp_path / "in.csv"),
            "--output",
            str(tmp_path / "out.parquet"),
            "--horizon",
            "5",
            "--quantiles",
            "0.1,0.9",
            "--no-progress",
        ]
    )
    assert code == 0
    assert "forecaster v1" in capsys.readouterr().out
    got = pd.read_parquet(tmp_path / "out.parquet")
    assert list(got.columns) == ["unique_id", "ds", "mean", "q0.1", "q0.9"]
    assert len(got) == 5 * 7
    first = expected.groupby("unique_id").head(5).reset_index(drop=True)
    np.testing.assert_allclose(got["mean"], first["mean"], rtol=1e-6)


def test_bad_input_writes_nothing(model_dir, history, tmp_path):
    shuffled = history.sample(frac=1.0, random_state=0)
    shuffled.to_csv(tmp_path / "in.csv", index=False)
    with pytest.raises(ValueError, match="not contiguous"):
        predict_file(str(model_dir), tmp_path / "in.csv", tmp_path / "out.csv", progress=False)
    bad = history.copy()
    bad["y"] = bad["y"].astype(object)
    bad.loc[bad.index[-1], "y"] = "abc"  # in the last series, found after others were written
    bad.to_csv(tmp_path / "in.csv", index=False)
    with pytest.raises(ValueError, match="series_006"):
        predict_file(
            str(model_dir),
            tmp_path / "in.csv",
            tmp_path / "out.csv",
            chunk_series=2,
            progress=False,
        )
    assert list(tmp_path.iterdir()) == [tmp_path / "in.csv"]


def test_unforecastable_history_and_bad_params_are_named(model_dir, history, tmp_path, capsys):
    empty = history.assign(y=np.where(history["unique_id"] == "series_000", np.nan, history["y"]))
    empty.to_csv(tmp_path / "empty.csv", index=False)
    args = ["predict", "--model", str(model_dir), "--output", str(tmp_path / "o.csv")]
    assert main([*args, "--input", str(tmp_path / "empty.csv"), "--no-progress"]) == 2
    assert "series 'series_000' has no observed value" in capsys.readouterr().err
    history.to_csv(tmp_path / "in.csv", index=False)
    assert main([*args, "--input", str(tmp_path / "in.csv"), "--horizon", "999"]) == 2
    assert "horizon" in capsys.readouterr().err
    assert main([*args, "--input", str(tmp_path / "in.csv"), "--quantiles", "0.3"]) == 2
    assert "quantiles" in capsys.readouterr().err
    assert main([*args, "--input", str(tmp_path / "in.txt")]) == 2
    history.sample(frac=1.0, random_state=0).to_csv(tmp_path / "shuffled.csv", index=False)
    assert main([*args, "--input", str(tmp_path / "shuffled.csv"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "series 'series_" in err and "rows are not contiguous" in err
    assert not (tmp_path / "o.csv").exists()


def test_the_spark_engine_without_pyspark_exits_2_naming_the_extra(
    model_dir, history, tmp_path, capsys, monkeypatch
):
    """A core install (no 'spark' extra) ended in a ModuleNotFoundError traceback, exit 1."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pyspark" else find_spec(name, *a),
    )
    history.to_csv(tmp_path / "in.csv", index=False)
    args = ["predict", "--model", str(model_dir), "--input", str(tmp_path / "in.csv")]
    assert main([*args, "--output", str(tmp_path / "out"), "--engine", "spark"]) == 2
    assert "pip install 'forecaster[spark]'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["garbage.parquet", "garbage.csv.gz"])
def test_an_unreadable_input_file_exits_2_naming_it(model_dir, tmp_path, capsys, name):
    (tmp_path / name).write_bytes(b"not a parquet file, nor gzip\n" * 10)
    out = tmp_path / "o.csv"
    args = ["predict", "--model", str(model_dir), "--output", str(out), "--no-progress"]
    assert main([*args, "--input", str(tmp_path / name)]) == 2
    assert f"{tmp_path / name}: cannot read file" in capsys.readouterr().err
    assert not out.exists()


def test_a_model_path_that_is_no_saved_model_says_what_it_lacks(history, tmp_path, capsys):
    """A path given as --model was read as a registry URI unless it held config.json: a
    directory without it, or a mistyped path, was answered with the URI forms alone."""
    history.to_csv(tmp_path / "in.csv", index=False)
    (tmp_path / "empty").mkdir()
    args = ["predict", "--input", str(tmp_path / "in.csv"), "--output", str(tmp_path / "o.csv")]
    assert main([*args, "--model", str(tmp_path / "empty")]) == 2
    assert f"{tmp_path / 'empty'}: no config.json" in capsys.readouterr().err
    assert main([*args, "--model", str(tmp_path / "typo")]) == 2
    err = capsys.readouterr().err
    assert "or the directory of a saved model" in err and "which is no directory" in err
    assert main([*args, "--model", "forecaster@champion"]) == 2
    assert "'models:/NAME@alias'" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "in.csv"]


def test_a_damaged_model_exits_2_naming_its_file(model_dir, history, tmp_path, capsys):
    damaged = tmp_path / "model"
    shutil.copytree(model_dir, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    history.to_csv(tmp_path / "in.csv", index=False)
    args = ["predict", "--model", str(damaged), "--input", str(tmp_path / "in.csv")]
    assert main([*args, "--output", str(tmp_path / "o.csv"), "--no-progress"]) == 2
    assert f"{weights}: does not match the checksum" in capsys.readouterr().err
    assert not (tmp_path / "o.csv").exists()


def test_a_file_corrupt_after_its_first_rows_exits_2(model_dir, history, tmp_path, capsys):
    import gzip

    whole = gzip.compress(history.to_csv(index=False).encode())
    (tmp_path / "cut.csv.gz").write_bytes(whole[: len(whole) // 2])  # truncated download
    args = ["predict", "--model", str(model_dir), "--output", str(tmp_path / "o.csv")]
    assert main([*args, "--input", str(tmp_path / "cut.csv.gz"), "--no-progress"]) == 2
    assert "cut.csv.gz: cannot read file" in capsys.readouterr().err
    assert not (tmp_path / "o.csv").exists()


def _with_a_glitch(history: pd.DataFrame, series: str, from_end: int) -> tuple[pd.DataFrame, str]:
    """`history` with one reading of `series` ten times too high, and that reading's time."""
    rows = np.flatnonzero((history["unique_id"] == series).to_numpy())
    at = rows[-from_end]
    glitched = history.copy()
    glitched.loc[glitched.index[at], "y"] = 10 * glitched["y"].iloc[at] + 100
    return glitched, str(pd.Timestamp(history["ds"].iloc[at]))


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_glitches_are_listed_beside_the_forecasts(model_dir, history, tmp_path, suffix):
    """A reading far from its neighbours is left out of the forecast and named in the glitches
    file, as POST /v1/forecast names it; chunks that hold none add nothing."""
    glitched, when = _with_a_glitch(history, "series_004", from_end=30)
    glitched.to_csv(tmp_path / "in.csv", index=False)
    listed = tmp_path / f"glitches{suffix}"
    summary = predict_file(
        str(model_dir),
        tmp_path / "in.csv",
        tmp_path / "out.csv",
        chunk_series=3,
        progress=False,
        glitches_output=listed,
    )
    got = pd.read_csv(listed) if suffix == ".csv" else pd.read_parquet(listed)
    assert list(got.columns) == ["unique_id", "ds"]
    assert got["unique_id"].astype(str).tolist() == ["series_004"]
    assert [str(pd.Timestamp(t)) for t in got["ds"]] == [when]
    assert (summary.n_glitches, summary.n_series_with_glitches) == (1, 1)
    assert summary.glitches_output == listed
    # Left out: the forecast is the one made with that reading missing.
    missing = glitched.assign(
        y=np.where(
            glitched["ds"].astype(str).eq(when) & glitched["unique_id"].eq("series_004"),
            np.nan,
            glitched["y"],
        )
    )
    forecaster = Forecaster.load(model_dir, device="cpu")
    np.testing.assert_allclose(
        pd.read_csv(tmp_path / "out.csv")["mean"], forecaster.predict(missing)["mean"], rtol=1e-6
    )


def test_a_clean_file_lists_no_glitch_and_the_cli_counts_them(model_dir, history, tmp_path, capsys):
    history.to_csv(tmp_path / "clean.csv", index=False)
    args = ["predict", "--model", str(model_dir), "--output", str(tmp_path / "o.csv")]
    listed = tmp_path / "g.parquet"
    assert (
        main(
            [
                *args,
                "--input",
                str(tmp_path / "clean.csv"),
                "--no-progress",
                "--glitches",
                str(listed),
            ]
        )
        == 0
    )
    assert "glitches" not in capsys.readouterr().out
    empty = pd.read_parquet(listed)
    assert list(empty.columns) == ["unique_id", "ds"] and len(empty) == 0

    glitched, _ = _with_a_glitch(history, "series_001", from_end=10)
    glitched.to_csv(tmp_path / "glitched.csv", index=False)
    assert main([*args, "--input", str(tmp_path / "glitched.csv"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "1 readings of 1 series were read as glitches" in out
    assert "--glitches PATH lists them" in out


def test_the_glitches_file_cannot_be_the_output(model_dir, history, tmp_path, capsys):
    history.to_csv(tmp_path / "in.csv", index=False)
    out = str(tmp_path / "o.csv")
    args = ["predict", "--model", str(model_dir), "--input", str(tmp_path / "in.csv")]
    assert main([*args, "--output", out, "--glitches", out, "--no-progress"]) == 2
    assert "glitches" in capsys.readouterr().err
    assert main([*args, "--output", out, "--glitches", str(tmp_path / "g.txt")]) == 2
    assert "glitches" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [tmp_path / "in.csv"]


@pytest.mark.parametrize("role", ["--output", "--glitches"])
def test_no_output_may_replace_the_input(model_dir, history, tmp_path, capsys, role):
    """Naming the input as an output is refused before any work: the history stays."""
    source = tmp_path / "in.csv"
    history.to_csv(source, index=False)
    before = source.read_bytes()
    outputs = {"--output": str(tmp_path / "o.csv"), "--glitches": str(tmp_path / "g.csv")}
    outputs[role] = str(tmp_path / "." / "in.csv")  # another spelling of the same file
    args = ["predict", "--model", str(model_dir), "--input", str(source), "--no-progress"]
    assert main([*args, *(item for pair in outputs.items() for item in pair)]) == 2
    assert "the same file as the input" in capsys.readouterr().err
    assert source.read_bytes() == before
    assert list(tmp_path.iterdir()) == [source]


@pytest.mark.parametrize("where", ["a directory", "under a file"])
def test_an_output_that_cannot_be_a_file_is_one_line_and_exit_2(
    model_dir, history, tmp_path, capsys, where
):
    source = tmp_path / "in.csv"
    history.to_csv(source, index=False)
    taken = tmp_path / "taken.csv"
    taken.mkdir() if where == "a directory" else taken.touch()
    output = taken if where == "a directory" else taken / "o.csv"
    args = ["predict", "--model", str(model_dir), "--input", str(source), "--no-progress"]
    assert main([*args, "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: output {output}: ")
    assert ("a directory" if where == "a directory" else "cannot be created") in err


def test_an_aware_history_is_forecast_in_its_time_zone(model_dir, history, tmp_path):
    """As from Forecaster.predict: hourly data in Berlin time comes back in Berlin time, not
    as naive UTC that reads an hour early, and integer ids as integers (they came back as
    text, which joins with nothing)."""
    codes = {sid: k for k, sid in enumerate(history["unique_id"].unique())}
    aware = history.assign(
        ds=history["ds"].dt.tz_localize("Europe/Berlin"),
        unique_id=history["unique_id"].map(codes).astype("int64"),
    )
    aware.to_parquet(tmp_path / "in.parquet", index=False)
    predict_file(str(model_dir), tmp_path / "in.parquet", tmp_path / "out.parquet", progress=False)
    got = pd.read_parquet(tmp_path / "out.parquet")
    want = Forecaster.load(model_dir, device="cpu").predict(aware)
    assert str(got["ds"].dt.tz) == "Europe/Berlin"
    assert (got["ds"] == want["ds"]).all()
    assert got["unique_id"].dtype == "int64" and (got["unique_id"] == want["unique_id"]).all()
    last = aware.groupby("unique_id")["ds"].max()
    first = got.groupby("unique_id")["ds"].min()
    assert (first - last.loc[first.index] == pd.Timedelta(hours=1)).all()


def test_an_aware_csv_is_forecast_in_utc_labelled(model_dir, history, tmp_path):
    """A CSV holds an aware column as text whose offsets change at daylight-saving time: the
    forecasts are the same instants, labelled UTC, not naive UTC that reads an hour early."""
    aware = history.assign(
        ds=history["ds"].dt.tz_localize("Europe/Berlin") + pd.Timedelta(days=86)
    )  # late March: the offset goes from +01:00 to +02:00 inside the history
    aware.to_csv(tmp_path / "in.csv", index=False)
    predict_file(str(model_dir), tmp_path / "in.csv", tmp_path / "out.csv", progress=False)
    text = pd.read_csv(tmp_path / "out.csv")["ds"]
    assert text.str.endswith("+00:00").all()
    want = Forecaster.load(model_dir, device="cpu").predict(aware)["ds"]
    assert (pd.to_datetime(text) == want.dt.tz_convert("UTC")).all()


def test_an_id_that_spells_a_missing_value_is_forecast(model_dir, history, tmp_path):
    """A CSV's "NA" id (Namibia, say) is a series, as the Spark engine reads it too."""
    named = history.assign(unique_id=history["unique_id"].replace({"series_000": "NA"}))
    named.to_csv(tmp_path / "in.csv", index=False)
    predict_file(str(model_dir), tmp_path / "in.csv", tmp_path / "out.csv", progress=False)
    out = pd.read_csv(tmp_path / "out.csv", keep_default_na=False)
    assert set(out["unique_id"]) == set(named["unique_id"])


def test_a_run_that_fails_logs_no_forecast_and_one_that_succeeds_logs_all(
    champion_store, history, tmp_path, monkeypatch
):
    """Forecasts reach the forecast log only with the output they were written to: a run
    that failed on a later series (its earlier chunks forecast) left their rows in the log,
    where monitoring would score forecasts nobody received."""
    import functools

    from pipelines.forecast_log import ForecastLog, read_log

    # A log that writes every row at once, as a large run's did past its buffer.
    monkeypatch.setattr(predict_module, "ForecastLog", functools.partial(ForecastLog, flush_rows=1))

    root, _ = champion_store
    log_dir = tmp_path / "log"
    bad = history.copy()
    bad["y"] = bad["y"].astype(object)
    bad.loc[bad.index[-1], "y"] = "abc"  # in the last series, after others were forecast
    bad.to_csv(tmp_path / "bad.csv", index=False)
    history.to_csv(tmp_path / "in.csv", index=False)
    run = {
        "tracking_uri": f"sqlite:///{root / 'mlflow.db'}",
        "forecast_log": log_dir,
        "chunk_series": 2,
        "progress": False,
    }
    with pytest.raises(ValueError, match="series_006"):
        predict_file("models:/forecaster@champion", tmp_path / "bad.csv", tmp_path / "o.csv", **run)
    assert read_log(log_dir).empty
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "in.csv"]

    summary = predict_file(
        "models:/forecaster@champion", tmp_path / "in.csv", tmp_path / "o.csv", **run
    )
    logged = read_log(log_dir)
    assert len(logged) == summary.n_output_rows
    assert set(logged["unique_id"]) == set(history["unique_id"])
    assert set(logged["model_version"]) == {summary.model.version}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "in.csv", "log", "o.csv"]


def test_a_file_with_no_series_writes_nothing_and_exits_2(model_dir, history, tmp_path, capsys):
    history.head(0).to_csv(tmp_path / "in.csv", index=False)  # the header alone
    out = tmp_path / "new" / "dir" / "o.csv"
    args = ["predict", "--model", str(model_dir), "--input", str(tmp_path / "in.csv")]
    assert main([*args, "--output", str(out), "--no-progress"]) == 2
    assert "no forecasts were produced: the input holds no series" in capsys.readouterr().err
    assert not out.exists() and list(out.parent.iterdir()) == []


def test_an_output_in_a_directory_not_made_yet_is_written_and_the_run_timed(
    model_dir, history, tmp_path
):
    history.to_csv(tmp_path / "in.csv", index=False)
    out = tmp_path / "new" / "dir" / "o.csv"
    summary = predict_file(str(model_dir), tmp_path / "in.csv", out, progress=False)
    assert len(pd.read_csv(out)) == summary.n_output_rows > 0
    assert 0 < summary.seconds < 600


def test_a_covariate_the_model_needs_missing_from_the_file_is_named(history, tmp_path):
    """Checked against the file's header before anything is read or forecast."""
    config = ModelConfig(
        context_length=8, prediction_length=3, patch_length=4, covariates=("temp", "price")
    )
    history.assign(temp=1.0).to_csv(tmp_path / "in.csv", index=False)
    with pytest.raises(MissingColumnsError, match=r"missing covariate columns \['price'\]") as e:
        predict_file(Forecaster(config), tmp_path / "in.csv", tmp_path / "o.csv", progress=False)
    assert e.value.field == "price"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv"]


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_an_output_that_cannot_be_replaced_leaves_no_glitches_file(
    model_dir, history, tmp_path, monkeypatch, capsys, suffix
):
    """The output is renamed into place first: when that fails (here a directory made at its
    path during the run), the glitches file is not left describing forecasts nobody got."""
    glitched, _ = _with_a_glitch(history, "series_002", from_end=20)
    glitched.to_csv(tmp_path / "in.csv", index=False)
    out, listed = tmp_path / "o.csv", tmp_path / f"glitches{suffix}"
    real_forecast_batch = predict_module.forecast_batch

    def forecast_while_a_directory_appears(*args, **kwargs):
        (out / "taken").mkdir(parents=True, exist_ok=True)  # non-empty: no rename replaces it
        return real_forecast_batch(*args, **kwargs)

    monkeypatch.setattr(predict_module, "forecast_batch", forecast_while_a_directory_appears)
    args = ["predict", "--model", str(model_dir), "--input", str(tmp_path / "in.csv")]
    assert main([*args, "--output", str(out), "--glitches", str(listed), "--no-progress"]) == 2
    assert f"output {out}: cannot be replaced" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv", "o.csv"]
    assert [p.name for p in out.iterdir()] == ["taken"]
