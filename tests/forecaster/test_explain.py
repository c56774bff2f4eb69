"""What attention earns (forecaster.explain): uniform attention where asked, nowhere else, and
only while asked; the summary of how peaked attention is; the backtest of each kind made
uniform."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster.explain import PARTS, attention_earned, attention_summary, uniform_attention
from forecaster.model import PatchTransformer
from forecaster.outputs import AttentionMaps
from tests.forecaster.conftest import TINY_MODEL, TINY_TRAIN

# Two encoder layers and three horizon tokens: every kind of attention has layers to flatten.
CONFIG = ModelConfig(**{**TINY_MODEL, "prediction_length": 12, "n_encoder_layers": 2})


def _model_and_batch() -> tuple[PatchTransformer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = PatchTransformer(CONFIG).eval()
    # Untrained heads start at zero; random ones make every attention layer reach the output.
    for head in (model.point_head, model.linear_start):
        torch.nn.init.normal_(head.weight, std=0.1)
    values = torch.randn(3, CONFIG.context_length, dtype=torch.float64)
    observed = torch.ones_like(values, dtype=torch.bool)
    observed[1, :10] = False  # two and a half patches of padding: masked keys
    return model, values, observed


def _weights(model, values, observed) -> dict[str, list[torch.Tensor]]:
    output, attention = model(values, observed, return_attention=True)
    return {
        "mean": output.mean,
        "encoder": attention.encoder,
        "decoder_self": attention.decoder_self,
        "cross": attention.cross,
    }


@pytest.mark.parametrize("part", PARTS)
def test_uniform_attention_spreads_each_query_evenly_over_the_keys_it_may_see(part):
    model, values, observed = _model_and_batch()
    learned = _weights(model, values, observed)
    with uniform_attention(model, part):
        uniform = _weights(model, values, observed)
    for layer in uniform[part]:
        allowed = layer > 0
        expected = allowed / allowed.sum(dim=-1, keepdim=True)
        torch.testing.assert_close(layer, expected.to(layer.dtype))
    # Masks still hold: padded keys and future horizon tokens get no weight.
    for layer_learned, layer_uniform in zip(learned[part], uniform[part], strict=True):
        assert torch.equal(layer_learned > 0, layer_uniform > 0)
    assert not torch.allclose(learned["mean"], uniform["mean"])


def test_uniform_attention_touches_only_its_part_and_ends_with_the_block():
    model, values, observed = _model_and_batch()
    learned = _weights(model, values, observed)
    with uniform_attention(model, "cross"):
        uniform = _weights(model, values, observed)
    # The encoder runs before the cross-attention: its weights are untouched.
    for before, during in zip(learned["encoder"], uniform["encoder"], strict=True):
        torch.testing.assert_close(before, during)
    after = _weights(model, values, observed)
    torch.testing.assert_close(after["mean"], learned["mean"])


def test_summary_reads_uniform_and_peaked_attention():
    n, m = 5, 3
    uniform = AttentionMaps(
        series_ids=["a"],
        encoder=[np.full((1, 2, n, n), 1 / n)],
        decoder_self=[(np.tril(np.ones((m, m))) / np.arange(1, m + 1)[:, None])[None, None]],
        cross=[np.full((1, 2, m, n), 1 / n)],
        context_starts=["2020-01-01T00:00:00"],
        patch_length=4,
        patch_stride=4,
    )
    summary = attention_summary(uniform)
    assert summary["encoder_entropy"] == pytest.approx(1.0)
    assert summary["decoder_self_entropy"] == pytest.approx(1.0)
    assert summary["cross_entropy"] == pytest.approx(1.0)
    assert summary["cross_row_distance"] == pytest.approx(0.0)

    # Each horizon token looks at a context token of its own: little spread, rows far apart.
    peaked_cross = np.full((1, 2, m, n), 0.01)
    peaked_cross[0, :, np.arange(m), np.arange(m)] = 0.96
    peaked = AttentionMaps(**{**uniform.__dict__, "cross": [peaked_cross]})
    summary = attention_summary(peaked)
    assert summary["cross_entropy"] < 0.2
    assert summary["cross_row_distance"] == pytest.approx(0.95)


def test_summary_counts_a_key_of_weight_zero_as_seen_when_another_query_weighs_it():
    """A fully peaked row (softmax underflow gives exact zeros) is entropy 0, not a row with one
    key; padded keys (weight 0 from every query) and padded query tokens are left out."""
    n = 4
    encoder = np.full((1, 1, n, n), 1 / 3)
    encoder[..., 0] = 0.0  # token 0 is padding: no query sees it
    encoder[:, :, 1, :] = [0.0, 1.0, 0.0, 0.0]  # token 1 looks at itself only
    decoder = np.tril(np.ones((2, 2)))[None, None] / np.array([1, 2])[:, None]
    maps = AttentionMaps(
        series_ids=["a"],
        encoder=[encoder],
        decoder_self=[decoder],
        cross=[np.full((1, 1, 2, n), 1 / n)],
        context_starts=["2020-01-01T00:00:00"],
        patch_length=4,
        patch_stride=4,
    )
    # Rows of tokens 1, 2, 3 over keys 1, 2, 3: entropy 0, 1 and 1 of a uniform row's.
    assert attention_summary(maps)["encoder_entropy"] == pytest.approx(2 / 3)


def test_attention_earned_compares_each_uniform_backtest_with_the_learned_one(series):
    # Without its linear start the model forecasts through attention alone. The test needs a
    # model that has learned: with 64 steps an epoch this tiny run does within 8 epochs at
    # seeds 0-2 and either loss unit (with 16 it stays at its untrained loss).
    config = ModelConfig(**{**TINY_MODEL, "linear_start": False})
    train = TrainConfig(
        **{**TINY_TRAIN, "max_epochs": 8, "learning_rate": 3e-3, "max_windows_per_epoch": 4096}
    )
    model = Forecaster(config, train).fit(series)
    assert model.train_result.best_epoch > 0
    earned = attention_earned(model, series, n_windows=2, horizon=8)
    assert set(earned) == set(PARTS)
    learned = model.backtest(series, n_windows=2, horizon=8).metrics["mase"]
    with uniform_attention(model.model, "cross"):
        uniform = model.backtest(series, n_windows=2, horizon=8).metrics["mase"]
    assert earned["cross"] == pytest.approx(uniform / learned - 1)
    # The decoder reads the context only through the cross-attention: uniform, it is lost.
    assert earned["cross"] > 0.05
    assert all(abs(value) > 1e-6 for value in earned.values())
    # The hooks are gone: the model forecasts as it learned to.
    assert model.backtest(series, n_windows=2, horizon=8).metrics["mase"] == learned
