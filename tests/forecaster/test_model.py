"""The patch Transformer module: shapes, causality, quantiles, configuration."""

import pytest
import torch

from forecaster import ModelConfig
from forecaster.errors import InvalidConfigError
from forecaster.model import PatchTransformer


def _inputs(config: ModelConfig, batch: int = 3):
    g = torch.Generator().manual_seed(0)
    f = config.n_covariates
    return (
        torch.randn(batch, config.context_length, generator=g),
        torch.randn(batch, config.context_length, f, generator=g),
        torch.randn(batch, config.prediction_length, f, generator=g),
    )


@pytest.mark.parametrize("prediction_length", [8, 10])  # 10 is not a multiple of the decoder patch
def test_output_shapes(tiny_config, prediction_length):
    config = ModelConfig(**{**tiny_config.__dict__, "prediction_length": prediction_length})
    model = PatchTransformer(config).eval()
    output, attention = model(*_inputs(config), return_attention=True)
    assert output.mean.shape == (3, prediction_length)
    assert output.quantiles.shape == (3, prediction_length, 3)
    n, m, heads = config.n_patches, config.n_horizon_tokens, config.n_heads
    assert [a.shape for a in attention.encoder] == [(3, heads, n, n)] * config.n_encoder_layers
    assert [a.shape for a in attention.decoder_self] == [(3, heads, m, m)] * config.n_decoder_layers
    assert [a.shape for a in attention.cross] == [(3, heads, m, n)] * config.n_decoder_layers


def test_quantiles_do_not_cross(tiny_config):
    model = PatchTransformer(tiny_config).eval()
    output, _ = model(*_inputs(tiny_config))
    assert torch.all(output.quantiles[..., 1:] >= output.quantiles[..., :-1])


def test_decoder_is_causal(tiny_config):
    """Changing the decoder's input at horizon token t changes no output before t."""
    config = ModelConfig(**{**tiny_config.__dict__, "n_decoder_layers": 2})
    model = PatchTransformer(config).eval()
    torch.nn.init.normal_(model.point_head.weight)  # non-zero heads so every token shows up
    inputs = _inputs(config)
    queries = model.horizon_queries.detach().expand(3, -1, -1).clone()
    base, _ = model(*inputs, future_queries=queries)
    t = 1
    perturbed_queries = queries.clone()
    # Random, not constant: LayerNorm would remove a constant shift of a token.
    perturbed_queries[:, t] += torch.randn(
        config.d_model, generator=torch.Generator().manual_seed(2)
    )
    perturbed, _ = model(*inputs, future_queries=perturbed_queries)
    steps = config.decoder_patch_length
    torch.testing.assert_close(
        perturbed.mean[:, : t * steps], base.mean[:, : t * steps], rtol=0, atol=0
    )
    assert not torch.allclose(perturbed.mean[:, t * steps :], base.mean[:, t * steps :])


def test_forecast_is_equivariant_to_affine_rescaling(tiny_config):
    """RevIN: forecasting a*x + b gives a*forecast + b."""
    model = PatchTransformer(tiny_config).eval()
    past, past_cov, future_cov = _inputs(tiny_config)
    base, _ = model(past, past_cov, future_cov)
    scaled, _ = model(past * 50.0 + 1000.0, past_cov, future_cov)
    torch.testing.assert_close(scaled.mean, base.mean * 50.0 + 1000.0, rtol=1e-4, atol=1e-2)


def test_linear_skip_starts_at_least_squares_fit(tiny_config):
    model = PatchTransformer(tiny_config).eval()
    g = torch.Generator().manual_seed(1)
    past = torch.randn(500, tiny_config.context_length, generator=g).cumsum(1)
    future = past[:, -1:] + torch.randn(500, tiny_config.prediction_length, generator=g) * 0.01
    model.fit_linear_skip(past, future, ridges=(1e-6,))
    output, _ = model(past, *(_inputs(tiny_config, 500)[1:]))
    # The forecast "repeat the last value" is linear, so the initial model must find it.
    assert torch.mean((output.mean - future) ** 2) < 0.01


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("n_heads", 3, "n_heads: expected a divisor of d_model=16, got 3"),
        ("patch_length", 64, "patch_length: expected between 1 and context_length=32, got 64"),
        ("quantiles", (0.5, 1.5), "quantiles: expected distinct values strictly between 0 and 1"),
        ("loss", "rmse", "loss: expected mse, mae, huber or pinball, got 'rmse'"),
        ("calendar_features", ("week_of_moon",), "calendar_features: expected names from"),
    ],
)
def test_invalid_config_says_expected_and_actual(tiny_config, field, value, message):
    with pytest.raises(
        InvalidConfigError, match=message.replace("(", r"\(").replace(")", r"\)")
    ) as error:
        ModelConfig(**{**tiny_config.__dict__, field: value})
    assert error.value.field == field


def test_config_is_frozen(tiny_config):
    with pytest.raises(AttributeError):
        tiny_config.d_model = 32


def test_linear_skip_ridge_is_chosen_on_validation(tiny_config):
    """When the future is unrelated to the past, validation picks the strongest shrinkage."""
    model = PatchTransformer(tiny_config).eval()
    g = torch.Generator().manual_seed(3)
    shape = (400, tiny_config.context_length)
    past, val_past = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)
    future = torch.randn(400, tiny_config.prediction_length, generator=g)
    val_future = torch.randn(400, tiny_config.prediction_length, generator=g)
    assert model.fit_linear_skip(past, future, val_past, val_future) == 1.0
    assert model.fit_linear_skip(past, future) == 1e-2  # no validation: the default
