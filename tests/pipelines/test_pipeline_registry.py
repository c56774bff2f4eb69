"""The registry after a retrain: versions, aliases, tags, run contents; resolve and load."""

from __future__ import annotations

import json
import shutil
import time
from importlib import metadata
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

from forecaster import Forecaster
from forecaster.config import HISTORY_BANDS
from pipelines.cli import main
from pipelines.errors import InvalidModelUriError, ModelNotFoundError, TrackingUnavailableError
from pipelines.refit import REFIT_OF
from pipelines.registry import download_forecaster, load_forecaster, resolve_model
from pipelines.retrain import retrain
from tests.pipelines.pipeline_helpers import (
    TINY_MODEL,
    client_for,
    config_file,
    make_settings,
    synthetic,
)


def test_retrain_registers_version_1_as_challenger_and_champion(champion_store):
    root, result = champion_store
    client = client_for(root)
    model = client.get_registered_model("forecaster")
    assert {k: str(v) for k, v in model.aliases.items()} == {"challenger": "1", "champion": "1"}
    version = client.get_model_version("forecaster", "1")
    tags = version.tags
    assert tags["data.fingerprint"] == result.fingerprint
    assert tags["train.window_end"].startswith("2024-01-")
    assert tags["code_version"].startswith(("git:", "forecaster=="))
    assert tags["promotion.decision"] == "promoted"
    assert "no champion yet" in tags["promotion.reason"]
    assert version.run_id == result.run_id


def test_the_run_holds_params_learning_curves_metrics_and_artifacts(champion_store):
    root, result = champion_store
    client = client_for(root)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["model.context_length"] == "48"
    # Left to the data by the settings, logged as the hourly data resolved it.
    assert params["model.season_length"] == "24"
    assert params["train.seed"] == params["seed"] == "0"
    assert params["device"] == "cpu"
    assert params["data.fingerprint"] == result.fingerprint
    # The split the metrics were computed on; the version's own tag names its window end.
    version = client.get_model_version("forecaster", result.version.version)
    assert params["split.val_end"] == version.tags["train.window_end"]
    assert int(params["split.train_rows"]) > 0
    for package in ("torch", "pandas", "mlflow", "python"):
        assert params[f"version.{package}"]
    history = client.get_metric_history(result.run_id, "train_loss")
    assert [m.step for m in history] == list(range(1, len(history) + 1))
    assert len(client.get_metric_history(result.run_id, "val_loss")) == len(history)
    for metric in ("mae", "mse", "mase", "smape", "pinball", "coverage_80"):
        assert f"backtest_{metric}" in run.data.metrics
        assert f"baseline_{metric}" in run.data.metrics
    for kind in ("encoder", "decoder_self", "cross"):
        earned = run.data.metrics[f"attention_earned_{kind}"]
        assert earned == pytest.approx(result.evaluation.attention_earned[kind])
    assert run.data.metrics["training_glitches"] == 0
    metrics, tags = run.data.metrics, run.data.tags
    assert 0 < metrics["train_seconds"] <= (run.info.end_time - run.info.start_time) / 1000
    assert metrics["best_val_loss"] > 0
    # The interval factor of long histories, and one per band of shorter ones.
    assert metrics["interval_scale"] > 0
    assert all(metrics[f"interval_scale.history_{band}"] > 0 for band in HISTORY_BANDS[:-1])
    assert tags["device"] == "cpu"
    # What the run decided, beside its metrics, as the version's tags say it.
    assert tags["promotion.decision"] == "promoted"
    assert tags["promotion.reason"] == version.tags["promotion.reason"]
    # TINY_TRAIN's two epochs end before a plateau of `patience` 2 could.
    assert run.data.tags["training_ended"] == "max_epochs"
    artifacts = {a.path for a in client.list_artifacts(result.run_id)}
    assert {"evaluation", "plots"} <= artifacts
    assert "data" not in artifacts  # no glitch to list
    evaluation = {a.path for a in client.list_artifacts(result.run_id, "evaluation")}
    assert evaluation == {"evaluation/metrics.csv", "evaluation/metrics.json"}
    table = client.download_artifacts(result.run_id, "evaluation/metrics.csv", str(root))
    assert list(pd.read_csv(table).columns) == ["metric", "model", "seasonal_naive", "ratio"]
    plots = {a.path for a in client.list_artifacts(result.run_id, "plots")}
    assert plots == {"plots/forecast.png", "plots/attention.png"}
    local = client.download_artifacts(result.run_id, "plots/forecast.png", str(root))
    assert Path(local).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_run_names_the_training_readings_read_as_glitches(tmp_path, capsys, monkeypatch):
    """A bad reading in the training data is found: the CLI, the run and the version count
    it, and the run lists it. What MLflow's pages show first says what the run and the versions
    are (they had random run names and no description), and the data's path is absolute."""
    frame = synthetic()
    bad = frame.index[frame["unique_id"] == frame["unique_id"].iloc[0]][100]
    frame.loc[bad, "y"] = 10 * frame["y"].abs().max()
    frame.to_csv(tmp_path / "series.csv", index=False)
    cfg = config_file(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["retrain", "--config", str(cfg), "--data", "series.csv"]) == 0
    assert (
        "glitches  1 reading(s) of the training data look like glitches" in capsys.readouterr().out
    )
    client = client_for(tmp_path)
    version = client.get_model_version("forecaster", "1")
    assert version.tags["train.glitches"] == "1"
    run = client.get_run(version.run_id)
    assert run.data.metrics["training_glitches"] == 1
    assert run.info.run_name.startswith("retrain 20")
    source = str((tmp_path / "series.csv").resolve())
    assert version.tags["data.source"] == source
    assert version.description.startswith(f"Trained on 4 series of {source} up to ")
    assert "Backtest MASE" in version.description and "seasonal naive" in version.description
    local = client.download_artifacts(version.run_id, "data/training_glitches.csv", str(tmp_path))
    listed = pd.read_csv(local, parse_dates=["ds"])
    assert listed.to_dict("list") == {
        "unique_id": [frame.loc[bad, "unique_id"]],
        "ds": [frame.loc[bad, "ds"]],
    }


def test_a_retrain_out_of_training_time_says_so_and_still_registers(tmp_path):
    settings = make_settings(tmp_path, train={"max_epochs": 5, "max_train_seconds": 1e-3})
    result = retrain(settings, synthetic())
    client = client_for(tmp_path)
    run = client.get_run(result.run_id)
    assert run.data.tags["training_ended"] == "out_of_time"
    assert run.data.params["train.max_train_seconds"] == "0.001"
    assert len(client.get_metric_history(result.run_id, "train_loss")) == 1
    assert client.get_model_version("forecaster", "1").run_id == result.run_id


def test_a_retrain_stopped_by_a_plateau_says_so(tmp_path):
    # A rate this high makes the first epoch worse than the linear start: a plateau of one
    # epoch, and no decay left to try.
    train = {"max_epochs": 5, "patience": 1, "max_lr_decays": 0, "learning_rate": 5.0}
    result = retrain(
        make_settings(tmp_path, train={**train, "linear_start_lr_scale": 1.0}), synthetic()
    )
    client = client_for(tmp_path)
    run = client.get_run(result.run_id)
    assert run.data.tags["training_ended"] == "plateau"
    assert len(client.get_metric_history(result.run_id, "train_loss")) == 1
    assert run.data.metrics["best_epoch"] == 0


def test_a_model_with_covariates_is_registered_promoted_refit_and_served(tmp_path):
    """The documented flow for data with a known-future covariate: the retrain registers,
    promotes and refits it, and the registered pyfunc forecasts its own input example, whose
    last rows are the covariate's future with `y` empty."""
    from pipelines.retrain import retrain

    frame = synthetic()
    frame["promo"] = (frame["ds"].dt.day_of_week == 5).astype(float)
    frame["y"] += 5.0 * frame["promo"]
    settings = make_settings(tmp_path, model={"covariates": ["promo"]}, refit=True)
    result = retrain(settings, frame)
    assert result.decision.promoted
    assert result.refit_version is not None

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    try:
        model = mlflow.pyfunc.load_model("models:/forecaster@champion")
        local = mlflow.artifacts.download_artifacts("models:/forecaster@champion")
    finally:
        mlflow.set_tracking_uri(None)
    assert [c.name for c in model.metadata.signature.inputs.inputs] == [
        "unique_id",
        "ds",
        "y",
        "promo",
    ]
    example = pd.read_json(Path(local) / "input_example.json", orient="split")
    future = example.groupby("unique_id").tail(TINY_MODEL["prediction_length"])
    assert future["y"].isna().all() and future["promo"].notna().all()
    out = model.predict(example)
    assert len(out) == len(future)
    assert out["ds"].tolist() == pd.to_datetime(future["ds"]).tolist()
    assert np.isfinite(out["mean"]).all()


def test_resolve_and_load_the_champion(champion_store, tmp_path):
    root, result = champion_store
    uri = f"sqlite:///{root / 'mlflow.db'}"
    ref = resolve_model("models:/forecaster@champion", tracking_uri=uri)
    assert (ref.name, ref.version, ref.alias, ref.run_id) == (
        "forecaster",
        "1",
        "champion",
        result.run_id,
    )
    assert ref.metrics["backtest_mase"] == pytest.approx(result.evaluation.model["mase"])
    assert resolve_model("models:/forecaster/1", tracking_uri=uri).alias is None

    path = download_forecaster(ref, tmp_path / "v1", tracking_uri=uri)
    assert {p.name for p in path.iterdir()} >= {"config.json", "model.safetensors"}
    assert json.loads((path / "config.json").read_text())["model_config"]["d_model"] == 16

    loaded = load_forecaster("models:/forecaster@champion", tracking_uri=uri, device="cpu")
    history = synthetic()
    direct = Forecaster.load(path, device="cpu").predict(history)
    via_registry = loaded.forecaster.predict(history)
    np.testing.assert_array_equal(direct["mean"].to_numpy(), via_registry["mean"].to_numpy())
    assert loaded.ref == ref


@pytest.mark.parametrize(
    ("uri", "named"),
    [
        ("models:/forecaster@staging", "forecaster@staging"),
        ("models:/nope@champion", "nope@champion"),
        ("models:/forecaster/99", "forecaster/99"),
    ],
)
def test_unknown_model_alias_or_version(champion_store, uri, named):
    root, _ = champion_store
    with pytest.raises(ModelNotFoundError, match=named):
        resolve_model(uri, tracking_uri=f"sqlite:///{root / 'mlflow.db'}")


@pytest.mark.parametrize("uri", ["runs:/abc/model", "models:/forecaster", "models:/f/latest"])
def test_malformed_model_uri(uri):
    with pytest.raises(InvalidModelUriError, match="expected"):
        resolve_model(uri, tracking_uri="sqlite:///unused.db")


def test_cli_unknown_alias_is_one_line_and_exit_3(champion_store, tmp_path, capsys):
    root, _ = champion_store
    cfg = config_file(tmp_path)
    code = main(
        [
            "predict",
            "--config",
            str(cfg),
            "--tracking-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--model",
            "models:/forecaster@nightly",
            "--input",
            str(tmp_path / "in.csv"),
            "--output",
            str(tmp_path / "out.csv"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2  # the missing input file is reported before the model is looked up
    synthetic().to_csv(tmp_path / "in.csv", index=False)
    code = main(
        [
            "predict",
            "--tracking-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--model",
            "models:/forecaster@nightly",
            "--input",
            str(tmp_path / "in.csv"),
            "--output",
            str(tmp_path / "out.csv"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert len(err) == 1 and "forecaster@nightly not found" in err[0]
    assert not (tmp_path / "out.csv").exists()


def test_unreachable_tracking_server_fails_fast_and_clearly():
    started = time.monotonic()
    with pytest.raises(TrackingUnavailableError, match="127.0.0.1:9"):
        resolve_model("models:/forecaster@champion", tracking_uri="http://127.0.0.1:9")
    assert time.monotonic() - started < 30


def test_pyfunc_model_loads_without_pickles_and_forecasts(champion_store):
    root, _ = champion_store
    mlflow.set_tracking_uri(f"sqlite:///{root / 'mlflow.db'}")
    try:
        model = mlflow.pyfunc.load_model("models:/forecaster@champion")
        local = mlflow.artifacts.download_artifacts("models:/forecaster@champion")
    finally:
        mlflow.set_tracking_uri(None)
    assert not list(Path(local).rglob("*.pkl"))
    # What `mlflow models serve` or an image build installs: torch's release as it trained,
    # without the local label of a CPU or CUDA build (`+cpu`, which PyPI does not serve), and
    # no `forecaster` package (its code ships inside the model; no package index has it).
    requirements = (Path(local) / "requirements.txt").read_text().split()
    assert f"torch=={metadata.version('torch').split('+')[0]}" in requirements
    assert not [r for r in requirements if "+" in r]
    assert not [r for r in requirements if r.startswith("forecaster")]
    signature = model.metadata.signature
    assert {p.name for p in signature.params.params} == {"horizon", "quantiles"}
    assert [c.name for c in signature.inputs.inputs] == ["unique_id", "ds", "y"]
    assert model.metadata.saved_input_example_info is not None

    history = synthetic()
    history["ds"] = history["ds"].dt.strftime("%Y-%m-%d %H:%M:%S")  # as JSON delivers it
    out = model.predict(history, params={"horizon": 6, "quantiles": [0.1, 0.9]})
    assert list(out.columns) == ["unique_id", "ds", "mean", "q0.1", "q0.9"]
    assert len(out) == 6 * history["unique_id"].nunique()
    assert (out["q0.1"] <= out["q0.9"]).mean() > 0.9


def _register_through(client_class, champion_store, tmp_path, alias: str = "challenger"):
    """Register the champion's model again on a copy of the store, through ``client_class``
    (an MlflowClient whose alias call fails some way); returns the client and the store URI
    once ``register`` has raised."""
    from pipelines import tracking
    from pipelines.register import input_example, register

    root, _ = champion_store
    shutil.copy(root / "mlflow.db", tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    forecaster = load_forecaster("models:/forecaster@champion", tracking_uri=uri).forecaster
    client = client_class(uri)
    run = client.create_run(client.get_experiment_by_name("forecaster").experiment_id)
    with tracking.tracking_uri_set(uri), pytest.raises(BaseException) as raised:
        register(
            forecaster,
            input_example(forecaster, synthetic()),
            client=client,
            run_id=run.info.run_id,
            model_name="forecaster",
            tags={},
            alias=alias,
        )
    return client, uri, raised.value


def test_an_interrupt_while_aliasing_leaves_no_version_behind(champion_store, tmp_path):
    """Ctrl-C between the version's creation and its alias: the version goes again, so the
    registry holds no version that no alias names and no run reported."""
    from mlflow.tracking import MlflowClient

    class InterruptedClient(MlflowClient):
        def set_registered_model_alias(self, *args, **kwargs):
            raise KeyboardInterrupt

    before = {v.version for v in client_for(champion_store[0]).search_model_versions("")}
    client, _, raised = _register_through(InterruptedClient, champion_store, tmp_path)
    assert isinstance(raised, KeyboardInterrupt)
    assert {v.version for v in client.search_model_versions("name='forecaster'")} == before


def test_an_alias_that_landed_before_its_reply_was_lost_keeps_its_version(champion_store, tmp_path):
    """The server moved @champion to the refit version and the reply was lost (a timeout, a
    SIGTERM): deleting the version, as for a failed alias, would delete the alias with it and
    leave no champion at all. The version stays, holding the alias."""
    from mlflow.tracking import MlflowClient

    class ReplyLostClient(MlflowClient):
        def set_registered_model_alias(self, *args, **kwargs):
            super().set_registered_model_alias(*args, **kwargs)
            raise TimeoutError("the reply did not arrive")

    client, uri, raised = _register_through(
        ReplyLostClient, champion_store, tmp_path, alias="champion"
    )
    assert isinstance(raised, TimeoutError)
    champion = client.get_model_version_by_alias("forecaster", "champion")
    assert int(champion.version) == max(
        int(v.version) for v in client.search_model_versions("name='forecaster'")
    )
    assert load_forecaster("models:/forecaster@champion", tracking_uri=uri).forecaster.is_fitted


def test_a_retrain_that_would_repeat_a_decision_registers_nothing(
    store, data_csv, monkeypatch, capsys
):
    """Every scheduled run of a feed that had not moved registered the same model again as a
    new version. Inputs are the data, the configuration, the split and the committed code; a
    run whose inputs gave the champion, or a version rejected against it, trains nothing."""
    from pipelines import retrain as retrain_module

    monkeypatch.setattr(retrain_module, "code_version", lambda: "git:0123456789ab")
    client = client_for(store)
    settings = make_settings(store)
    first = retrain_module.retrain(settings, data_csv)
    assert first.unchanged is None
    tags = client.get_model_version("forecaster", first.version.version).tags
    inputs = tags[retrain_module.TRAINING_INPUTS]
    before = {v.version for v in client.search_model_versions("name = 'forecaster'")}

    again = retrain_module.retrain(settings, data_csv)
    assert (again.version, again.unchanged.version) == (None, first.version.version)
    assert again.champion_version == first.champion_version
    assert {v.version for v in client.search_model_versions("name = 'forecaster'")} == before
    run = client.get_run(again.run_id)
    assert run.info.status == "FINISHED"
    assert "nothing to retrain" in run.data.tags["retrain.unchanged"]
    assert main(["retrain", "--config", str(config_file(store)), "--data", str(data_csv)]) == 0
    assert "unchanged nothing to retrain" in capsys.readouterr().out
    # The store's champion (version 1) was trained on other inputs, and this version lost to it.
    assert "was rejected against @champion (version 1)" in again.unchanged.reason
    forced = retrain_module.retrain(make_settings(store, retrain_unchanged=True), data_csv)
    assert forced.unchanged is None and forced.version.version not in before

    # The same inputs are not trained again once their version is champion, or its refit is.
    version = forced.version.version  # the latest version trained on these inputs
    client.set_registered_model_alias("forecaster", "champion", version)
    same = retrain_module.unchanged(client, settings, inputs)
    assert (same.version, same.champion) == (version, version)
    assert f"version {version}, trained on them, is @champion (retrain_unchanged" in same.reason
    source = client.get_model_version_download_uri("forecaster", "1")
    refit = str(
        client.create_model_version(
            "forecaster", source, run_id=None, tags={REFIT_OF: version}
        ).version
    )
    client.set_registered_model_alias("forecaster", "champion", refit)
    same = retrain_module.unchanged(client, settings, inputs)
    assert (same.version, same.champion) == (version, refit)
    assert f"(as its refit, version {refit})" in same.reason

    # A champion these inputs never challenged (rolled back to, or set by hand) is challenged.
    other = client.create_model_version("forecaster", source, run_id=None).version
    client.set_registered_model_alias("forecaster", "champion", other)
    assert retrain_module.unchanged(client, settings, inputs) is None

    # Anything that changes the model changes the inputs; uncommitted code is never trusted.
    changed = make_settings(store, train={"seed": 1})
    assert retrain_module.training_inputs(changed, first.fingerprint) != inputs
    assert retrain_module.training_inputs(settings, "sha256:other") != inputs
    assert retrain_module.training_inputs(settings, first.fingerprint) == inputs
    monkeypatch.setattr(retrain_module, "code_version", lambda: "git:0123456789ab-dirty")
    assert retrain_module.training_inputs(settings, first.fingerprint) is None


def test_every_run_records_the_data_it_read(store, data_csv, capsys, monkeypatch):
    """Evaluate and monitor runs, and a retrain that trained nothing, logged no params: their
    metrics and decisions could not be traced to the data they were computed on."""
    from pipelines import retrain as retrain_module
    from pipelines.tracking import KIND_TAG

    monkeypatch.setattr(retrain_module, "code_version", lambda: "git:0123456789ab")
    client = client_for(store)
    cfg = config_file(store)
    args = ["--config", str(cfg), "--data", str(data_csv)]
    assert main(["evaluate", *args, "--windows", "1"]) == 0
    assert main(["monitor", *args]) == 0
    assert main(["retrain", *args]) == 0
    capsys.readouterr()
    assert main(["retrain", *args]) == 0  # the same inputs again: trains nothing
    assert "unchanged" in capsys.readouterr().out
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        order_by=["attributes.start_time DESC"],
    )
    latest = {}
    for run in runs:
        latest.setdefault(run.data.tags.get(KIND_TAG), run)
    first = client.get_run(latest["retrain"].info.run_id)
    fingerprint = client.get_model_version("forecaster", "1").tags["data.fingerprint"]
    for kind in ("evaluate", "monitor", "retrain"):
        params = latest[kind].data.params
        assert params["data.fingerprint"] == fingerprint, (kind, params)
        assert params["data.source"] == str(data_csv.resolve()), kind
    assert latest["evaluate"].data.params["backtest.windows"] == "1"
    assert "retrain.unchanged" in first.data.tags
