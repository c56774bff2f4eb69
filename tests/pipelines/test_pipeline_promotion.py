"""Promotion rules, the decision tags, and rollback, on a copy of the champion store."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from pipelines.cli import main
from pipelines.errors import NoChallengerError
from pipelines.promote import promote
from pipelines.registry import resolve_model
from tests.pipelines.pipeline_helpers import client_for, config_file


def _aliases(root):
    model = client_for(root).get_registered_model("forecaster")
    return {k: str(v) for k, v in model.aliases.items()}


def test_promote_without_challenger_is_a_clear_error(tmp_path, data_csv, capsys):
    cfg = config_file(tmp_path)
    assert main(["promote", "--config", str(cfg), "--data", str(data_csv)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "forecaster@challenger not found" in err[0]
    with pytest.raises(NoChallengerError):
        promote(
            pd.read_csv(data_csv),
            model_name="forecaster",
            tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        )


def test_promotion_rules_and_rollback(store, data_csv, capsys):
    cfg = config_file(store)
    uri = f"sqlite:///{store / 'mlflow.db'}"
    # `train` registers a challenger (version 2) and leaves champion alone. Training is seeded
    # and deterministic on CPU, so version 2 scores exactly like version 1.
    assert main(["train", "--config", str(cfg), "--data", str(data_csv)]) == 0
    assert _aliases(store) == {"challenger": "2", "champion": "1"}

    # Equal is not better by a 10 % margin: rejected, reason recorded, champion stays.
    args = ["promote", "--config", str(cfg), "--data", str(data_csv)]
    assert main([*args, "--set", "promotion_margin=0.1"]) == 0
    assert "not promoted" in capsys.readouterr().out
    tags = client_for(store).get_model_version("forecaster", "2").tags
    assert tags["promotion.decision"] == "rejected"
    assert "margin 10.0%" in tags["promotion.reason"]
    assert tags["promotion.compared_with"] == "1"
    # Rollback reads this tag as the version a promotion replaced: a rejection replaced none.
    assert "promotion.previous_champion" not in tags
    assert float(tags["promotion.challenger_score"]) == pytest.approx(
        float(tags["promotion.champion_score"])
    )
    assert _aliases(store)["champion"] == "1"

    # A tie lowers nothing, with the paired test's p-value recorded.
    assert main([*args, "--set", "require_beats_baseline=false"]) == 0
    tags = client_for(store).get_model_version("forecaster", "2").tags
    assert tags["promotion.decision"] == "rejected"
    assert "not better than champion" in tags["promotion.reason"]
    assert tags["promotion.test"] == "wilcoxon"
    assert float(tags["promotion.p_value"]) == 1.0

    # With the test switched off, no margin and no baseline requirement, a tie still lowers
    # nothing: it was promoted as "significantly better" on every retrain.
    off = [*args, "--set", "require_beats_baseline=false", "--set", "promotion_alpha=1.0"]
    assert main(off) == 0
    tags = client_for(store).get_model_version("forecaster", "2").tags
    assert tags["promotion.decision"] == "rejected"
    assert "test off" in tags["promotion.reason"]
    assert _aliases(store)["champion"] == "1"

    # A weak version 3 made champion by name; version 2, clearly better, replaces it.
    weak = ["--set", "train.max_epochs=0", "--set", "model.linear_start=false"]
    assert main(["train", "--config", str(cfg), "--data", str(data_csv), *weak]) == 0
    rollback = ["rollback", "--config", str(cfg)]
    assert main([*rollback, "--to-version", "3"]) == 0
    client_for(store).set_registered_model_alias("forecaster", "challenger", "2")
    assert main(args) == 0
    promoted = client_for(store).get_model_version("forecaster", "2").tags
    assert promoted["promotion.decision"] == "promoted", promoted["promotion.reason"]
    assert promoted["promotion.previous_champion"] == "3"
    assert _aliases(store) == {"challenger": "2", "champion": "2"}
    capsys.readouterr()
    assert main(args) == 0  # already champion: nothing to do, and its record stays
    assert "already champion" in capsys.readouterr().out
    assert client_for(store).get_model_version("forecaster", "2").tags == promoted

    # Rollback goes back to the version it replaced, by promotion (2 over 3) or by name (3
    # over 1, above), and no further than the first champion.
    before = pd.Timestamp.now(tz="UTC").floor("s")
    assert main(rollback) == 0
    assert "v2 -> v3" in capsys.readouterr().out
    assert _aliases(store)["champion"] == "3"
    # The version rolled back from says when, and by which version.
    tags = client_for(store).get_model_version("forecaster", "2").tags
    assert tags["rollback.replaced_by"] == "3"
    assert before <= pd.Timestamp(tags["rollback.rolled_back_at"]) <= pd.Timestamp.now(tz="UTC")
    assert main(rollback) == 0
    assert "v3 -> v1" in capsys.readouterr().out
    assert main(rollback) == 3
    assert "first champion" in capsys.readouterr().err
    assert main([*rollback, "--to-version", "2"]) == 0
    assert resolve_model("models:/forecaster@champion", tracking_uri=uri).version == "2"
    assert main(rollback) == 0  # a rollback by name is undone by a plain one
    assert "v2 -> v1" in capsys.readouterr().out
    assert main([*rollback, "--to-version", "2"]) == 0
    assert main([*rollback, "--to-version", "7"]) == 3
    assert resolve_model("models:/forecaster@champion", tracking_uri=uri).version == "2"
    # Naming the champion changes nothing: it is not marked as rolled back by itself.
    record = client_for(store).get_model_version("forecaster", "2").tags
    capsys.readouterr()
    assert main([*rollback, "--to-version", "2"]) == 0
    assert "already: nothing changed" in capsys.readouterr().out
    assert client_for(store).get_model_version("forecaster", "2").tags == record

    # A model that lost its champion gets one back from a named version.
    client_for(store).delete_registered_model_alias("forecaster", "champion")
    capsys.readouterr()
    assert main(rollback) == 3  # nothing to go back from
    assert main([*rollback, "--to-version", "1"]) == 0
    assert "none -> v1" in capsys.readouterr().out
    assert resolve_model("models:/forecaster@champion", tracking_uri=uri).version == "1"


def test_another_seed_on_the_same_data_does_not_move_the_champion(store, data_csv, capsys):
    cfg = config_file(store)
    args = ["--config", str(cfg), "--data", str(data_csv)]
    assert main(["train", *args, "--set", "train.seed=1"]) == 0
    assert main(["promote", *args]) == 0
    tags = client_for(store).get_model_version("forecaster", "2").tags
    assert tags["promotion.decision"] == "rejected", tags["promotion.reason"]
    assert float(tags["promotion.p_value"]) >= 0.05
    assert _aliases(store)["champion"] == "1"


def test_a_clearly_better_challenger_is_promoted_with_its_p_value(tmp_path, data_csv, capsys):
    cfg = config_file(tmp_path)
    args = ["--config", str(cfg), "--data", str(data_csv)]
    # A deliberately weak champion: no linear start and no training forecasts the window mean.
    weak = ["--set", "train.max_epochs=0", "--set", "model.linear_start=false"]
    assert main(["train", *args, *weak]) == 0
    assert main(["promote", *args, "--set", "require_beats_baseline=false"]) == 0
    assert _aliases(tmp_path)["champion"] == "1"
    assert main(["train", *args]) == 0
    assert main(["promote", *args]) == 0
    tags = client_for(tmp_path).get_model_version("forecaster", "2").tags
    assert tags["promotion.decision"] == "promoted", tags["promotion.reason"]
    assert float(tags["promotion.p_value"]) < 0.05
    assert int(tags["promotion.test_pairs"]) == 4 * 3  # every series in every window
    assert float(tags["promotion.challenger_score"]) < float(tags["promotion.champion_score"])
    assert _aliases(tmp_path)["champion"] == "2"


def test_an_unloadable_champion_is_judged_absent_not_a_crash(store, data_csv, tmp_path, capsys):
    """A champion whose weights are corrupt must not block every later retrain."""
    client = client_for(store)
    source = client.get_model_version_download_uri("forecaster", "1")
    broken = tmp_path / "broken-model"
    shutil.copytree(source.removeprefix("file://"), broken)
    weights = next(broken.rglob("model.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    version = client.create_model_version("forecaster", str(broken), run_id=None).version
    client.set_registered_model_alias("forecaster", "champion", version)

    cfg = config_file(store)
    args = ["--config", str(cfg), "--data", str(data_csv)]
    assert main(["train", *args]) == 0
    assert main(["promote", *args]) == 0
    challenger = _aliases(store)["challenger"]
    tags = client.get_model_version("forecaster", challenger).tags
    assert f"champion version {version} cannot be loaded" in tags["promotion.reason"]
    assert tags["promotion.decision"] == "promoted", tags["promotion.reason"]
    assert _aliases(store)["champion"] == challenger
    # Rolling back would serve the version known to be unloadable: refused, champion kept.
    capsys.readouterr()
    assert main(["rollback", "--config", str(cfg)]) == 3
    assert f"version {version}): its artifacts cannot be loaded" in capsys.readouterr().err
    assert _aliases(store)["champion"] == challenger
    # Nor is it named champion of a model that has lost its champion.
    client.delete_registered_model_alias("forecaster", "champion")
    assert main(["rollback", "--config", str(cfg), "--to-version", str(version)]) == 3
    assert f"version {version}): its artifacts cannot be loaded" in capsys.readouterr().err
    assert "champion" not in _aliases(store)


def test_a_champion_whose_artifacts_are_gone_is_judged_absent(store, data_csv, tmp_path):
    """Artifacts deleted from the store under a registered champion (a cleaned bucket, a lost
    disk) must not block every later retrain either."""
    client = client_for(store)
    source = client.get_model_version_download_uri("forecaster", "1")
    gone = tmp_path / "gone-model"
    shutil.copytree(source.removeprefix("file://"), gone)
    version = client.create_model_version("forecaster", str(gone), run_id=None).version
    client.set_registered_model_alias("forecaster", "champion", version)
    shutil.rmtree(gone)

    args = ["--config", str(config_file(store)), "--data", str(data_csv)]
    assert main(["train", *args]) == 0
    assert main(["promote", *args]) == 0
    challenger = _aliases(store)["challenger"]
    tags = client.get_model_version("forecaster", challenger).tags
    assert f"champion version {version} cannot be loaded" in tags["promotion.reason"]
    assert tags["promotion.decision"] == "promoted", tags["promotion.reason"]


def test_a_champion_whose_files_cannot_be_read_is_judged_absent(store, data_csv, tmp_path):
    """A file of the champion's that the file system cannot read (here a link into a mount that
    is gone) fails its download with an OSError, not MLflow's not-found: it must not block
    every later retrain either."""
    client = client_for(store)
    source = client.get_model_version_download_uri("forecaster", "1")
    broken = tmp_path / "broken-model"
    shutil.copytree(source.removeprefix("file://"), broken)
    weights = broken / "artifacts" / "forecaster" / "model.safetensors"
    weights.unlink()
    weights.symlink_to(tmp_path / "unmounted" / weights.name)
    version = client.create_model_version("forecaster", str(broken), run_id=None).version
    client.set_registered_model_alias("forecaster", "champion", version)

    args = ["--config", str(config_file(store)), "--data", str(data_csv)]
    assert main(["train", *args]) == 0
    assert main(["promote", *args]) == 0
    challenger = _aliases(store)["challenger"]
    tags = client.get_model_version("forecaster", challenger).tags
    assert f"champion version {version} cannot be loaded" in tags["promotion.reason"]
    assert tags["promotion.decision"] == "promoted", tags["promotion.reason"]


def test_a_longer_horizon_challenger_is_judged_on_the_champions_horizon(store, data_csv):
    """The two are compared on the same windows: the horizon both forecast (the champion's
    12 steps), not the challenger's 24, which the champion cannot forecast."""
    args = ["--config", str(config_file(store)), "--data", str(data_csv)]
    assert main(["train", *args, "--set", "model.prediction_length=24"]) == 0
    assert main(["promote", *args]) == 0
    tags = client_for(store).get_model_version("forecaster", "2").tags
    assert tags["promotion.compared_with"] == "1"
    assert "over the last 3 x 12 points" in tags["promotion.reason"], tags["promotion.reason"]


def test_a_named_version_is_judged_not_whatever_challenger_names_by_then(store, data_csv):
    """Retrain judges the version it registered: another run (from another directory, whose
    lock file is another) may have moved @challenger to its own version meanwhile."""
    cfg = config_file(store)
    uri = f"sqlite:///{store / 'mlflow.db'}"
    args = ["--config", str(cfg), "--data", str(data_csv)]
    assert main(["train", *args]) == 0
    assert main(["train", *args, "--set", "train.seed=1"]) == 0  # the other run's
    assert _aliases(store)["challenger"] == "3"
    decision = promote(
        pd.read_csv(data_csv), model_name="forecaster", version="2", tracking_uri=uri
    )
    assert decision.challenger.version == "2"
    client = client_for(store)
    assert "promotion.decision" in client.get_model_version("forecaster", "2").tags
    assert "promotion.decision" not in client.get_model_version("forecaster", "3").tags


def test_a_stop_before_the_alias_moves_leaves_no_promoted_tag(tmp_path, data_csv, monkeypatch):
    """Stopped between the decision and the alias, v2 said "promoted" for good while v1 stayed
    champion. The decision is tagged after the alias moves."""
    from mlflow.tracking import MlflowClient

    store = tmp_path
    cfg = config_file(store)
    args = ["--config", str(cfg), "--data", str(data_csv)]
    weak = ["--set", "train.max_epochs=0", "--set", "model.linear_start=false"]
    assert main(["train", *args, *weak]) == 0
    assert main(["promote", *args, "--set", "require_beats_baseline=false"]) == 0
    assert main(["train", *args]) == 0  # clearly better than the weak champion

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", stopped)
    with pytest.raises(KeyboardInterrupt):
        promote(
            pd.read_csv(data_csv),
            model_name="forecaster",
            alpha=1.0,
            require_beats_baseline=False,
            tracking_uri=f"sqlite:///{store / 'mlflow.db'}",
        )
    monkeypatch.undo()
    assert "promotion.decision" not in client_for(store).get_model_version("forecaster", "2").tags
    assert _aliases(store)["champion"] == "1"


def test_a_rollback_whose_alias_fails_records_no_rollback(store, monkeypatch):
    """The registry refuses the alias: the champion stays, and the version it would have
    replaced does not say it was rolled back (the record is written after the alias)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = client_for(store)
    source = client.get_model_version_download_uri("forecaster", "1")
    other = str(client.create_model_version("forecaster", source, run_id=None).version)

    def refused(self, *args, **kwargs):
        raise MlflowException("the registry is read-only")

    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", refused)
    with pytest.raises(MlflowException, match="read-only"):  # exit 1, with its traceback
        main(["rollback", "--config", str(config_file(store)), "--to-version", other])
    assert _aliases(store)["champion"] == "1"
    tags = client.get_model_version("forecaster", "1").tags
    assert not [key for key in tags if key.startswith("rollback.")]
