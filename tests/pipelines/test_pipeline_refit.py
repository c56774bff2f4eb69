"""Refit on all data: after a promotion the champion is trained on every point."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from forecaster import Forecaster
from forecaster.config import HISTORY_BANDS
from pipelines.cli import main
from pipelines.registry import load_version, resolve_model
from pipelines.retrain import retrain
from tests.pipelines.pipeline_helpers import (
    PROMOTABLE_TRAIN,
    client_for,
    config_file,
    make_settings,
    synthetic,
)


def test_the_promoted_configuration_is_refit_on_all_data_and_serves(tmp_path):
    frame = synthetic()
    # Trained enough that the evaluated run keeps a trained epoch, which the refit replays.
    settings = make_settings(tmp_path, refit=True, train=PROMOTABLE_TRAIN)
    result = retrain(settings, frame)
    assert result.decision.promoted
    evaluated, refitted = result.version.version, result.refit_version.version
    assert (evaluated, refitted) == ("1", "2")
    client = client_for(tmp_path)
    tags = client.get_model_version("forecaster", refitted).tags
    last = pd.Timestamp(frame["ds"].max()).isoformat()
    assert tags["train.window_end"] == last  # it saw every point
    assert client.get_model_version("forecaster", evaluated).tags["train.window_end"] < last
    assert tags["refit.of_version"] == evaluated
    assert tags["train.glitches"] == "0"  # what the refit left out of all the data
    assert client.get_model_version("forecaster", evaluated).tags["refit.version"] == refitted
    assert tags["promotion.decision"] == "promoted"  # the evaluated twin's scores travel along
    description = client.get_model_version("forecaster", refitted).description
    assert description.startswith(f"Refit of version {evaluated} on all ")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    champion = resolve_model("models:/forecaster@champion", tracking_uri=uri)
    assert champion.version == refitted
    # The refit was never evaluated: @challenger stays on the evaluated twin, and the run
    # names both, each under its own tag.
    aliases = client.get_registered_model("forecaster").aliases
    assert {k: str(v) for k, v in aliases.items()} == {
        "champion": refitted,
        "challenger": evaluated,
    }
    run_tags = client.get_run(result.run_id).data.tags
    assert (run_tags["registered_version"], run_tags["refit_version"]) == (evaluated, refitted)
    # The refit version links to a run of its own, nested under the retrain's: its params are
    # the data it saw (all of it), not the evaluated training's split.
    refit_run = client.get_run(client.get_model_version("forecaster", refitted).run_id)
    assert refit_run.info.run_id != result.run_id and refit_run.info.status == "FINISHED"
    assert refit_run.data.tags["mlflow.parentRunId"] == result.run_id
    assert refit_run.info.run_name.startswith(f"refit of version {evaluated} 20")
    assert refit_run.data.params["data.end"] == last
    assert refit_run.data.params["train.replay_lr_factors"] != "None"
    assert "split.train_end" not in refit_run.data.params
    epochs = int(tags["train.epochs"])
    assert 1 <= epochs <= settings.train_config_obj().max_epochs
    assert len(client.get_metric_history(refit_run.info.run_id, "train_loss")) == epochs
    model = load_version(champion, tracking_uri=uri)
    forecast = model.predict(frame)
    assert forecast["ds"].min() > frame["ds"].max()
    # The refit has no held-out windows: its intervals keep the evaluated twin's calibration.
    twin = load_version(result.version, tracking_uri=uri)
    scales = twin.model.interval_scale.tolist()
    assert model.model.interval_scale.tolist() == scales
    run = client.get_run(client.get_model_version("forecaster", evaluated).run_id)
    # One metric per band of history: the long histories' factor, then the shorter bands'.
    assert run.data.metrics["interval_scale"] == pytest.approx(scales[-1])
    for name, scale in zip(("L/32", "L/16", "L/8", "L/4", "L/2"), scales[:-1], strict=True):
        assert run.data.metrics[f"interval_scale.history_up_to_{name}"] == pytest.approx(scale)
    assert "interval_scale.history_beyond_L/2" not in run.data.metrics
    # And its blend with drift, which the run records as a metric.
    assert model.model.drift_weight.item() == twin.model.drift_weight.item()
    assert run.data.metrics["drift_weight"] == pytest.approx(twin.model.drift_weight.item())
    # So does its reading of the left padding, which the run records.
    imputed = twin.model.padding_imputed.tolist()
    assert model.model.padding_imputed.tolist() == imputed
    bands = [b for b, i in zip(HISTORY_BANDS, imputed, strict=True) if i]
    assert run.data.tags["padding_imputed"] == (",".join(bands) or "none")


def test_refit_off_keeps_the_evaluated_version_as_champion(tmp_path, data_csv, capsys):
    cfg = config_file(tmp_path)
    assert main(["retrain", "--config", str(cfg), "--data", str(data_csv)]) == 0
    out = capsys.readouterr().out
    assert "refit     " not in out and "champion  forecaster v1" in out
    assert "glitches" not in out  # none in clean data


def test_retrain_prints_the_refit(tmp_path, data_csv, capsys):
    cfg = config_file(tmp_path)
    assert (
        main(["retrain", "--config", str(cfg), "--data", str(data_csv), "--set", "refit=true"]) == 0
    )
    out = capsys.readouterr().out
    assert "refit     forecaster v2: v1's configuration trained on all the data" in out
    assert "champion  forecaster v2" in out
    # rollback from a refit champion goes back past it, to nothing before the first champion
    assert main(["rollback", "--config", str(cfg)]) == 3


def test_a_refit_that_diverges_leaves_the_evaluated_version_champion(tmp_path, monkeypatch):
    """The refit goes straight to champion, unevaluated: one whose replay diverged would have
    served NaN. It is skipped, the run says why, and the evaluated version stays champion."""
    refit_config = Forecaster.refit_config

    def diverging(self):
        return dataclasses.replace(refit_config(self), learning_rate=1e6, replay_lr_factors=(1.0,))

    monkeypatch.setattr(Forecaster, "refit_config", diverging)
    result = retrain(make_settings(tmp_path, refit=True), synthetic())
    assert result.decision.promoted and result.refit_version is None
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    champion = resolve_model("models:/forecaster@champion", tracking_uri=uri)
    assert champion.version == result.version.version == "1"
    client = client_for(tmp_path)
    tags = client.get_run(result.run_id).data.tags
    assert "training loss nan" in tags["refit_skipped"]
    # The refit's own run ended as failed and says why, where its page is browsed.
    experiment = client.get_run(result.run_id).info.experiment_id
    (refit_run,) = client.search_runs(
        [experiment], filter_string=f"tags.mlflow.parentRunId = '{result.run_id}'"
    )
    assert refit_run.info.status == "FAILED"
    assert "training loss nan" in refit_run.data.tags["error"]
    versions = client_for(tmp_path).search_model_versions("name='forecaster'")
    assert [str(v.version) for v in versions] == ["1"]  # nothing half-registered


def test_a_refit_that_fails_otherwise_fails_the_retrain_and_says_so_in_its_run(
    tmp_path, monkeypatch
):
    """An error the refit does not expect is not swallowed: the retrain fails with it, the
    refit's run ends FAILED naming it, and the evaluated version, promoted, stays champion."""

    def broken(self):
        raise OSError("disk full")

    monkeypatch.setattr(Forecaster, "refit_config", broken)
    with pytest.raises(OSError, match="disk full"):
        retrain(make_settings(tmp_path, refit=True), synthetic())
    client = client_for(tmp_path)
    (refit_run,) = client.search_runs(
        [client.get_experiment_by_name("forecaster").experiment_id],
        filter_string="tags.mlflow.parentRunId != ''",
    )
    assert refit_run.info.status == "FAILED"
    assert refit_run.data.tags["error"] == "OSError: disk full"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert resolve_model("models:/forecaster@champion", tracking_uri=uri).version == "1"


def test_the_refit_says_promoted_only_once_it_is_champion(tmp_path, monkeypatch):
    """A run killed (SIGKILL, so nothing withdraws it) between registering the refit and moving
    the alias left a version without alias that said "promoted". The decision is tagged after
    the alias, as promotion tags it."""
    from mlflow.tracking import MlflowClient

    created: dict[str, dict[str, str]] = {}
    create = MlflowClient.create_model_version

    def recording(self, name, source, *args, **kwargs):
        version = create(self, name, source, *args, **kwargs)
        created[str(version.version)] = dict(kwargs.get("tags") or {})
        return version

    monkeypatch.setattr(MlflowClient, "create_model_version", recording)
    result = retrain(make_settings(tmp_path, refit=True), synthetic())
    refitted = result.refit_version.version
    assert "promotion.decision" not in created[refitted]
    assert "promotion.reason" in created[refitted]  # the scores travel at creation
    tags = client_for(tmp_path).get_model_version("forecaster", refitted).tags
    assert tags["promotion.decision"] == "promoted"
