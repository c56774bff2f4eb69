"""Every range a config field documents, at its bounds: the last value accepted and the first
refused, so that a bound written `<` where the message says `<=` (or the other way round) fails
here rather than in a user's fit."""

from __future__ import annotations

import json

import pytest

from forecaster import ModelConfig, TrainConfig
from forecaster.config import (
    MAX_CONTEXT_LENGTH,
    N_HISTORY_BANDS,
    config_from_dict,
    config_to_dict,
)
from forecaster.errors import InvalidConfigError

BANDS = N_HISTORY_BANDS

# (config class, field, values accepted, values refused); each value is given alone.
BOUNDS = [
    (ModelConfig, "prediction_length", [1], [0]),
    (ModelConfig, "context_length", [1, MAX_CONTEXT_LENGTH], [0, MAX_CONTEXT_LENGTH + 1]),
    (ModelConfig, "patch_length", [None, 1], [0]),
    (ModelConfig, "season_length", [None, 1], [0]),
    (ModelConfig, "long_season_length", [None, 1], [0]),
    (ModelConfig, "n_heads", [1, 64], [0, 3]),  # a divisor of d_model = 64
    (ModelConfig, "n_encoder_layers", [1], [0]),
    (ModelConfig, "n_decoder_layers", [1], [0]),
    (ModelConfig, "d_ff", [1], [0]),
    (ModelConfig, "dropout", [0.0, 0.999], [-0.001, 1.0]),
    (ModelConfig, "attention_dropout", [0.0, 0.999], [-0.001, 1.0]),
    (ModelConfig, "horizon_dropout", [0.0, 0.999], [-0.001, 1.0]),
    (ModelConfig, "quantiles", [(), (0.001, 0.999)], [(0.0,), (1.0,), (0.5, 0.5)]),
    (ModelConfig, "horizon_weight_decay", [0.0], [-0.001]),
    (ModelConfig, "quantile_loss_weight", [0.0], [-0.001]),
    (TrainConfig, "max_epochs", [0], [-1]),
    (TrainConfig, "max_train_seconds", [None, 0.001], [0.0, -1.0]),
    (TrainConfig, "seed", [0, 2**32 - 1], [-1, 2**32]),
    (TrainConfig, "device", ["auto", "cpu", "mps", "cuda", "cuda:1"], ["cuda:", "CPU", "tpu"]),
    (TrainConfig, "batch_size", [1], [0]),
    (TrainConfig, "learning_rate", [1e-9], [0.0]),
    (TrainConfig, "linear_start_lr_scale", [0.0], [-0.001]),
    (TrainConfig, "weight_decay", [0.0], [-0.001]),
    (TrainConfig, "warmup_steps", [0], [-1]),
    (TrainConfig, "lr_decay", [0.001, 0.999], [0.0, 1.0]),
    (TrainConfig, "max_lr_decays", [0], [-1]),
    (TrainConfig, "patience", [1], [0]),
    (TrainConfig, "replay_lr_factors", [None, (0.001, 2.0)], [(0.0,), (1.0, -1.0)]),
    (TrainConfig, "replay_restarts", [None, (0, 3)], [(1, -1)]),
    (TrainConfig, "tail_epochs", [0], [-1]),
    (
        TrainConfig,
        "impute_padding",
        [None, True, (False,) * BANDS, [True] * BANDS],
        [(True,) * (BANDS - 1)],
    ),
    (TrainConfig, "drift_weight", [None, 0.0, 1.0], [-0.001, 1.001]),
    (TrainConfig, "glitch_threshold", [None, 0.001], [0.0]),
    (TrainConfig, "seasonal_glitch_factor", [None, 0.001], [0.0]),
    (TrainConfig, "zero_glitch_ratio", [None, 0.0, 0.999], [-0.001, 1.0]),
    (
        TrainConfig,
        "interval_scale",
        [None, 0.001, (1.0,) * BANDS],
        [0.0, (1.0,) * (BANDS - 1), (1.0,) * (BANDS - 1) + (0.0,)],
    ),
    (TrainConfig, "grad_clip", [0.0], [-0.001]),
    (TrainConfig, "ema_decay", [0.0, 0.999], [-0.001, 1.0]),
    (TrainConfig, "outage_probability", [0.0, 1.0], [-0.001, 1.001]),
    (TrainConfig, "outage_seasons", [1], [0]),
    (TrainConfig, "frequency_mask_probability", [0.0, 1.0], [-0.001, 1.001]),
    (TrainConfig, "frequency_mask_rate", [0.0, 1.0], [-0.001, 1.001]),
    (TrainConfig, "max_windows_per_epoch", [0], [-1]),
    (TrainConfig, "max_val_windows", [0], [-1]),
    (TrainConfig, "cooldown_share", [0.0, 0.999], [-0.001, 1.0]),
    (TrainConfig, "predict_batch_size", [1], [0]),
]


@pytest.mark.parametrize(
    ("config", "field", "accepted", "refused"),
    BOUNDS,
    ids=[f"{config.__name__}.{field}" for config, field, _, _ in BOUNDS],
)
def test_each_range_holds_its_bounds_and_refuses_what_lies_past_them(
    config, field, accepted, refused
):
    for value in accepted:
        config(**{field: value})
    for value in refused:
        with pytest.raises(InvalidConfigError, match=f"^{field}: expected ") as error:
            config(**{field: value})
        assert error.value.field == field, value


def test_a_model_of_width_one_is_a_model():
    """d_model's bound is 1, where the only divisor left for n_heads is 1."""
    ModelConfig(d_model=1, n_heads=1)
    with pytest.raises(InvalidConfigError, match="^d_model: expected >= 1") as error:
        ModelConfig(d_model=0, n_heads=1)
    assert error.value.field == "d_model"


@pytest.mark.parametrize(
    "config",
    [
        ModelConfig(),
        ModelConfig(quantiles=(0.05, 0.5, 0.95), covariates=("promo",), context_length=48),
        TrainConfig(),
        TrainConfig(
            impute_padding=True, interval_scale=1.2, replay_restarts=(0, 2), drift_weight=0.3
        ),
    ],
    ids=["model defaults", "model", "train defaults", "train"],
)
def test_a_config_round_trips_through_json(config):
    """What `save` writes and `load` reads: tuples come back from JSON's lists, None and the
    scalar forms of tuple-or-scalar fields as they were."""
    values = config_to_dict(config)
    assert json.loads(json.dumps(values)) == values
    assert config_from_dict(type(config), values) == config


def test_an_unknown_config_field_is_named_with_the_known_ones():
    with pytest.raises(InvalidConfigError, match=r"unknown field\(s\) \['d_modle'\]; expected"):
        config_from_dict(ModelConfig, {"d_modle": 32})
