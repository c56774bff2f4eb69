"""The high-level Forecaster API: fit, predict, persistence, attention, errors."""

import json
import os
import signal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster import forecaster as forecaster_module
from forecaster.config import N_HISTORY_BANDS, config_from_dict, config_to_dict
from forecaster.data import load_frame
from forecaster.errors import (
    AmbiguousSeriesIdsError,
    DuplicateTimestampsError,
    ForecasterInputError,
    FrequencyInferenceError,
    HorizonTooLongError,
    InvalidConfigError,
    InvalidTimestampsError,
    IrregularTimestampsError,
    MissingCovariatesError,
    MissingValuesError,
    ModelCodeMismatchError,
    ModelFileError,
    NonNumericValuesError,
    SeriesTooShortError,
    UnknownQuantileError,
)
from forecaster.synthetic import PROMO, generate_synthetic
from tests.forecaster.conftest import TINY_MODEL, TINY_TRAIN
from tests.saved_models import reseal


def test_predict_returns_long_frame_with_quantiles(fitted, series):
    forecast = fitted.predict(series)
    assert list(forecast.columns) == ["unique_id", "ds", "mean", "q0.1", "q0.5", "q0.9"]
    assert len(forecast) == series["unique_id"].nunique() * 8
    last = series.groupby("unique_id")["ds"].max()
    first_forecast = forecast.groupby("unique_id")["ds"].min()
    assert (first_forecast - last[first_forecast.index] == pd.Timedelta(hours=1)).all()
    assert np.isfinite(forecast[["mean", "q0.1", "q0.5", "q0.9"]].to_numpy()).all()
    assert (forecast["q0.1"] <= forecast["q0.9"]).all()


def test_predict_shorter_horizon_and_subset_of_quantiles(fitted, series):
    full = fitted.predict(series)
    short = fitted.predict(series, horizon=3, quantiles=[0.9])
    assert list(short.columns) == ["unique_id", "ds", "mean", "q0.9"]
    assert short.groupby("unique_id").size().eq(3).all()
    head = full.groupby("unique_id").head(3).reset_index(drop=True)
    np.testing.assert_array_equal(short["mean"].to_numpy(), head["mean"].to_numpy())


def test_model_beats_naive_on_seasonal_data(series):
    history = series.groupby("unique_id").head(24 * 12)
    future = series.groupby("unique_id").tail(24 * 2).groupby("unique_id").head(8)
    model = Forecaster(
        ModelConfig(**TINY_MODEL), TrainConfig(**{**TINY_TRAIN, "max_epochs": 4})
    ).fit(history)
    forecast = model.predict(history).merge(future, on=["unique_id", "ds"])
    last = history.groupby("unique_id")["y"].last()
    naive = forecast["unique_id"].map(last)
    model_mae = (forecast["mean"] - forecast["y"]).abs().mean()
    naive_mae = (naive - forecast["y"]).abs().mean()
    assert model_mae < naive_mae


def test_code_that_forecasts_differently_refuses_the_model(fitted, tmp_path, monkeypatch):
    fitted.save(tmp_path / "model")
    Forecaster.load(tmp_path / "model")  # the code that saved it reproduces its reference
    # A change of the forward pass, as a code upgrade could bring: a shifted scaler.
    original = Forecaster._forward

    def drifted(self, *args):
        output = original(self, *args)
        return type(output)(output.mean * 1.01, output.quantiles)

    monkeypatch.setattr(Forecaster, "_forward", drifted)
    with pytest.raises(ModelCodeMismatchError, match="reference forecast"):
        Forecaster.load(tmp_path / "model")
    assert Forecaster.load(tmp_path / "model", verify=False).is_fitted


def test_code_whose_intervals_differ_refuses_the_model(fitted, tmp_path, monkeypatch):
    """The quantiles are replayed too, so a change of the interval path alone is caught; a
    reference saved before quantiles were kept (mean only) still verifies the mean."""
    fitted.save(tmp_path / "model")
    original = Forecaster._forward

    def wider(self, *args):
        output = original(self, *args)
        mean = output.mean.unsqueeze(-1)
        return type(output)(output.mean, mean + 1.1 * (output.quantiles - mean))

    monkeypatch.setattr(Forecaster, "_forward", wider)
    with pytest.raises(ModelCodeMismatchError, match="quantiles: largest difference"):
        Forecaster.load(tmp_path / "model")
    reference = tmp_path / "model" / "reference.json"
    reference.write_text(json.dumps({"mean": json.loads(reference.read_text())["mean"]}))
    reseal(tmp_path / "model")
    assert Forecaster.load(tmp_path / "model").is_fitted


def test_save_load_predicts_bit_identically(fitted, series, tmp_path):
    fitted.save(tmp_path / "model")
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [
        "config.json",
        "model.safetensors",
        "reference.json",
    ]
    reloaded = Forecaster.load(tmp_path / "model")
    pd.testing.assert_frame_equal(
        reloaded.predict(series), fitted.predict(series), check_exact=True
    )
    gappy = _with_gaps(series)
    pd.testing.assert_frame_equal(reloaded.predict(gappy), fitted.predict(gappy), check_exact=True)
    assert reloaded.freq == "h"
    assert (
        json.loads((tmp_path / "model" / "config.json").read_text())["model_config"][
            "context_length"
        ]
        == 32
    )


def test_a_model_trained_on_a_gpu_loads_where_there_is_none(fitted, series, tmp_path):
    """The device a model trained on is not where it must serve: load picks "auto"."""
    path = fitted.save(tmp_path / "model")
    meta = json.loads((path / "config.json").read_text())
    meta["train_config"]["device"] = "cuda"
    (path / "config.json").write_text(json.dumps(meta))
    reloaded = Forecaster.load(path)
    assert reloaded.train_config.device == "auto"
    pd.testing.assert_frame_equal(reloaded.predict(series), fitted.predict(series))


def _damage(directory: Path, how: str, other: Path) -> str:
    """Damage a saved model `how`; the file the error must name."""
    weights, config = directory / "model.safetensors", directory / "config.json"
    if how == "no_config":
        config.unlink()
        return "no config.json"
    if how == "cut_config":
        config.write_bytes(config.read_bytes()[:100])
        return f"{config}: not valid JSON"
    if how == "cut_weights":
        weights.write_bytes(weights.read_bytes()[:1000])
        return f"{weights}: does not match the checksum"
    if how == "weights_of_another_save":  # a save that died between its renames
        weights.write_bytes((other / "model.safetensors").read_bytes())
        return f"{weights}: does not match the checksum"
    if how == "no_reference":
        (directory / "reference.json").unlink()
        return f"{directory / 'reference.json'}: is missing"
    if how in ("null_model_config", "null_freq"):  # a TypeError, an AttributeError before
        meta = json.loads(config.read_text())
        key = how.removeprefix("null_")
        meta[key] = None
        config.write_text(json.dumps(meta))
        return f"{config}: 'freq' is None" if key == "freq" else f"{config}: no 'model_config'"
    assert how == "cut_weights_saved_before_checksums"
    meta = json.loads(config.read_text())
    del meta["sha256"]
    config.write_text(json.dumps(meta))
    weights.write_bytes(weights.read_bytes()[:1000])
    return f"{weights}: not readable as safetensors"


@pytest.mark.parametrize(
    "how",
    [
        "no_config",
        "cut_config",
        "cut_weights",
        "weights_of_another_save",
        "no_reference",
        "cut_weights_saved_before_checksums",
        "null_model_config",
        "null_freq",
    ],
)
def test_a_damaged_model_directory_is_refused_naming_the_file(fitted, series, tmp_path, how):
    """Damaged files gave raw JSON or safetensors errors naming no file, and files of two saves
    (one that died between its renames) were blamed on the code (ModelCodeMismatchError)."""
    fitted.save(tmp_path / "model")
    Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**{**TINY_TRAIN, "seed": 1})).fit(
        series
    ).save(tmp_path / "other")
    needle = _damage(tmp_path / "model", how, tmp_path / "other")
    with pytest.raises(ModelFileError) as error:
        Forecaster.load(tmp_path / "model")
    assert needle in str(error.value)


def test_a_file_is_not_a_model_directory(fitted, tmp_path):
    fitted.save(tmp_path / "model")
    with pytest.raises(ModelFileError, match="config.json: a file; expected a directory"):
        Forecaster.load(tmp_path / "model" / "config.json")  # a NotADirectoryError before


def test_only_the_forecaster_that_trained_gives_its_refit_config(fitted, tmp_path):
    """A loaded model returned a config that trained the linear start alone, uncalibrated."""
    assert fitted.refit_config().interval_scale == fitted.train_result.interval_scale
    fitted.save(tmp_path / "model")
    with pytest.raises(RuntimeError, match="refit_config needs the path this Forecaster"):
        Forecaster.load(tmp_path / "model").refit_config()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ((TrainConfig(), ModelConfig()), "model_config: expected a ModelConfig"),  # swapped
        (({"context_length": 48},), "model_config: expected a ModelConfig .* got dict"),
        ((ModelConfig(), {"max_epochs": 1}), "train_config: expected a TrainConfig .* got dict"),
    ],
)
def test_a_config_of_the_wrong_kind_is_named(args, named):
    """They failed later with "'dict' object has no attribute 'covariates'"."""
    with pytest.raises(InvalidConfigError, match=named):
        Forecaster(*args)


@pytest.mark.parametrize(
    ("freq", "prediction_length", "context_length"),
    [
        ("h", 1, 96),
        ("h", 13, 96),
        ("D", 14, 98),
        ("MS", 18, 126),
        ("h", 48, 336),
        ("h", 96, 336),
        ("h", 720, 336),
        ("W-SUN", 13, 156),
        ("15min", 12, 288),
        ("5min", 12, 336),
    ],
)
def test_the_default_context_is_seven_horizons_and_three_seasons_within_96_and_336_steps(
    freq, prediction_length, context_length
):
    """Daily data forecast 14 days ahead reads 98 days, not 336 (README, Daily data); weekly
    data a quarter ahead three years (README, Short catalogues); M4 Hourly (48) and the long
    horizons read 336 as before; a short horizon keeps 96 steps."""
    config = ModelConfig(prediction_length=prediction_length)
    assert config.context_length is None  # left to the data, like the patch and the season
    assert config_from_dict(ModelConfig, config_to_dict(config)) == config
    resolved = config.for_frequency(freq)
    assert resolved.context_length == context_length
    assert config_from_dict(ModelConfig, config_to_dict(resolved)) == resolved
    given = ModelConfig(prediction_length=prediction_length, context_length=500)
    assert given.for_frequency(freq).context_length == 500


@pytest.mark.parametrize(("freq", "expected"), [("h", 168), ("30min", 336), ("D", 1), ("MS", 1)])
def test_fit_resolves_the_long_season_from_the_frequency(freq, expected):
    """Sub-daily data gets its week as a second cycle unless the config names one."""
    assert ModelConfig().for_frequency(freq).long_season_length == expected
    assert ModelConfig(long_season_length=1).for_frequency(freq).long_season_length == 1


def test_fit_reads_the_context_the_data_frequency_resolves(series, tmp_path):
    """A weekly catalogue trains and forecasts from three years, an hourly one from 96 hours
    at a short horizon; the saved config holds the number."""
    weekly = generate_synthetic(n_series=4, n_steps=200, freq="W-SUN", seed=0)
    model = {**TINY_MODEL, "context_length": None}
    for frame, expected in ((weekly, 156), (series, 96)):
        fitted = Forecaster(ModelConfig(**model), TrainConfig(**TINY_TRAIN)).fit(frame)
        assert fitted.context_length == expected
        assert fitted.predict(frame).groupby("unique_id").size().eq(8).all()
        fitted.save(tmp_path / str(expected))
        assert Forecaster.load(tmp_path / str(expected)).context_length == expected


def test_an_interrupted_save_leaves_the_model_saved_before(fitted, series, tmp_path, monkeypatch):
    """Ctrl-C while a save over an existing model writes: the old model loads as it was, and
    no partial file is left. Once every file is written, the renames hold a real SIGINT until
    all three are done."""
    fitted.save(tmp_path / "model")
    before = fitted.predict(series)
    other = Forecaster(ModelConfig(**{**TINY_MODEL, "d_model": 8}), TrainConfig(**TINY_TRAIN)).fit(
        series
    )
    write = forecaster_module._write_file

    def interrupted(target, data):
        if target.name == ".config.json.partial":  # the weights and reference already written
            raise KeyboardInterrupt
        return write(target, data)

    monkeypatch.setattr(forecaster_module, "_write_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        other.save(tmp_path / "model")
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [
        "config.json",
        "model.safetensors",
        "reference.json",
    ]
    pd.testing.assert_frame_equal(Forecaster.load(tmp_path / "model").predict(series), before)

    replace = Path.replace

    def signalled(self, target):
        os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C before the first rename
        return replace(self, target)

    monkeypatch.setattr(Path, "replace", signalled)
    with pytest.raises(KeyboardInterrupt):
        other.save(tmp_path / "model")
    monkeypatch.undo()
    pd.testing.assert_frame_equal(
        Forecaster.load(tmp_path / "model").predict(series), other.predict(series)
    )


def test_a_loaded_model_saved_again_keeps_its_training_record(fitted, tmp_path):
    """A registry copy, a model moved between stores: the record of its training (best
    epoch, validation losses, the linear start's ridge...) was written as null."""
    fitted.save(tmp_path / "first")
    Forecaster.load(tmp_path / "first").save(tmp_path / "second")
    first, second = (
        json.loads((tmp_path / name / "config.json").read_text())["training"]
        for name in ("first", "second")
    )
    assert first is not None and first["best_val_loss"] is not None
    assert second == first


def test_short_histories_are_imputed_and_models_saved_before_that_load(series, tmp_path):
    """With `impute_padding` a history shorter than the context forecasts alike after save ->
    load, and unlike with the padding read as the mean. A model saved before the choice was
    made per band of history imputed in every band and still does; one saved before the left
    padding could be imputed has no factor and reads its padding as 0, as it did."""
    eye = torch.eye(TINY_MODEL["context_length"] + 1)
    config = TrainConfig(**TINY_TRAIN, impute_padding=True)
    model = Forecaster(ModelConfig(**TINY_MODEL), config).fit(series)
    assert not torch.equal(model.model.padding_factor, eye)  # the fit installed its factor
    assert model.model.imputes_padding()
    assert model.train_result.impute_padding == (True,) * N_HISTORY_BANDS
    short = series.groupby("unique_id").tail(20)  # 20 of the 32 context steps
    model.save(tmp_path / "model")
    reloaded = Forecaster.load(tmp_path / "model")
    imputed = model.predict(short)
    pd.testing.assert_frame_equal(reloaded.predict(short), imputed, check_exact=True)

    def saved_without(key: str, name: str) -> Forecaster:
        model.save(tmp_path / name)
        weights_file = tmp_path / name / "model.safetensors"
        save_file({k: v for k, v in load_file(weights_file).items() if k != key}, weights_file)
        reseal(tmp_path / name)
        return Forecaster.load(tmp_path / name)

    before_bands = saved_without("padding_imputed", "before_bands")
    pd.testing.assert_frame_equal(before_bands.predict(short), imputed, check_exact=True)

    model.model.padding_imputed.fill_(False)
    as_zero = model.predict(short)
    assert not np.allclose(as_zero["mean"], imputed["mean"])
    model.model.padding_factor.copy_(eye)
    before_factor = saved_without("padding_factor", "before_factor")
    pd.testing.assert_frame_equal(before_factor.predict(short), as_zero, check_exact=True)


def test_the_reading_of_the_padding_is_chosen_on_validation_and_refits_replay_it(fitted, series):
    """By default each band of history reads its padding as validation chose, a refit replays
    that choice, and a model that never imputes skips the imputation."""
    result = fitted.train_result
    assert fitted.train_config.impute_padding is None
    assert tuple(fitted.model.padding_imputed.tolist()) == result.impute_padding
    assert fitted.refit_config().impute_padding == result.impute_padding
    never = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN, impute_padding=False))
    assert not never.fit(series).model.imputes_padding()


@pytest.mark.parametrize("freq", ["W-SUN", "MS", "QE", "YS", "B", "2MS", "6ME"])
def test_save_load_on_anchored_frequencies(freq, tmp_path):
    """The reference history saved beside the weights lies on the data's grid."""
    data = generate_synthetic(n_series=2, n_steps=40, freq=freq, seed=0)
    config = ModelConfig(**{**TINY_MODEL, "context_length": 12, "prediction_length": 4})
    model = Forecaster(config, TrainConfig(**{**TINY_TRAIN, "max_epochs": 1})).fit(data)
    model.save(tmp_path / "model")
    reloaded = Forecaster.load(tmp_path / "model")
    pd.testing.assert_frame_equal(reloaded.predict(data), model.predict(data), check_exact=True)


def test_monthly_data_on_the_15th_forecasts_the_15th_and_saves(tmp_path):
    """Rent, billing and reports fall on a day inside the month: 'MD', a step of months from
    each series' own day, with the monthly season and patch."""
    data = generate_synthetic(n_series=2, n_steps=60, freq="MD", start="2019-01-15", seed=0)
    config = ModelConfig(**{**TINY_MODEL, "context_length": 24, "patch_length": None})
    model = Forecaster(config, TrainConfig(**{**TINY_TRAIN, "max_epochs": 1})).fit(data)
    assert model.freq == "MD" and model.model_config.season_length == 12
    assert model.model_config.patch_length == 12
    forecast = model.predict(data)
    assert set(forecast["ds"].dt.day) == {15}
    assert forecast["ds"].min() == pd.Timestamp("2024-01-15")
    reloaded = Forecaster.load(model.save(tmp_path / "model"))
    pd.testing.assert_frame_equal(reloaded.predict(data), forecast, check_exact=True)


@pytest.mark.parametrize("freq", ["ms", "us"])
def test_sub_millisecond_steps_fit_and_forecast(freq, tmp_path):
    """A cycle of a minute of microseconds (60 million steps) once made fit allocate
    terabytes; such data has no cycle the model reads."""
    data = generate_synthetic(n_series=2, n_steps=80, freq=freq, seed=0)
    config = ModelConfig(**{**TINY_MODEL, "patch_length": None})
    model = Forecaster(config, TrainConfig(**{**TINY_TRAIN, "max_epochs": 1})).fit(data)
    forecast = model.predict(data)
    assert np.isfinite(forecast["mean"]).all()
    step = pd.Timedelta(1, unit=freq)
    last = data.groupby("unique_id")["ds"].max()
    assert (forecast.groupby("unique_id")["ds"].min() == last + step).all()


def test_timestamps_nanoseconds_apart_are_refused_for_integer_steps():
    """A step of nanoseconds is the integer axis (`time_axis.is_integer_axis`): timestamps
    that close are told to come as integers, not read as a second kind of step."""
    data = pd.DataFrame(
        {"unique_id": "a", "ds": pd.date_range("2024-01-01", periods=80, freq="ns"), "y": 1.0}
    )
    with pytest.raises(FrequencyInferenceError, match="1 ns apart.*integer ds"):
        Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN)).fit(data)


def test_a_yearly_model_with_a_long_context_saves_and_loads(tmp_path):
    """336 years of reference history from 2020 would pass pandas' last timestamp (2262):
    such a model (the default context on yearly data) once could not be saved at all."""
    data = generate_synthetic(n_series=2, n_steps=30, freq="YS", seed=0)
    config = ModelConfig(**{**TINY_MODEL, "context_length": 336, "patch_length": 16})
    model = Forecaster(config, TrainConfig(**{**TINY_TRAIN, "max_epochs": 0})).fit(data)
    reloaded = Forecaster.load(model.save(tmp_path / "model"))
    pd.testing.assert_frame_equal(reloaded.predict(data), model.predict(data), check_exact=True)


def test_the_interval_scale_is_saved_and_a_model_saved_before_it_loads(series, tmp_path):
    config = TrainConfig(**{**TINY_TRAIN, "max_epochs": 1, "interval_scale": 1.5})
    model = Forecaster(ModelConfig(**TINY_MODEL), config).fit(series)
    model.save(tmp_path / "model")
    reloaded = Forecaster.load(tmp_path / "model")
    assert reloaded.model.interval_scale.tolist() == [1.5] * N_HISTORY_BANDS
    pd.testing.assert_frame_equal(reloaded.predict(series), model.predict(series), check_exact=True)
    meta_file, weights_file = (
        tmp_path / "model" / "config.json",
        tmp_path / "model" / "model.safetensors",
    )
    # A model saved with one factor for every band of history (before the bands) loads with it.
    weights = load_file(weights_file)
    weights["interval_scale"] = torch.tensor(1.5)
    save_file(weights, weights_file)
    reseal(tmp_path / "model")
    one_factor = Forecaster.load(tmp_path / "model")
    pd.testing.assert_frame_equal(
        one_factor.predict(series), model.predict(series), check_exact=True
    )
    # A model saved before the scale existed has neither the field nor the tensor: it
    # forecasts as it always did, with a scale of 1.
    meta = json.loads(meta_file.read_text())
    del meta["train_config"]["interval_scale"]
    meta_file.write_text(json.dumps(meta))
    weights = load_file(weights_file)
    del weights["interval_scale"]
    save_file(weights, weights_file)
    reference = tmp_path / "model" / "reference.json"  # which held the mean only
    reference.write_text(json.dumps({"mean": json.loads(reference.read_text())["mean"]}))
    reseal(tmp_path / "model")
    older = Forecaster.load(tmp_path / "model")
    model.model.interval_scale.fill_(1.0)
    pd.testing.assert_frame_equal(older.predict(series), model.predict(series), check_exact=True)


def test_the_drift_weight_is_saved_replayed_and_a_model_saved_before_it_loads(series, tmp_path):
    config = TrainConfig(**{**TINY_TRAIN, "max_epochs": 1, "drift_weight": 0.4})
    model = Forecaster(ModelConfig(**TINY_MODEL), config).fit(series)
    assert model.refit_config().drift_weight == model.train_result.drift_weight == 0.4
    reloaded = Forecaster.load(model.save(tmp_path / "model"))
    assert reloaded.model.drift_weight.item() == pytest.approx(0.4)
    pd.testing.assert_frame_equal(reloaded.predict(series), model.predict(series), check_exact=True)
    # A model saved before the blend has neither the field nor the tensor: no blend.
    meta_file = tmp_path / "model" / "config.json"
    weights_file = tmp_path / "model" / "model.safetensors"
    meta = json.loads(meta_file.read_text())
    del meta["train_config"]["drift_weight"]
    meta_file.write_text(json.dumps(meta))
    weights = load_file(weights_file)
    del weights["drift_weight"]
    save_file(weights, weights_file)
    model.model.drift_weight.zero_()
    # Its reference forecast, which load verifies, was made without a blend.
    reference = {k: v.tolist() for k, v in model._reference_forecast().items()}
    (tmp_path / "model" / "reference.json").write_text(json.dumps(reference))
    reseal(tmp_path / "model")
    older = Forecaster.load(tmp_path / "model")
    pd.testing.assert_frame_equal(older.predict(series), model.predict(series), check_exact=True)


def test_a_model_saved_before_the_naive_head_loads_and_forecasts_as_before(series, tmp_path):
    """Its config has no `naive_head` field and its weights no such head: it loads with a
    head that leaves the draft as it is, and forecasts the draft and its correction, as that
    model always did."""
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN)).fit(series)
    with torch.no_grad():  # what the older model was: all the blend's weight on the draft
        model.model.naive_head.weight.zero_()
        model.model.naive_head.bias.zero_()
    model.save(tmp_path / "model")
    meta_file = tmp_path / "model" / "config.json"
    meta = json.loads(meta_file.read_text())
    del meta["model_config"]["naive_head"]
    del meta["model_config"]["naive_blend"]
    meta_file.write_text(json.dumps(meta))
    weights_file = tmp_path / "model" / "model.safetensors"
    weights = {k: v for k, v in load_file(weights_file).items() if not k.startswith("naive")}
    save_file(weights, weights_file)
    reseal(tmp_path / "model")
    older = Forecaster.load(tmp_path / "model")  # replays the saved reference forecast
    pd.testing.assert_frame_equal(older.predict(series), model.predict(series), check_exact=True)


def test_a_model_saved_with_the_softmax_naive_head_loads_and_forecasts_as_before(series, tmp_path):
    """Its config has `naive_head` but no `naive_blend`: it loads with the softmax it was
    trained with, not with gates that would read its weights otherwise."""
    config = ModelConfig(**{**TINY_MODEL, "naive_blend": "softmax"})
    model = Forecaster(config, TrainConfig(**TINY_TRAIN)).fit(series)
    with torch.no_grad():  # a head that has moved off the draft, so the blend shows
        torch.nn.init.normal_(model.model.naive_head.weight, std=1.0)
    model.save(tmp_path / "model")
    meta_file = tmp_path / "model" / "config.json"
    meta = json.loads(meta_file.read_text())
    del meta["model_config"]["naive_blend"]
    meta_file.write_text(json.dumps(meta))
    older = Forecaster.load(tmp_path / "model")  # replays the saved reference forecast
    assert older.model_config.naive_blend == "softmax"
    pd.testing.assert_frame_equal(older.predict(series), model.predict(series), check_exact=True)


@pytest.mark.parametrize(
    ("field", "before", "changes"),
    [
        # It learned its bands in the std; a history shorter than a season keeps the band.
        ("short_history_band_unit", "std", {}),
        # Its naive head learned the drift read over the span (24 at H = 2), which a history
        # shorter than the span keeps.
        ("observed_drift", False, {"prediction_length": 2}),
    ],
)
def test_a_model_saved_before_a_config_field_existed_loads_and_forecasts_as_before(
    series, tmp_path, field, before, changes
):
    """A saved config without a field later versions added loads with the behaviour it was
    trained with: the same forecasts, to the bit, on short histories (10 hourly points),
    where the field matters."""
    config = ModelConfig(**{**TINY_MODEL, **changes, field: before})
    model = Forecaster(config, TrainConfig(**TINY_TRAIN)).fit(series)
    model.save(tmp_path / "model")
    meta_file = tmp_path / "model" / "config.json"
    meta = json.loads(meta_file.read_text())
    del meta["model_config"][field]
    meta_file.write_text(json.dumps(meta))
    reseal(tmp_path / "model")
    older = Forecaster.load(tmp_path / "model")
    assert getattr(older.model_config, field) == before
    short = series.groupby("unique_id").head(10)
    pd.testing.assert_frame_equal(older.predict(short), model.predict(short), check_exact=True)


def test_a_model_saved_before_the_long_season_existed_loads_without_it(tmp_path):
    """Six-hourly data has a week of 28 steps, inside the tiny 32-step context, so fit gives
    a new model its last week as a naive forecast. A model saved before the field existed
    was trained without it: its config loads with None, read as none, and it forecasts as
    saved (a loader that resolved None from the frequency would build a head of another
    shape and fail)."""
    six_hourly = generate_synthetic(n_series=4, n_steps=4 * 7 * 12, freq="6h", seed=0)
    assert ModelConfig(**TINY_MODEL).for_frequency("6h").long_season_length == 28
    config = ModelConfig(**{**TINY_MODEL, "long_season_length": 1})
    model = Forecaster(config, TrainConfig(**TINY_TRAIN)).fit(six_hourly)
    model.save(tmp_path / "model")
    meta_file = tmp_path / "model" / "config.json"
    meta = json.loads(meta_file.read_text())
    del meta["model_config"]["long_season_length"]
    meta_file.write_text(json.dumps(meta))
    reseal(tmp_path / "model")
    older = Forecaster.load(tmp_path / "model")
    assert older.model_config.long_season_length is None
    pd.testing.assert_frame_equal(
        older.predict(six_hourly), model.predict(six_hourly), check_exact=True
    )


def test_a_config_of_numpy_numbers_trains_saves_and_loads(series, tmp_path):
    """NumPy numbers were taken, trained on, and then failed save (not JSON), after the whole
    training; an interval scale of np.float32 raised a TypeError."""
    model_config = ModelConfig(**{**TINY_MODEL, "d_model": np.int64(16)})
    train = {**TINY_TRAIN, "learning_rate": np.float32(1e-3), "max_epochs": np.int64(1)}
    config = TrainConfig(**train, interval_scale=np.float32(2.0))
    assert type(model_config.d_model) is int and config.interval_scale[0] == 2.0
    model = Forecaster(model_config, config).fit(series)
    loaded = Forecaster.load(model.save(tmp_path / "m"))
    pd.testing.assert_frame_equal(loaded.predict(series), model.predict(series))


def test_failed_save_leaves_the_saved_model_intact(fitted, series, tmp_path, monkeypatch):
    fitted.save(tmp_path / "model")
    before = {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir()}
    other = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**{**TINY_TRAIN, "seed": 1}))
    other.fit(series)

    def broken(self):
        raise RuntimeError("disk full")

    monkeypatch.setattr(Forecaster, "_reference_forecast", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        other.save(tmp_path / "model")
    assert {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir()} == before


def test_a_val_df_without_a_window_is_named(series):
    """Only the validation points, without the history before them: nothing to judge on."""
    last = series.groupby("unique_id").tail(TINY_MODEL["prediction_length"])
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN))
    with pytest.raises(SeriesTooShortError, match="val_df gives no validation window") as error:
        model.fit(series, val_df=last)
    assert error.value.field == "val_df"


def test_bad_rows_in_val_df_are_named_as_val_df_s(series):
    """Both frames hold the same series: an error naming only the series and the row did
    not say which frame to fix. A val_df that is no frame at all was a raw ValueError."""
    val = series.groupby("unique_id").tail(20).reset_index(drop=True)
    val.loc[5, "ds"] = val.loc[4, "ds"]
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN))
    with pytest.raises(DuplicateTimestampsError, match=r"^val_df: series 'series_000'"):
        model.fit(series, val_df=val)
    with pytest.raises(ForecasterInputError, match="^val_df: .*expected a pandas DataFrame"):
        model.fit(series, val_df=val.to_numpy())


def test_forecast_keeps_the_callers_id_dtype_and_time_zone(fitted, series):
    """Integer ids and tz-aware timestamps come back as given, so forecasts merge with actuals."""
    codes = series["unique_id"].str.extract(r"(\d+)$", expand=False).astype("int64") + 10
    given = series.assign(unique_id=codes, ds=series["ds"].dt.tz_localize("America/New_York"))
    forecast = fitted.predict(given)
    assert forecast["unique_id"].dtype == np.int64
    assert str(forecast["ds"].dt.tz) == "America/New_York"
    first = forecast.groupby("unique_id")["ds"].min()
    last = given.groupby("unique_id")["ds"].max()
    assert (first - last[first.index] == pd.Timedelta(hours=1)).all()
    # The same numbers as for the naive UTC history with string ids.
    utc = series.assign(ds=given["ds"].dt.tz_convert("UTC").dt.tz_localize(None))
    np.testing.assert_array_equal(forecast["mean"], fitted.predict(utc)["mean"])


def test_timestamps_given_as_text_with_offsets_come_back_labelled(fitted, series):
    """Hourly text with offsets (as a CSV holds an aware column) is read in UTC: the forecast
    says so instead of coming back naive; local dates of daily data stay naive."""
    aware = series.assign(ds=series["ds"].dt.tz_localize("UTC").dt.tz_convert("Europe/Berlin"))
    as_text = aware.assign(ds=aware["ds"].astype(str))
    forecast = fitted.predict(as_text)
    assert str(forecast["ds"].dt.tz) == "UTC"
    assert (forecast["ds"] == fitted.predict(aware)["ds"]).all()


@pytest.mark.parametrize("dtype", ["str", "string"])
def test_text_ids_come_back_in_the_callers_dtype(fitted, series, dtype):
    """pandas 3's default "str" and the nullable "string" each come back as given, with the
    same ids, so the forecast merges with the caller's frame."""
    given = series.assign(unique_id=series["unique_id"].astype(dtype))
    forecast = fitted.predict(given)
    assert forecast["unique_id"].dtype == given["unique_id"].dtype
    assert set(forecast["unique_id"]) == set(given["unique_id"])


def test_categorical_and_mixed_ids_come_back_as_given(fitted, series):
    """A categorical id column stays categorical; ids of two kinds that compare equal (True and
    1) stay two series; ids of two kinds that read alike (1 and "1") are refused."""
    as_category = series.assign(unique_id=series["unique_id"].astype("category"))
    forecast = fitted.predict(as_category)
    assert forecast["unique_id"].dtype == as_category["unique_id"].dtype
    ids = series["unique_id"].unique()
    two = series[series["unique_id"].isin(ids[:2])]
    first = (two["unique_id"] == ids[0]).to_numpy()
    mixed = two.assign(unique_id=pd.array([True if f else 1 for f in first], dtype=object))
    forecast = fitted.predict(mixed)
    assert [type(v) for v in forecast["unique_id"].iloc[[0, -1]]] == [bool, int]
    np.testing.assert_array_equal(forecast["mean"], fitted.predict(two)["mean"])
    alike = two.assign(unique_id=pd.array([1 if f else "1" for f in first], dtype=object))
    with pytest.raises(AmbiguousSeriesIdsError, match="'1'") as error:
        fitted.predict(alike)
    assert error.value.field == "unique_id"


@pytest.mark.parametrize("zone", ["Europe/Berlin", "Asia/Tokyo"])
def test_daily_aware_history_is_read_as_its_local_dates(zone):
    """Local midnights from January to late October: the history spans the March daylight-saving
    change and the forecast the October one; in UTC Berlin's would leave the daily grid and
    Tokyo's fall on the previous day (its day of week one off)."""
    naive = generate_synthetic(n_series=2, n_steps=300, freq="D", start="2024-01-01", seed=0)
    given = naive.assign(ds=naive["ds"].dt.tz_localize(zone))
    config = ModelConfig(**TINY_MODEL, calendar_features=("day_of_week",))
    model = Forecaster(config, TrainConfig(**{**TINY_TRAIN, "max_epochs": 1})).fit(given)
    assert model.freq == "D"
    forecast = model.predict(given)
    assert str(forecast["ds"].dt.tz) == zone
    expected = model.predict(naive)
    assert (expected["ds"].groupby(expected["unique_id"]).min() == "2024-10-27").all()
    assert forecast["ds"].dt.tz_localize(None).tolist() == expected["ds"].tolist()
    assert (forecast["ds"].dt.hour == 0).all()
    np.testing.assert_array_equal(forecast["mean"], expected["mean"])
    # One timestamp says nothing of its spacing: the daily model reads it as a local date too.
    last = model.predict(given.groupby("unique_id").tail(1))
    assert last["ds"].tolist() == forecast["ds"].tolist()
    # The model sees the local dates' calendar.
    inputs, local = model.prepare(given), model.prepare(naive)
    torch.testing.assert_close(inputs.past_covariates, local.past_covariates)
    torch.testing.assert_close(inputs.future_covariates, local.future_covariates)


def test_daily_utc_midnights_in_a_local_zone_are_forecast_as_they_were_fitted(tmp_path):
    """Daily data stamped at UTC midnight and shown in New York (tz_convert of UTC data):
    19:00 or 20:00 the day before, by daylight-saving time. Fit reads it in UTC, where it is
    daily; predict read it on the wall clock, as daily models read aware data, so the model
    refused its own training frame and gave a recent window the previous day's calendar."""
    naive = generate_synthetic(n_series=2, n_steps=120, freq="D", start="2024-01-01", seed=0)
    given = naive.assign(ds=naive["ds"].dt.tz_localize("UTC").dt.tz_convert("America/New_York"))
    config = ModelConfig(**TINY_MODEL, calendar_features=("day_of_week",))
    model = Forecaster(config, TrainConfig(**{**TINY_TRAIN, "max_epochs": 1})).fit(given)
    assert (model.freq, model.wall_clock) == ("D", False)
    expected = model.predict(naive)  # the same days, in UTC
    recent = given.groupby("unique_id").tail(40)  # after the March change: 20:00 every day
    for history in (given, recent):
        forecast = model.predict(history)
        assert str(forecast["ds"].dt.tz) == "America/New_York"
        utc = forecast["ds"].dt.tz_convert("UTC").dt.tz_localize(None)
        assert utc.tolist() == expected["ds"].tolist()
    torch.testing.assert_close(
        model.prepare(recent).future_covariates, model.prepare(naive).future_covariates
    )
    model.save(tmp_path / "model")
    loaded = Forecaster.load(tmp_path / "model")
    assert loaded.wall_clock is False
    pd.testing.assert_frame_equal(loaded.predict(recent), model.predict(recent))


def test_a_context_without_an_observed_value_is_refused_naming_the_series(fitted, series):
    """An outage longer than the context left the model nothing to read: it forecast 0 (the
    scaler's default) for a series at 1,000. It is refused, naming the series and its last
    observation; once its trailing gap is dropped it forecasts on from there."""
    L = fitted.model_config.context_length
    sid = "series_001"
    out = series.copy()
    out.loc[out[out["unique_id"] == sid].tail(L + 5).index, "y"] = np.nan
    observed_end = out.loc[out["unique_id"] == sid].dropna()["ds"].max()
    with pytest.raises(MissingValuesError, match=f"'{sid}' has no observed value") as error:
        fitted.predict(out)
    assert error.value.series_id == sid and error.value.field == "y"
    assert f"{observed_end}, {L + 5} steps before its end" in str(error.value)
    dropped = out[(out["unique_id"] != sid) | (out["ds"] <= observed_end)]
    forecast = fitted.predict(dropped)
    assert forecast["mean"].notna().all()


def test_business_hours_are_forecast_on_business_hours(tmp_path):
    """Readings 08:00-17:00 on weekdays, in Berlin across the March change: the model reads
    them as business hours (a day is 10 steps), not as hourly data two-thirds missing, and
    forecasts the next opening hours, in the history's zone, after save -> load too."""
    from forecaster.time_axis import parse_freq

    ds = pd.date_range("2024-02-01 08:00", periods=600, freq=parse_freq("bh=08:00-18:00"))
    naive = pd.concat(
        [
            pd.DataFrame({"unique_id": sid, "ds": ds, "y": np.sin(np.arange(600) / 10 * 6.3) * k})
            for k, sid in ((1.0, "a"), (2.0, "b"))
        ],
        ignore_index=True,
    )
    given = naive.assign(ds=naive["ds"].dt.tz_localize("Europe/Berlin"))
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**{**TINY_TRAIN, "max_epochs": 1}))
    model.fit(given)
    assert model.freq == "bh=08:00-18:00"
    assert model.model_config.season_length == 10
    forecast = model.predict(given)
    local = forecast["ds"].dt.tz_localize(None)
    assert local.iloc[:3].tolist() == list(pd.date_range("2024-04-25 08:00", periods=3, freq="h"))
    assert local.dt.hour.between(8, 17).all() and (local.dt.day_of_week < 5).all()
    model.save(tmp_path / "model")
    again = Forecaster.load(tmp_path / "model")
    pd.testing.assert_frame_equal(again.predict(given), forecast)
    pd.testing.assert_frame_equal(
        again.predict(naive), forecast.assign(ds=local), check_dtype=False
    )


def test_twice_monthly_data_is_forecast_on_its_days(tmp_path):
    """Readings on the 15th and each month's end (pay periods): read as 'SME-15' with a
    yearly cycle of 24 steps, not refused as 15-day steps gone off their grid, and forecast
    on the 15th and the month's end (February's 28th), after save -> load too."""
    ds = pd.date_range("2019-01-15", periods=146, freq="SME")
    given = pd.concat(
        [
            pd.DataFrame({"unique_id": sid, "ds": ds, "y": 10 + k * np.sin(np.arange(146) / 4)})
            for k, sid in ((1.0, "a"), (2.0, "b"))
        ],
        ignore_index=True,
    )
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**{**TINY_TRAIN, "max_epochs": 1}))
    model.fit(given)
    assert model.freq == "SME-15" and model.model_config.season_length == 24
    forecast = model.predict(given, horizon=4)
    assert forecast["ds"].iloc[:4].tolist() == list(
        pd.to_datetime(["2025-02-15", "2025-02-28", "2025-03-15", "2025-03-31"])
    )
    model.save(tmp_path / "model")
    pd.testing.assert_frame_equal(
        Forecaster.load(tmp_path / "model").predict(given, horizon=4), forecast
    )


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_an_aware_file_is_forecast_in_its_zone(fitted, series, tmp_path, suffix):
    """Hourly readings in Berlin, written to a file and read back by `load_frame`: forecast
    as the frame itself is, labelled, not as naive UTC times that read an hour early. A
    Parquet column keeps its zone; CSV text with +01:00 comes back in UTC (it names no zone)."""
    aware = series.assign(ds=series["ds"].dt.tz_localize("Europe/Berlin"))
    path = tmp_path / f"history{suffix}"
    if suffix == ".csv":
        aware.to_csv(path, index=False)
    else:
        aware.to_parquet(path)
    forecast = fitted.predict(load_frame(path))
    expected = fitted.predict(aware)
    if suffix == ".csv":
        expected = expected.assign(ds=expected["ds"].dt.tz_convert("UTC"))
    pd.testing.assert_frame_equal(forecast, expected)


def test_pyarrow_timestamps_with_a_zone_are_read_as_pandas_ones(fitted, series):
    """`pd.read_parquet(..., dtype_backend="pyarrow")` gives aware timestamps a pyarrow dtype,
    which pandas refuses to cast to a naive one: read as the same aware pandas column."""
    aware = series.assign(ds=series["ds"].dt.tz_localize("Europe/Berlin"))
    arrow = aware.assign(ds=aware["ds"].astype("timestamp[us, tz=Europe/Berlin][pyarrow]"))
    pd.testing.assert_frame_equal(fitted.predict(arrow), fitted.predict(aware))


def test_an_aware_daily_frame_round_trips_through_csv(tmp_path):
    """pandas writes Berlin midnights as text with +01:00, then +02:00: the file reads back as
    the local dates it holds."""
    naive = generate_synthetic(n_series=2, n_steps=200, freq="D", start="2024-01-01", seed=0)
    path = tmp_path / "daily.csv"
    naive.assign(ds=naive["ds"].dt.tz_localize("Europe/Berlin")).to_csv(path, index=False)
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**{**TINY_TRAIN, "max_epochs": 1}))
    forecast = model.fit(load_frame(path)).predict(load_frame(path))
    assert model.freq == "D"
    expected = model.predict(naive)
    pd.testing.assert_frame_equal(forecast, expected)


def test_load_never_unpickles(fitted, tmp_path, monkeypatch):
    import pickle

    fitted.save(tmp_path / "model")

    def refuse(*args, **kwargs):
        raise AssertionError("load must not unpickle")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    Forecaster.load(tmp_path / "model")


def test_batched_inference_one_forward_per_batch(series):
    model = Forecaster(
        ModelConfig(**TINY_MODEL),
        TrainConfig(**{**TINY_TRAIN, "max_epochs": 1, "predict_batch_size": 3}),
    )
    model.fit(series)
    many = generate_synthetic(n_series=10, n_steps=40, seed=3)
    calls = []
    handle = model.model.register_forward_hook(
        lambda module, args, output: calls.append(args[0].shape[0])
    )
    try:
        forecast = model.predict(many)
    finally:
        handle.remove()
    assert calls == [3, 3, 3, 1]
    assert forecast["unique_id"].nunique() == 10


def test_new_series_forecast_scales_with_input(fitted, series):
    """A series unseen in training is scaled by its own history (the instance scaler)."""
    one = series[series["unique_id"] == series["unique_id"].iloc[0]].copy()
    one["unique_id"] = "never-seen"
    base = fitted.predict(one)["mean"].to_numpy()
    one["y"] = one["y"] * 3.0 + 7.0
    np.testing.assert_allclose(fitted.predict(one)["mean"].to_numpy(), base * 3.0 + 7.0, rtol=1e-9)


def test_non_negative_floors_every_forecast_at_zero_and_is_saved(fitted, series, tmp_path):
    """Counts near zero: the band and the mean are floored at 0, the rest is unchanged."""
    low = series.copy()
    low["y"] = low["y"] - low.groupby("unique_id")["y"].transform("mean")  # centred on 0
    columns = ["mean", "q0.1", "q0.5", "q0.9"]
    raw = fitted.predict(low)[columns].to_numpy()
    assert (raw < 0).any()  # the floor has something to do
    fitted.save(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["model_config"]["non_negative"] = True
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    floored = Forecaster.load(tmp_path / "m", verify=False)
    np.testing.assert_array_equal(floored.predict(low)[columns].to_numpy(), np.maximum(raw, 0.0))
    floored.save(tmp_path / "again")
    assert Forecaster.load(tmp_path / "again").model_config.non_negative


def test_an_interrupted_fit_leaves_the_model_fitted_before(series):
    """A Ctrl-C (or a failing callback) mid-fit left the epoch's weights, uncalibrated bands
    and the previous train_result in a forecaster that looked fitted."""
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN)).fit(series)
    before, result = model.predict(series), model.train_result

    def interrupt(log):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        model.fit(series.assign(y=series["y"] * 2), callbacks=[interrupt])
    pd.testing.assert_frame_equal(model.predict(series), before)
    assert model.train_result is result
    unfitted = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN))
    with pytest.raises(KeyboardInterrupt):
        unfitted.fit(series, callbacks=[interrupt])
    assert not unfitted.is_fitted


def test_the_order_of_the_series_in_the_frame_does_not_change_the_model(fitted, series):
    """The same data with its series in another order trains the same model: training's
    shuffles ran over the series in the caller's order (forecasts moved by up to 0.28)."""
    reordered = pd.concat([g for _, g in series.groupby("unique_id", sort=False)][::-1])
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN)).fit(reordered)
    losses = [(log.train_loss, log.val_loss) for log in model.train_result.epochs]
    assert losses == [(log.train_loss, log.val_loss) for log in fitted.train_result.epochs]
    pd.testing.assert_frame_equal(model.predict(series), fitted.predict(series))


def test_a_second_fit_reads_its_own_data(series):
    """Patch and season left to fit are resolved from each fit's data, not kept from the
    first: daily data after hourly trained with hourly patches."""
    daily = generate_synthetic(n_series=2, n_steps=120, freq="D", seed=1)
    config = {**TINY_MODEL, "patch_length": None}
    train = {**TINY_TRAIN, "max_epochs": 1}
    model = Forecaster(ModelConfig(**config), TrainConfig(**train)).fit(series)
    assert (model.model_config.patch_length, model.model_config.season_length) == (24, 24)
    model.fit(daily)
    fresh = Forecaster(ModelConfig(**config), TrainConfig(**train)).fit(daily)
    assert model.model_config == fresh.model_config
    assert model.model_config.season_length == 7
    pd.testing.assert_frame_equal(model.predict(daily), fresh.predict(daily))


def _with_gaps(series: pd.DataFrame) -> pd.DataFrame:
    """Series 0 loses three timestamps, series 1 gets NaNs, series 2 keeps only two points."""
    ids = series["unique_id"].unique()
    position = series.groupby("unique_id").cumcount()
    gappy = series[~((series["unique_id"] == ids[0]) & position.between(300, 302))].copy()
    gappy.loc[(gappy["unique_id"] == ids[1]) & position.between(310, 320), "y"] = np.nan
    from_end = gappy.groupby("unique_id").cumcount(ascending=False)
    keep = (gappy["unique_id"] != ids[2]) | (from_end < 2)
    return gappy[keep].reset_index(drop=True)


def test_short_and_gappy_histories_get_forecasts(fitted, series):
    gappy = _with_gaps(series)
    forecast = fitted.predict(gappy)
    assert forecast.groupby("unique_id").size().eq(8).all()
    assert forecast["unique_id"].nunique() == series["unique_id"].nunique()
    assert np.isfinite(forecast[["mean", "q0.1", "q0.9"]].to_numpy()).all()
    # A missing timestamp and a NaN at that timestamp are the same missing value.
    ids = series["unique_id"].unique()
    as_nan = series.copy()
    position = series.groupby("unique_id").cumcount()
    as_nan.loc[(series["unique_id"] == ids[0]) & position.between(300, 302), "y"] = np.nan
    pd.testing.assert_frame_equal(
        fitted.predict(as_nan[as_nan["unique_id"] == ids[0]]),
        fitted.predict(gappy[gappy["unique_id"] == ids[0]]),
    )


def test_input_errors_name_field_and_series(fitted, series):
    with pytest.raises(HorizonTooLongError, match="horizon: expected an integer between 1 and 8"):
        fitted.predict(series, horizon=9)
    with pytest.raises(UnknownQuantileError, match=r"expected a subset of \[0.1, 0.5, 0.9\]"):
        fitted.predict(series, quantiles=[0.25])
    empty = series.assign(y=np.where(series["unique_id"] == "series_001", np.nan, series["y"]))
    with pytest.raises(
        MissingValuesError, match="series 'series_001' has no observed value"
    ) as error:
        fitted.predict(empty)
    assert error.value.series_id == "series_001"
    off_grid = series.copy()
    off_grid.loc[5, "ds"] = off_grid.loc[5, "ds"] + pd.Timedelta(minutes=30)
    with pytest.raises(IrregularTimestampsError, match="not on the 'h' grid|off-grid"):
        fitted.predict(off_grid)


def test_fit_trains_on_short_series_and_refuses_only_when_none_is_long_enough(series):
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**{**TINY_TRAIN, "max_epochs": 1}))
    # Every series shorter than the context: windows are left-padded.
    model.fit(series.groupby("unique_id").head(20))
    assert model.train_result.n_train_windows > 0
    # Shorter than a horizon (8): each window's targets past the series' end are unobserved,
    # so 5 points give 4 windows a series (one step of history and one target at least).
    n_series = series["unique_id"].nunique()
    model.fit(series.groupby("unique_id").head(5))
    assert model.train_result.n_train_windows + model.train_result.n_val_windows == 4 * n_series
    forecast = model.predict(series.groupby("unique_id").head(5))
    assert np.isfinite(forecast["mean"]).all()
    with pytest.raises(FrequencyInferenceError, match="every series has a single timestamp"):
        model.fit(series.groupby("unique_id").head(1))


def test_catalogue_too_short_to_hold_out_a_horizon_validates_on_held_out_series(series):
    """Series of 12 points cannot spare a horizon (8) and keep a training window (9 points):
    every seventh series is held out whole to judge the epochs, not the training loss."""
    catalogue = pd.concat(
        [
            series.groupby("unique_id")
            .head(12)
            .assign(unique_id=lambda f, k=k: f"{k}-" + f["unique_id"])
            for k in range(4)
        ],
        ignore_index=True,
    )  # 16 series
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN)).fit(catalogue)
    result = model.train_result
    assert result.initial_val_loss is not None and result.best_val_loss is not None
    # Series 0, 7 and 14 validate, each with its 11 windows (4 with a whole horizon, 7 whose
    # horizon runs past its end); the other 13 train on theirs.
    assert (result.n_val_windows, result.n_train_windows) == (3 * 11, 13 * 11)
    forecast = model.predict(catalogue)
    assert forecast["unique_id"].nunique() == 16 and np.isfinite(forecast["mean"]).all()


def test_a_catalogue_of_short_series_is_forecast_from_more_history_than_a_horizon_leaves():
    """100 hourly series of 18 points, forecast 12 steps: a window with a whole horizon of
    targets has at most 6 steps of history, the forecast reads 18. Windows whose horizon runs
    past the series' end train on the longer histories (without them: MAE 6.92, worse than
    the history's mean), and the band is learned in the level, not in the std of a few steps
    of the daily cycle (in the std: 9.8 times the history's std wide)."""
    data = generate_synthetic(n_series=100, n_steps=30, seed=1)
    history, actual = data.groupby("unique_id").head(18), data.groupby("unique_id").tail(12)
    config = ModelConfig(
        context_length=48, prediction_length=12, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1
    )
    train = TrainConfig(max_epochs=10, max_windows_per_epoch=8192, progress=False, device="cpu")
    forecast = Forecaster(config, train).fit(history).predict(history)
    scored = forecast.merge(actual, on=["unique_id", "ds"])
    by_series = history.groupby("unique_id")["y"]
    history_mean = scored["unique_id"].map(by_series.mean())
    assert (scored["mean"] - scored["y"]).abs().mean() < (history_mean - scored["y"]).abs().mean()
    width = (scored["q0.9"] - scored["q0.1"]) / scored["unique_id"].map(by_series.std())
    assert width.mean() < 8


def test_known_future_covariate_is_required_and_used():
    data = generate_synthetic(n_series=3, n_steps=24 * 10, seed=1, with_covariates=True)
    history = data.groupby("unique_id").head(24 * 9)
    future = data.groupby("unique_id").tail(24).groupby("unique_id").head(8)
    config = ModelConfig(**{**TINY_MODEL, "covariates": (PROMO,)})
    model = Forecaster(
        config, TrainConfig(**{**TINY_TRAIN, "max_epochs": 10, "learning_rate": 1e-2})
    ).fit(history)
    # The Transformer, the only part that reads the covariate, improved on the linear start.
    assert model.train_result.best_epoch >= 1
    with pytest.raises(MissingCovariatesError):
        model.predict(history)
    forecast = model.predict(history, future_df=future.drop(columns=["y"]))
    flipped = future.assign(**{PROMO: 1.0 - future[PROMO]}).drop(columns=["y"])
    assert np.abs(forecast["mean"] - model.predict(history, future_df=flipped)["mean"]).max() > 0.1
    # A shorter horizon is the first steps of the full one when the later covariates are given
    # (here the flag alternates, so holding step 3's value for step 4 would differ), and needs
    # only its own steps' covariates.
    alternating = future.assign(**{PROMO: np.tile([0.0, 1.0], len(future) // 2)})
    alternating = alternating.drop(columns=["y"])
    short = model.predict(history, horizon=3, future_df=alternating)
    full = model.predict(history, future_df=alternating)
    first = full.groupby("unique_id").head(3).reset_index(drop=True)
    pd.testing.assert_frame_equal(short, first)
    only_three = future.groupby("unique_id").head(3).drop(columns=["y"])
    assert len(model.predict(history, horizon=3, future_df=only_three)) == 3 * 3


def test_attention_maps_have_token_shapes_and_rows_sum_to_one(fitted, series):
    maps = fitted.attention(series)
    config = fitted.model_config
    s, n, m = series["unique_id"].nunique(), config.n_patches, config.n_horizon_tokens
    assert maps.encoder[0].shape == (s, config.n_heads, n, n)
    assert maps.decoder_self[0].shape == (s, config.n_heads, m, m)
    assert maps.cross[0].shape == (s, config.n_heads, m, n)
    np.testing.assert_allclose(maps.cross[0].sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(maps.decoder_self[0], k=1) == 0)


def test_attention_of_yearly_data_whose_padded_context_precedes_1677():
    """336 years of context back from 2009 reach before the timestamps pandas has: the maps
    are still given, the context start is None (only padding lies there)."""
    ds = pd.date_range("1950-01-01", periods=60, freq="YS")
    history = pd.concat(
        pd.DataFrame({"unique_id": f"s{i}", "ds": ds, "y": np.arange(60.0) + i}) for i in range(3)
    )
    config = ModelConfig(prediction_length=6, context_length=336)
    model = Forecaster(config, TrainConfig(max_epochs=0, progress=False))
    maps = model.fit(history).attention(history)
    assert maps.context_starts == [None, None, None]
    assert np.isfinite(maps.cross[0]).all()
    recent = history.assign(ds=history["ds"] + pd.DateOffset(years=60))  # 2010 .. 2069
    assert model.attention(recent).context_starts[0] == "1734-01-01T00:00:00"


def test_backtest_scores_rolling_windows(fitted, series):
    result = fitted.backtest(series, n_windows=2)
    assert result.n_windows == 2
    assert {"mae", "mse", "mase", "smape"} <= set(result.metrics)
    assert result.forecasts["cutoff"].nunique() == 2


def test_forecast_windows_scores_every_window(fitted, series):
    windows = fitted.forecast_windows(series)
    per_series = 24 * 14 - (32 + 8) + 1
    assert windows.mean.shape == (4 * per_series, 8)
    assert windows.target.shape == windows.mean.shape
    # Each series' last window: its target is the series' last 8 values, its forecast what
    # predict gives from the history before them.
    last_target = windows.target.reshape(4, per_series, 8)[:, -1]
    last_mean = windows.mean.reshape(4, per_series, 8)[:, -1]
    tail = series.groupby("unique_id").tail(8)["y"].to_numpy().reshape(4, 8)
    history = series.groupby("unique_id").head(24 * 14 - 8)
    predicted = fitted.predict(history)["mean"].to_numpy().reshape(4, 8)
    np.testing.assert_array_equal(last_target, tail)
    np.testing.assert_allclose(last_mean, predicted, rtol=1e-5, atol=1e-6)


def test_intervals_cover_held_out_points(series):
    """The quantile band starts at the linear fit's residual spread, so it is never degenerate."""
    history = series.groupby("unique_id").head(24 * 12)
    future = series.groupby("unique_id").tail(24 * 2).groupby("unique_id").head(8)
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**{**TINY_TRAIN, "max_epochs": 1}))
    forecast = model.fit(history).predict(history).merge(future, on=["unique_id", "ds"])
    inside = (forecast["q0.1"] <= forecast["y"]) & (forecast["y"] <= forecast["q0.9"])
    assert (forecast["q0.9"] - forecast["q0.1"]).min() > 0
    # An 80 % band holds all 32 points by chance with probability 0.8 ** 32 < 0.001: a band
    # that does is too wide, not calibrated.
    assert 0.5 <= inside.mean() < 1.0


def _weekly_catalogue(n_series: int = 60, seed: int = 0) -> pd.DataFrame:
    """Weekly series with a yearly season; every third one is only 16-40 weeks old."""
    rng = np.random.default_rng(seed)
    frames = []
    for i in range(n_series):
        n = int(rng.integers(16, 40)) if i % 3 == 0 else int(rng.integers(150, 260))
        ds = pd.date_range(end="2026-06-07", periods=n, freq="W-SUN")
        week = ds.isocalendar().week.to_numpy().astype(float)
        level = rng.uniform(50, 500)
        season = (
            level * rng.uniform(0.1, 0.4) * np.sin(2 * np.pi * week / 52.18 + rng.uniform(0, 6))
        )
        noise = rng.normal(0, 0.03 * level, n)
        frames.append(
            pd.DataFrame({"unique_id": f"item_{i}", "ds": ds, "y": level + season + noise})
        )
    return pd.concat(frames, ignore_index=True)


def test_weekly_catalogue_with_new_items_is_forecast_and_beats_naive():
    data = _weekly_catalogue()
    horizon = 13
    from_end = data.groupby("unique_id").cumcount(ascending=False)
    history, future = data[from_end >= horizon], data[from_end < horizon]
    config = ModelConfig(
        **{**TINY_MODEL, "context_length": 104, "prediction_length": horizon, "patch_length": None}
    )
    model = Forecaster(config, TrainConfig(**{**TINY_TRAIN, "max_epochs": 5})).fit(history)
    # A token is half of the 52-week year; most of the new items' context is padding.
    assert model.model_config.patch_length == 26
    assert model.model_config.season_length == 52  # what a gap is read from
    forecast = model.predict(history)
    assert forecast["unique_id"].nunique() == data["unique_id"].nunique()
    assert np.isfinite(forecast["mean"].to_numpy()).all()
    scored = forecast.merge(future, on=["unique_id", "ds"], validate="one_to_one")
    assert len(scored) == len(future)  # every forecast lands on the weekly grid
    naive = scored["unique_id"].map(history.groupby("unique_id")["y"].last())
    model_mae = (scored["mean"] - scored["y"]).abs().mean()
    naive_mae = (naive - scored["y"]).abs().mean()
    assert model_mae < 0.8 * naive_mae


def test_a_series_without_an_observed_validation_value_leaves_validation_only(series):
    """A series in an outage through the validation stretch gives no validation window; it
    refused the whole fit. The other series validate, and it still trains."""
    from forecaster.data import time_split

    parts = time_split(series, val_length=16, test_length=0, context_length=32)
    sid = series["unique_id"].iloc[0]
    val = parts.val.copy()
    val.loc[val["unique_id"] == sid, "y"] = np.nan
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**{**TINY_TRAIN, "max_epochs": 1}))
    model.fit(parts.train, val_df=val)
    assert np.isfinite(model.train_result.epochs[-1].val_loss)
    every = val.assign(y=np.nan)
    with pytest.raises(MissingValuesError, match="no observed value"):
        model.fit(parts.train, val_df=every)


@pytest.fixture(scope="module")
def with_promo():
    data = generate_synthetic(n_series=3, n_steps=24 * 10, seed=1, with_covariates=True)
    history = data.groupby("unique_id").head(24 * 9).reset_index(drop=True)
    future = data.groupby("unique_id").tail(24).groupby("unique_id").head(8).drop(columns="y")
    config = ModelConfig(**{**TINY_MODEL, "covariates": (PROMO,)})
    model = Forecaster(config, TrainConfig(**{**TINY_TRAIN, "max_epochs": 1})).fit(history)
    return model, history, future.reset_index(drop=True)


def test_a_series_forecast_reads_only_its_own_future_rows(with_promo):
    """With a horizon shorter than the model's, each series reads its own later rows where
    given: one series giving only the steps asked for changed every other series' forecast."""
    model, history, future = with_promo
    full = model.predict(history, horizon=4, future_df=future)
    first = future["unique_id"].iloc[0]
    short = future[(future["unique_id"] != first) | (future.groupby("unique_id").cumcount() < 4)]
    fewer = model.predict(history, horizon=4, future_df=short)
    others = full["unique_id"] != first
    pd.testing.assert_frame_equal(fewer[others.to_numpy()], full[others])
    # Rows past the horizon are not required: unknown values there are no error.
    unknown = future.assign(
        **{PROMO: future[PROMO].where(future.groupby("unique_id").cumcount() < 4)}
    )
    assert model.predict(history, horizon=4, future_df=unknown)["mean"].notna().all()


def test_covariates_given_out_of_step_with_the_history_are_refused(with_promo):
    """An aware history with a naive schedule (or the other way round) read every covariate an
    hour off in Paris, silently."""
    model, history, future = with_promo
    aware = history.assign(ds=history["ds"].dt.tz_localize("Europe/Paris"))
    with pytest.raises(
        InvalidTimestampsError,
        match="ds is given without either but the history's is with a time zone or UTC "
        "offset; give both the same way",
    ):
        model.predict(aware, future_df=future)
    with pytest.raises(
        InvalidTimestampsError,
        match="ds is given with a time zone or UTC offset but the history's is without either",
    ):
        model.predict(history, future_df=future.assign(ds=future["ds"].dt.tz_localize("UTC")))
    zoned = future.assign(ds=future["ds"].dt.tz_localize("Europe/Paris"))
    expected = model.predict(aware, future_df=zoned)
    assert expected["mean"].notna().all()
    # As a CSV file gives them: text with UTC offsets.
    as_text = zoned.assign(ds=zoned["ds"].astype(str))
    pd.testing.assert_frame_equal(model.predict(aware, future_df=as_text), expected)


@pytest.mark.parametrize("zone", [None, "Europe/Paris"])
def test_schedule_timestamps_that_cannot_be_read_are_named_not_blamed_on_the_zone(with_promo, zone):
    """An aware history's schedule whose first timestamp was missing or unreadable was refused
    as given without a time zone, which sent the caller after the wrong fault."""
    model, history, future = with_promo
    ds = future["ds"]
    if zone is not None:
        history = history.assign(ds=history["ds"].dt.tz_localize(zone))
        ds = ds.dt.tz_localize(zone)
    text = ds.astype(str).where(future.index != 0, "soon")
    with pytest.raises(InvalidTimestampsError, match="'series_000': ds value 'soon' is not a "):
        model.predict(history, future_df=future.assign(ds=text))
    with pytest.raises(InvalidTimestampsError, match="'series_000': ds is missing at row 0"):
        model.predict(history, future_df=future.assign(ds=None))


def test_a_daily_schedule_in_another_zone_is_read_on_the_historys_clock():
    """Daily data is read on its zone's wall clock: a schedule of the same instants in UTC was
    refused as missing (Berlin's midnight is 23:00 UTC the day before)."""
    data = generate_synthetic(n_series=2, n_steps=120, freq="D", seed=2, with_covariates=True)
    data = data.assign(ds=data["ds"].dt.tz_localize("Europe/Berlin"))
    history = data.groupby("unique_id").head(112).reset_index(drop=True)
    future = data.groupby("unique_id").tail(8).drop(columns="y").reset_index(drop=True)
    config = ModelConfig(**{**TINY_MODEL, "covariates": (PROMO,)})
    model = Forecaster(config, TrainConfig(**{**TINY_TRAIN, "max_epochs": 1})).fit(history)
    in_utc = future.assign(ds=future["ds"].dt.tz_convert("UTC"))
    pd.testing.assert_frame_equal(
        model.predict(history, future_df=in_utc), model.predict(history, future_df=future)
    )


def test_covariate_values_the_model_cannot_read_are_refused_and_outages_are_not(with_promo):
    model, history, future = with_promo
    with pytest.raises(NonNumericValuesError, match=f"column '{PROMO}' is 1e\\+20") as error:
        model.predict(history, future_df=future.assign(**{PROMO: 1e20}))
    assert error.value.field == PROMO
    # A covariate missing where y is (an outage of both) is no error: neither is read.
    outage = history.copy()
    rows = outage.index[outage["unique_id"] == outage["unique_id"].iloc[0]][-30:-20]
    outage.loc[rows, ["y", PROMO]] = np.nan
    dropped = outage.drop(index=rows)
    pd.testing.assert_frame_equal(
        model.predict(outage, future_df=future), model.predict(dropped, future_df=future)
    )
    # Missing (or infinite) where y is observed, it is refused naming the column.
    for bad in (np.nan, np.inf):
        gap = history.copy()
        gap.loc[rows[0], PROMO] = bad
        with pytest.raises(MissingValuesError, match=f"column '{PROMO}' is {bad}.*where y is"):
            model.predict(gap, future_df=future)
