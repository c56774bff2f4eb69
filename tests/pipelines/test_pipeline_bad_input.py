"""Bad input files: a clear one-line error naming the problem, a FAILED run, nothing registered."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipelines.cli import main
from pipelines.ingest import ingest
from tests.pipelines.pipeline_helpers import TINY_MODEL, client_for, config_file, synthetic


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-input-store")
    return root, config_file(root)


def _write(df: pd.DataFrame, path) -> str:
    df.to_csv(path, index=False)
    return str(path)


def _good() -> pd.DataFrame:
    return synthetic()


def _missing_column(tmp_path):
    return _write(
        _good().drop(columns="y"), tmp_path / "d.csv"
    ), "present columns: ['unique_id', 'ds']"


def _text_in_y(tmp_path):
    df = _good()
    df["y"] = df["y"].astype(object)
    df.loc[30, "y"] = "abc"
    return _write(df, tmp_path / "d.csv"), "series_000"


def _numbers_as_ds(tmp_path):
    df = _good()
    df["ds"] = np.arange(len(df)) + 0.5  # integers are steps, fractions neither
    return _write(df, tmp_path / "d.csv"), "ds holds numbers"


def _no_observed_value(tmp_path):
    # A NaN is a missing value the model masks; a series with nothing observed is an error.
    df = _good()
    df.loc[df["unique_id"] == "series_001", "y"] = np.nan
    return _write(df, tmp_path / "d.csv"), "series 'series_001' has no observed value"


def _duplicates(tmp_path):
    df = _good()
    df = pd.concat([df, df.iloc[[5]]]).sort_values(["unique_id", "ds"], kind="stable")
    return _write(df, tmp_path / "d.csv"), "series_000"


def _too_short(tmp_path):
    # Every series shorter than one training window (2 points) plus validation and test:
    # nothing is left to train on.
    df = _good()
    df = df[df.groupby("unique_id").cumcount() < 40]
    return _write(df, tmp_path / "d.csv"), "series_000"


def _empty_file(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("")
    return str(path), "empty"


def _header_only(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("unique_id,ds,y\n")
    return str(path), "no rows"


def _semicolons(tmp_path):
    # What a spreadsheet writes in locales whose decimal mark is the comma.
    path = tmp_path / "d.csv"
    _good().to_csv(path, index=False, sep=";")
    return str(path), "the file looks separated by ';'"


def _missing_file(tmp_path):
    return str(tmp_path / "nope.parquet"), "no such file"


@pytest.mark.parametrize(
    "case",
    [
        _missing_column,
        _text_in_y,
        _numbers_as_ds,
        _no_observed_value,
        _duplicates,
        _too_short,
        _empty_file,
        _header_only,
        _semicolons,
        _missing_file,
    ],
)
def test_retrain_rejects_bad_data_with_one_clear_line(case, store, tmp_path, capsys):
    root, cfg = store
    path, expected = case(tmp_path)
    assert main(["retrain", "--config", str(cfg), "--data", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert expected in err[0]
    assert "Traceback" not in err[0]
    client = client_for(root)
    assert client.search_model_versions("name='forecaster'") == []


def test_too_short_names_the_configured_lengths(store, tmp_path, capsys):
    root, cfg = store
    path, _ = _too_short(tmp_path)
    main(["retrain", "--config", str(cfg), "--data", path])
    err = capsys.readouterr().err
    horizon = TINY_MODEL["prediction_length"]
    assert f"prediction_length={horizon} needs 2 training points" in err


def test_a_series_too_short_for_the_split_is_left_out_not_the_run(store, tmp_path, caplog):
    """A new product of 40 points in a catalogue failed every retrain: it is left out of the
    run's training and evaluation, said so, and the champion still forecasts it. With
    short_series=refuse the run fails naming it, as before."""
    import logging

    from forecaster import Forecaster
    from pipelines.registry import load_forecaster

    root, cfg = store
    df = _good()
    from_end = df.groupby("unique_id").cumcount(ascending=False)
    new = (df["unique_id"] == "series_002") & (from_end >= 40)
    df = df[~new].reset_index(drop=True)  # series_002 starts late: its last 40 points
    path = _write(df, tmp_path / "d.csv")
    argv = ["retrain", "--config", str(cfg), "--data", path]
    assert main([*argv, "--set", "short_series=refuse"]) == 2
    assert client_for(root).search_model_versions("name='forecaster'") == []
    with caplog.at_level(logging.WARNING, logger="pipelines.ingest"):
        assert main(argv) == 0
    assert "1 of 4 series have fewer than" in caplog.text and "'series_002'" in caplog.text
    client = client_for(root)
    version = client.get_model_version("forecaster", "1")
    params = client.get_run(version.run_id).data.params
    assert (params["data.n_series"], params["data.n_series_left_out"]) == ("3", "1")
    champion = load_forecaster(
        "models:/forecaster@champion", tracking_uri=f"sqlite:///{root / 'mlflow.db'}"
    )
    assert isinstance(champion.forecaster, Forecaster)
    forecast = champion.forecaster.predict(df)
    assert set(forecast["unique_id"]) == set(df["unique_id"])
    assert forecast["mean"].notna().all()


def test_a_failed_run_is_recorded_as_failed_with_its_error(store, tmp_path):
    root, cfg = store
    path, _ = _no_observed_value(tmp_path)
    main(["retrain", "--config", str(cfg), "--data", path])
    client = client_for(root)
    experiment = client.get_experiment_by_name("forecaster")
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"])
    assert runs[0].info.status == "FAILED"
    assert "MissingValuesError" in runs[0].data.tags["error"]


def test_extra_columns_are_ignored_and_do_not_change_the_data(caplog):
    df = _good()
    with_extra = df.assign(comment="x", sensor_temp=1.5)
    plain = ingest(df)
    extra = ingest(with_extra)
    assert extra.fingerprint == plain.fingerprint
    assert list(extra.frame.columns) == ["unique_id", "ds", "y"]
    assert "comment" in caplog.text and "sensor_temp" in caplog.text


def test_wide_files_become_one_series_per_column(tmp_path):
    df = _good()
    wide = df.pivot(index="ds", columns="unique_id", values="y").reset_index()
    wide = wide.rename(columns={"ds": "date"})
    wide.to_parquet(tmp_path / "wide.parquet")
    result = ingest(tmp_path / "wide.parquet")
    assert result.n_series == df["unique_id"].nunique()
    assert result.freq == "h"


def test_missing_data_source_is_named(store, capsys):
    _, cfg = store
    assert main(["retrain", "--config", str(cfg)]) == 2
    assert "--data" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["evaluate", "--windows", "0"],
        ["evaluate", "--windows", "-2"],
        ["predict", "--output", "out.csv", "--chunk-series", "-1"],
        ["predict", "--output", "out.csv", "--horizon", "zero"],
        ["schedule", "--max-runs", "-1"],
    ],
)
def test_counts_below_one_exit_2_naming_the_option(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert f"argument {argv[-2]}: expected an integer >= 1" in capsys.readouterr().err


def test_an_unknown_top_level_set_key_is_named(store, tmp_path, capsys):
    _, cfg = store
    argv = ["retrain", "--config", str(cfg), "--data", _write(_good(), tmp_path / "d.csv")]
    assert main([*argv, "--set", "promotion_margn=0.02"]) == 2
    assert "promotion_margn" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["5", "[1]"])
@pytest.mark.parametrize("section", ["model", "train"])
def test_a_set_section_that_is_not_a_mapping_is_named(store, tmp_path, capsys, section, value):
    _, cfg = store
    argv = ["retrain", "--config", str(cfg), "--data", _write(_good(), tmp_path / "d.csv")]
    assert main([*argv, "--set", f"{section}={value}"]) == 2
    assert f"error: {section}: Input should be a valid dictionary" in capsys.readouterr().err


def test_a_file_cut_while_being_written_is_warned_of(tmp_path, caplog):
    """A feed read half-written: its last line has no line end (the last value cut short) and
    the series at its end stop early. Validation cannot tell, so ingest says so."""
    df = _good()
    path = tmp_path / "feed.csv"
    text = df.to_csv(index=False)
    caplog.set_level("WARNING", logger="pipelines.ingest")
    path.write_text(text[: text.rindex("\n", 0, int(len(text) * 0.8))])
    ingest(path)
    assert "the last line has no line end" in caplog.text
    assert "series end before the data's last timestamp" in caplog.text
    caplog.clear()
    path.write_text(text)  # whole: no warning
    ingest(path)
    assert caplog.text == ""
    # Nor on Parquet, whose file ends with its footer, not a line end.
    df.to_parquet(tmp_path / "feed.parquet")
    ingest(tmp_path / "feed.parquet")
    assert caplog.text == ""


def test_retrain_goes_on_when_the_first_series_is_in_a_long_outage(tmp_path, capsys):
    """The first series' last 110 steps are missing, more than the 48-step context: it cannot be
    forecast from its end, yet the run trains, evaluates (seasonal naive scored on the model's
    windows), registers with an example of series it can forecast, and promotes."""
    frame = _good()
    first = frame.index[frame["unique_id"] == frame["unique_id"].iloc[0]]
    frame.loc[first[-110:], "y"] = np.nan  # through the end of the training split
    path = _write(frame, tmp_path / "outage.csv")
    cfg = config_file(tmp_path)
    assert main(["retrain", "--config", str(cfg), "--data", str(path)]) == 0, capsys.readouterr()
    aliases = client_for(tmp_path).get_registered_model("forecaster").aliases
    assert "champion" in aliases


def test_a_set_without_a_value_is_named(capsys):
    assert main(["retrain", "--set", "promotion_margin"]) == 2
    err = capsys.readouterr().err
    assert "--set: expected KEY=VALUE (e.g. model.context_length=96), got 'promotion_margin'" in err


def test_evaluate_without_data_says_what_to_pass(store, capsys):
    _, cfg = store
    assert main(["evaluate", "--config", str(cfg)]) == 2
    assert "evaluate: pass --data PATH" in capsys.readouterr().err


def test_the_command_line_flags_win_over_set_and_the_file(tmp_path):
    """--tracking-uri, --experiment, --model-name and --data are the settings they name,
    over a --set of the same setting and over the YAML file."""
    import argparse

    import yaml

    from pipelines.cli import load_settings

    cfg = tmp_path / "settings.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"experiment": "file", "model_name": "file", "tracking_uri": "sqlite:///file.db"}
        )
    )
    flags = {
        "tracking_uri": f"sqlite:///{tmp_path / 'flag.db'}",
        "experiment": "flag",
        "model_name": "flag",
        "data": str(tmp_path / "flag.csv"),
    }
    sets = ["experiment=set", "model_name=set", "data=set.csv", "tracking_uri=sqlite:///set.db"]
    settings = load_settings(argparse.Namespace(config=str(cfg), set=sets, **flags))
    assert settings.tracking_uri == flags["tracking_uri"]
    assert (settings.experiment, settings.model_name) == ("flag", "flag")
    assert str(settings.data) == flags["data"]
    unflagged = load_settings(argparse.Namespace(config=str(cfg), set=sets))
    assert (unflagged.experiment, unflagged.model_name) == ("set", "set")


def test_an_interrupted_command_exits_130_in_one_line(store, tmp_path, monkeypatch, capsys):
    """Ctrl-C (SIGINT) during a retrain: one line and the shell's exit code, no traceback."""
    import pipelines.retrain

    def interrupted(settings):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipelines.retrain, "retrain", interrupted)
    _, cfg = store
    assert main(["retrain", "--config", str(cfg), "--data", str(tmp_path / "d.csv")]) == 130
    assert capsys.readouterr().err.strip() == "error: interrupted"


def test_a_schedule_whose_run_failed_exits_1_with_its_counts(store, tmp_path, capsys):
    """cron or a supervisor sees that the scheduled retrain failed (here: no data file)."""
    _, cfg = store
    argv = ["schedule", "--config", str(cfg), "--data", str(tmp_path / "nope.csv")]
    argv += ["--set", f"lock_file={tmp_path / 'lock'}", "--max-runs", "1", "--run-now"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "scheduler stopped after 1 run(s): 0 succeeded, 1 failed, 0 skipped, 0 healthy" in out
