"""PipelineSettings: sources, precedence, defaults and fail-fast validation."""

from __future__ import annotations

import pytest

from forecaster.errors import InvalidConfigError
from pipelines import tracking
from pipelines.settings import PipelineSettings


def test_defaults_are_the_embedded_sqlite_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = PipelineSettings.load()
    assert settings.resolved_tracking_uri == "sqlite:///mlflow.db"
    assert settings.model_name == "forecaster"
    assert settings.champion_uri == "models:/forecaster@champion"
    assert settings.model_config_obj().prediction_length == settings.horizon


def test_new_local_experiments_keep_artifacts_in_mlartifacts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    experiment_id = tracking.ensure_experiment("exp", tracking_uri="sqlite:///mlflow.db")
    location = tracking.client("sqlite:///mlflow.db").get_experiment(experiment_id)
    assert location.artifact_location == (tmp_path / "mlartifacts").as_uri()
    # Asking again returns the same experiment.
    assert tracking.ensure_experiment("exp", tracking_uri="sqlite:///mlflow.db") == experiment_id


def test_mlflow_tracking_uri_is_honoured_and_the_setting_wins(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert PipelineSettings.load().resolved_tracking_uri == "http://127.0.0.1:5999"
    monkeypatch.setenv("FORECASTER_TRACKING_URI", "sqlite:///other.db")
    assert PipelineSettings.load().resolved_tracking_uri == "sqlite:///other.db"


def test_precedence_cli_over_env_over_dotenv_over_yaml(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.yaml").write_text(
        "experiment: from-yaml\nmodel_name: yaml-model\npromotion_margin: 0.1\n"
        "model:\n  context_length: 48\n  prediction_length: 12\n"
    )
    # The service's settings share the .env file.
    (tmp_path / ".env").write_text(
        "FORECASTER_MODEL_NAME=dotenv-model\nFORECASTER_SERVICE_PORT=9\nFORECASTER_DEVICE=cpu\n"
    )
    monkeypatch.setenv("FORECASTER_PROMOTION_MARGIN", "0.2")
    monkeypatch.setenv("FORECASTER_MODEL__D_MODEL", "16")
    settings = PipelineSettings.load(tmp_path / "cfg.yaml", experiment="from-cli")
    assert settings.experiment == "from-cli"
    assert settings.promotion_margin == 0.2
    assert settings.model_name == "dotenv-model"
    config = settings.model_config_obj()
    # Nested overrides from YAML and the environment merge; strings are coerced.
    assert (config.context_length, config.prediction_length, config.d_model) == (48, 12, 16)


@pytest.mark.parametrize(
    ("where", "name", "hint"),
    [
        ("environment", "FORECASTER_PROMOTION_MARGN", "FORECASTER_PROMOTION_MARGIN"),
        ("environment", "FORECASTER_MODLE__CONTEXT_LENGTH", "FORECASTER_MODEL"),
        (".env", "FORECASTER_TRACKING_URL", "FORECASTER_TRACKING_URI"),
    ],
)
def test_a_misspelled_variable_is_refused_naming_it(tmp_path, monkeypatch, where, name, hint):
    """Settings ignore variables that name no setting: a misspelled one changed nothing, and
    the run went on against the default store."""
    monkeypatch.chdir(tmp_path)
    if where == ".env":
        (tmp_path / ".env").write_text(f"{name}=sqlite:///other.db\n")
    else:
        monkeypatch.setenv(name, "0.1")
    with pytest.raises(InvalidConfigError, match=f"{name}: .*did you mean {hint}") as error:
        PipelineSettings.load()
    assert error.value.field == name


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"schedule": "every night"}, "schedule"),
        ({"model": {"context_lenght": 48}}, "context_lenght"),
        ({"model": {"context_length": 0}}, "context_length"),
        ({"train": {"max_epochs": "many"}}, "max_epochs"),
        ({"promotion_metric": "r2"}, "promotion_metric"),
        ({"promotion_margin": 1.5}, "promotion_margin"),
        # NaN was refused as "should be less than 1", which says nothing of what is wrong.
        ({"promotion_margin": float("nan")}, "promotion_margin: Input should be a finite"),
        ({"backtest_windows": 0}, "backtest_windows"),
        ({"val_length": 10, "model": {"prediction_length": 12}}, "val_length"),
        ({"promotion_margn": 0.02}, "promotion_margn"),
        ({"model_name": "team/forecaster"}, "model_name"),
        ({"model_name": "a:b"}, "model_name"),
        ({"model_name": " "}, "model_name"),
        # These three were tracebacks from MLflow or the lock, after the data was read.
        ({"experiment": ""}, "experiment: expected an experiment name"),
        ({"tracking_uri": "foo://bar"}, "tracking_uri: expected a path or a URI of an MLflow"),
        ({"lock_file": "."}, "lock_file: expected the path of a lock file, got the directory"),
    ],
)
def test_invalid_settings_fail_fast_naming_the_setting(overrides, named):
    with pytest.raises(InvalidConfigError, match=named):
        PipelineSettings.load(**overrides)


def test_a_spill_dir_that_is_a_file_fails_at_startup(tmp_path):
    """The monitoring step spills a large log only after a retrain has ingested and trained:
    a file in the way failed it then."""
    taken = tmp_path / "taken"
    taken.write_text("")
    with pytest.raises(InvalidConfigError, match="forecast_log_spill_dir: .*expected a dir"):
        PipelineSettings.load(forecast_log_spill_dir=taken / "spill")
    with pytest.raises(InvalidConfigError, match="forecast_log_spill_dir: .*expected a dir"):
        PipelineSettings.load(forecast_log_spill_dir=taken)
    # Missing is fine: the step creates it.
    assert PipelineSettings.load(forecast_log_spill_dir=tmp_path / "a" / "b").forecast_log_spill_dir


def test_names_given_as_numbers_are_names():
    """`--set experiment=2024` reads 2024 as YAML, a number, which was refused as not a string
    while `--experiment 2024` was taken."""
    settings = PipelineSettings.load(experiment=2024, model_name=7)
    assert (settings.experiment, settings.model_name) == ("2024", "7")
    for uri in (
        "sqlite:///m.db",
        "postgresql+psycopg2://u@h/db",
        "http://127.0.0.1:5000",
        "mlruns",
    ):
        assert PipelineSettings.load(tracking_uri=uri).tracking_uri == uri


def test_yaml_file_problems_are_named(tmp_path):
    with pytest.raises(InvalidConfigError, match="no such file"):
        PipelineSettings.load(tmp_path / "missing.yaml")
    with pytest.raises(InvalidConfigError, match="is a directory; expected a YAML file"):
        PipelineSettings.load(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("experimnet: typo\n")
    with pytest.raises(InvalidConfigError, match="experimnet"):
        PipelineSettings.load(bad)
    bad.write_text("- a list\n")
    with pytest.raises(InvalidConfigError, match="mapping"):
        PipelineSettings.load(bad)
    # YAML reads `yes` as true, which pydantic read as 1 in a number field: a 1-step context.
    bad.write_text("model:\n  context_length: yes\n")
    with pytest.raises(InvalidConfigError, match=r"context_length: expected int \| None, got True"):
        PipelineSettings.load(bad)


def test_the_demo_configuration_builds_the_model_it_names():
    """`make demo` reads pipelines/demo.yaml: every key must be one the model still has."""
    from pathlib import Path

    settings = PipelineSettings.load(Path(__file__).parents[2] / "pipelines" / "demo.yaml")
    model_config = settings.model_config_obj()
    assert (model_config.context_length, model_config.prediction_length) == (168, 24)
    assert settings.train_config_obj().max_epochs >= 1


def test_set_merges_over_the_yaml_and_may_fix_what_it_gets_wrong(tmp_path, monkeypatch):
    """The YAML alone (val_length below its horizon) was validated before --set was merged,
    so `--set model.prediction_length=24` could not fix it while the environment could."""
    import argparse

    from pipelines.cli import load_settings

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("model:\n  context_length: 48\n  prediction_length: 96\nval_length: 30\n")
    monkeypatch.setenv("FORECASTER_MODEL__D_MODEL", "16")
    args = argparse.Namespace(config=str(cfg), set=["model.prediction_length=24"])
    settings = load_settings(args)
    config = settings.model_config_obj()
    assert (config.context_length, config.prediction_length, config.d_model) == (48, 24, 16)
    with pytest.raises(InvalidConfigError, match="val_length: expected at least the horizon"):
        load_settings(argparse.Namespace(config=str(cfg), set=[]))


# (overrides accepted, overrides refused, the setting the refusal names): each range at its
# bounds.
SETTING_BOUNDS = [
    ([{"val_length": 1, "model": {"prediction_length": 1}}], [{"val_length": 0}], "val_length"),
    ([{"backtest_windows": 1}], [{"backtest_windows": 0}], "backtest_windows"),
    ([{"plot_series": 1}], [{"plot_series": 0}], "plot_series"),
    (
        [{"promotion_margin": 0.0}, {"promotion_margin": 0.999}],
        [{"promotion_margin": -0.001}, {"promotion_margin": 1.0}],
        "promotion_margin",
    ),
    (
        [{"promotion_alpha": 0.001}, {"promotion_alpha": 1.0}],
        [{"promotion_alpha": 0.0}, {"promotion_alpha": 1.001}],
        "promotion_alpha",
    ),
    (
        [{"degradation_tolerance": 0.0}],
        [{"degradation_tolerance": -0.001}],
        "degradation_tolerance",
    ),
    ([{"degradation_min_points": 1}], [{"degradation_min_points": 0}], "degradation_min_points"),
    ([{"predict_chunk_series": 1}], [{"predict_chunk_series": 0}], "predict_chunk_series"),
]


@pytest.mark.parametrize(
    ("accepted", "refused", "named"), SETTING_BOUNDS, ids=[named for *_, named in SETTING_BOUNDS]
)
def test_each_settings_range_holds_its_bounds(accepted, refused, named):
    for overrides in accepted:
        PipelineSettings.load(**overrides)
    for overrides in refused:
        with pytest.raises(InvalidConfigError, match=f"{named}: "):
            PipelineSettings.load(**overrides)
