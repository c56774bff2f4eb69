"""The patch Transformer module: shapes, masks, causality, quantiles, the linear start."""

import numpy as np
import pytest
import torch
from torch import nn

from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster.config import N_HISTORY_BANDS
from forecaster.errors import InvalidConfigError
from forecaster.model import (
    PatchTransformer,
    fill_gaps,
    history_band,
    naive_forecast_maps,
    observed_drift,
)
from forecaster.training import (
    LINEAR_START_RIDGES,
    LinearStartFit,
    WindowSet,
    fit_linear_start,
)
from forecaster.windows import SeriesPanel, gather_windows, series_scales


def _inputs(config: ModelConfig, batch: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    f = config.n_covariates
    return (
        torch.randn(batch, config.context_length, generator=g, dtype=torch.float64),
        torch.ones(batch, config.context_length, dtype=torch.bool),
        torch.randn(batch, config.context_length, f, generator=g),
        torch.randn(batch, config.prediction_length, f, generator=g),
    )


def _model(config: ModelConfig) -> PatchTransformer:
    """An untrained model whose every part shows in the output (heads not at zero)."""
    torch.manual_seed(0)
    model = PatchTransformer(config).eval()
    torch.nn.init.normal_(model.point_head.weight, std=0.5)
    if model.naive_head is not None:
        torch.nn.init.normal_(model.naive_head.weight, std=0.5)
    return model


@pytest.mark.parametrize("prediction_length", [8, 10])  # 10 is not a multiple of the patch
def test_output_shapes(tiny_config, prediction_length):
    config = ModelConfig(**{**tiny_config.__dict__, "prediction_length": prediction_length})
    output, attention = _model(config)(*_inputs(config), return_attention=True)
    forecast = output.denormalize()
    assert forecast.mean.shape == (3, prediction_length)
    assert forecast.quantiles.shape == (3, prediction_length, 3)
    assert forecast.mean.dtype == torch.float64  # the input's precision comes back
    n, m, heads = config.n_patches, config.n_horizon_tokens, config.n_heads
    assert [a.shape for a in attention.encoder] == [(3, heads, n, n)] * config.n_encoder_layers
    assert [a.shape for a in attention.decoder_self] == [(3, heads, m, m)] * config.n_decoder_layers
    assert [a.shape for a in attention.cross] == [(3, heads, m, n)] * config.n_decoder_layers


def test_quantiles_do_not_cross(tiny_config):
    output, _ = _model(tiny_config)(*_inputs(tiny_config))
    assert torch.all(output.quantiles[..., 1:] >= output.quantiles[..., :-1])


def test_decoder_is_causal(tiny_config):
    """Changing the decoder's input at horizon token t changes no output before t."""
    config = ModelConfig(**{**tiny_config.__dict__, "n_decoder_layers": 2})
    model = _model(config)
    inputs = _inputs(config)
    base, _ = model(*inputs)
    t, steps = 1, config.patch
    with torch.no_grad():
        # Random, not constant: LayerNorm would remove a constant shift of a token.
        model.horizon_queries[t] += torch.randn(
            config.d_model, generator=torch.Generator().manual_seed(2)
        )
    perturbed, _ = model(*inputs)
    torch.testing.assert_close(
        perturbed.mean[:, : t * steps], base.mean[:, : t * steps], rtol=0, atol=0
    )
    assert not torch.allclose(perturbed.mean[:, t * steps :], base.mean[:, t * steps :])


def test_forecast_is_equivariant_to_affine_rescaling(tiny_config):
    """The instance scaler: forecasting a*x + b gives a*forecast + b."""
    model = _model(tiny_config)
    past, mask, past_cov, future_cov = _inputs(tiny_config)
    base, _ = model(past, mask, past_cov, future_cov)
    scaled, _ = model(past * 50.0 + 1000.0, mask, past_cov, future_cov)
    torch.testing.assert_close(
        scaled.denormalize().mean, base.denormalize().mean * 50.0 + 1000.0, rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("filler", [0.0, 1e6, float("nan")])
def test_masked_steps_are_invisible(tiny_config, filler):
    """Left padding and gaps: whatever sits under the mask, the forecast is the same."""
    config = ModelConfig(**{**tiny_config.__dict__, "calendar_features": ("hour_of_day",)})
    model = _model(config)
    past, mask, past_cov, future_cov = _inputs(config)
    mask[0, :20] = False  # a short series: 12 observed steps, padded on the left
    mask[1, 5:9] = False  # a gap
    mask[2, ::3] = False  # scattered NaNs
    base, _ = model(past, mask, past_cov, future_cov)
    _, attention = model(past, mask, past_cov, future_cov, return_attention=True)
    other = torch.where(mask, past, torch.full_like(past, filler))
    other_cov = torch.where(mask.unsqueeze(-1), past_cov, torch.full_like(past_cov, 7.0))
    changed, _ = model(other, mask, other_cov, future_cov)
    torch.testing.assert_close(changed.denormalize().mean, base.denormalize().mean)
    # The fully padded context tokens of series 0 receive no attention at all.
    padded_tokens = 20 // config.patch
    assert attention.cross[0][0, :, :, :padded_tokens].abs().max() == 0


def test_two_observed_points_give_a_finite_forecast(tiny_config):
    model = _model(tiny_config)
    past, mask, past_cov, future_cov = _inputs(tiny_config, batch=2)
    mask[:] = False
    mask[0, -2:] = True
    mask[1, -1] = True  # one point: scaled by its level
    output, _ = model(past, mask, past_cov, future_cov)
    assert torch.isfinite(output.denormalize().mean).all()


def test_a_gap_reads_as_the_value_one_season_earlier_else_the_last_value():
    observed = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0]], dtype=torch.bool)
    x = torch.where(observed, torch.arange(12.0), torch.zeros(12))
    # Season 4: step 6 copies step 2, steps 7 and 11 copy step 3; step 5 has no observed value
    # one or more seasons back, so it takes the last value (4); the left padding stays 0.
    seasonal = torch.tensor([[0.0, 0.0, 2.0, 3.0, 4.0, 4.0, 2.0, 3.0, 8.0, 9.0, 10.0, 3.0]])
    torch.testing.assert_close(fill_gaps(x, observed, season=4), seasonal)
    last_value = torch.tensor([[0.0, 0.0, 2.0, 3.0, 4.0, 4.0, 4.0, 4.0, 8.0, 9.0, 10.0, 10.0]])
    torch.testing.assert_close(fill_gaps(x, observed, season=1), last_value)


def test_the_draft_of_a_gappy_history_reads_the_filled_gap(tiny_config):
    config = ModelConfig(**{**tiny_config.__dict__, "season_length": 4})
    model = _model(config)
    past, mask, _, _ = _inputs(config, batch=1)
    mask[0, 20:24] = False
    output, _ = model(past, mask)
    x, _ = model.scaler(past, mask)
    with torch.no_grad():
        torch.testing.assert_close(output.draft, model.linear_start(fill_gaps(x, mask, 4)))
        assert not torch.allclose(output.draft, model.linear_start(x))


def test_an_untrained_model_forecasts_its_draft_yet_its_naive_head_learns(tiny_config):
    """The correction and the naive head's gates start at zero: training begins at the linear
    start, whatever the rest, and the first step can already open the gates."""
    config = ModelConfig(**{**tiny_config.__dict__, "season_length": 4})
    model = PatchTransformer(config)
    output, _ = model(*_inputs(config))
    torch.testing.assert_close(output.mean, output.draft, rtol=0, atol=0)
    (output.mean - 1.0).square().sum().backward()
    assert model.naive_head.bias.grad.abs().min() > 0


@pytest.mark.parametrize("blend", ["gates", "softmax"])
def test_the_naive_blend_stays_between_the_draft_and_the_naive_forecasts(tiny_config, blend):
    """Whatever the head's weights, its blend never extrapolates beyond what it blends."""
    config = ModelConfig(**{**tiny_config.__dict__, "season_length": 4, "naive_blend": blend})
    model = _model(config)
    torch.nn.init.zeros_(model.point_head.weight)
    with torch.no_grad():
        torch.nn.init.normal_(model.naive_head.weight, std=10.0)
        torch.nn.init.normal_(model.naive_head.bias, std=10.0)
    past, mask, _, _ = _inputs(config, batch=16)
    output, _ = model(past, mask)
    x, _ = model.scaler(past, mask)
    maps = naive_forecast_maps(config.context_length, config.prediction_length, 4)
    candidates = [output.draft] + [x @ m[:-1].float() + m[-1].float() for m in maps.values()]
    low = torch.stack(candidates).min(dim=0).values
    high = torch.stack(candidates).max(dim=0).values
    assert torch.all(output.mean >= low - 1e-5) and torch.all(output.mean <= high + 1e-5)


@pytest.mark.parametrize("blend", ["gates", "softmax"])
@pytest.mark.parametrize("name", ["last value", "last season", "mean", "last long season"])
def test_the_naive_head_can_hand_a_series_its_naive_forecast(tiny_config, name, blend):
    """All the blend's weight on a naive forecast replaces the draft with it exactly, in the
    data's units: what the one linear map shared by every series cannot do for each of them."""
    config = ModelConfig(
        **{
            **tiny_config.__dict__,
            "season_length": 4,
            "long_season_length": 8,
            "naive_blend": blend,
        }
    )
    model = _model(config)
    torch.nn.init.zeros_(model.point_head.weight)
    maps = naive_forecast_maps(config.context_length, config.prediction_length, 4, 8)
    index = list(maps).index(name)
    with torch.no_grad():
        model.naive_head.weight.zero_()
        if blend == "gates":  # a gate opened past 1 is scaled back to 1
            model.naive_head.bias.fill_(-1.0)[index] = 3.0
        else:  # the draft's logit is first
            model.naive_head.bias.fill_(-1e4)[1 + index] = 0.0
    past, mask, _, _ = _inputs(config)
    forecast = model(past, mask)[0].denormalize().mean
    expected = {
        "last value": past[:, -1:].expand(-1, 8),
        "last season": past[:, -4:].repeat(1, 2),
        "mean": past.mean(dim=1, keepdim=True).expand(-1, 8),
        "last long season": past[:, -8:],
    }[name]
    torch.testing.assert_close(forecast, expected)


def test_without_the_naive_head_the_model_has_no_such_weights(tiny_config):
    config = ModelConfig(**{**tiny_config.__dict__, "naive_head": False})
    model = PatchTransformer(config)
    assert model.naive_head is None
    assert not any(name.startswith("naive") for name in model.state_dict())


def _panel(values: np.ndarray) -> SeriesPanel:
    offsets = np.arange(0, values.size + 1, values.shape[1])
    flat = values.reshape(-1)
    return SeriesPanel(
        values=flat,
        covariates=np.zeros((flat.size, 0), np.float32),
        series_ids=[str(i) for i in range(len(values))],
        offsets=offsets,
        loss_scale=series_scales(flat, offsets, "rms"),
    )


def test_linear_start_is_the_least_squares_fit(tiny_config):
    """ "Repeat the last value" is a linear forecast, so the initial model must find it."""
    rng = np.random.default_rng(1)
    walks = rng.normal(size=(20, 300)).cumsum(axis=1)
    panel = _panel(walks)
    h = tiny_config.prediction_length
    origins = panel.window_origins(h, min_context=tiny_config.context_length)
    model = PatchTransformer(tiny_config).eval()
    fit_linear_start(model, WindowSet(panel, origins), torch.device("cpu"))
    batch = gather_windows(panel, origins, tiny_config.context_length, h)
    output, _ = model(batch.past_values, batch.past_observed_mask)
    last = batch.past_values[:, -1:]
    naive_error = torch.mean((last - batch.future_values) ** 2)
    model_error = torch.mean((output.denormalize().mean - batch.future_values) ** 2)
    assert model_error <= naive_error * 1.01
    # The correction head starts at zero and the naive blend on the draft (to e ** -8): the
    # model is its linear start.
    torch.testing.assert_close(output.mean, output.draft, rtol=0, atol=5e-3)


@pytest.mark.parametrize("observed_steps", [1, 5, 31])
def test_a_short_history_is_drafted_by_the_ridge_fit_on_its_observed_lags(
    tiny_config, observed_steps
):
    """A series shorter than the context gets the draft of the linear start refitted on the
    lags it has (same windows, ridge and prior), not the full map reading its padding as 0."""
    rng = np.random.default_rng(2)
    steps = np.arange(200)
    phase = rng.uniform(0, 6, size=(12, 1))
    values = np.sin(2 * np.pi * steps / 8 + phase) + 0.3 * rng.normal(size=(12, 200))
    panel = _panel(values.cumsum(axis=1) * 0.1 + values)
    config, h = tiny_config, tiny_config.prediction_length
    length = config.context_length
    origins = panel.window_origins(h, min_context=length)
    model = PatchTransformer(config).eval()
    fit = fit_linear_start(model, WindowSet(panel, origins), torch.device("cpu"))
    model.padding_factor.copy_(fit.padding_factor)  # as train_model installs it
    model.padding_imputed.fill_(True)

    batch = gather_windows(panel, origins, length, h)
    x, stats = model.scaler(batch.past_values, batch.past_observed_mask, torch.float64)
    design = torch.cat([x, torch.ones_like(x[:, :1])], dim=1)
    target = (batch.future_values - stats.loc) / stats.scale
    prior = naive_forecast_maps(length, h, config.season_length or 1)[fit.prior]
    shrink = fit.ridge * len(design)
    kept = torch.cat([torch.arange(length - observed_steps, length), torch.tensor([length])])
    gram = design.T @ design + shrink * torch.eye(length + 1, dtype=torch.float64)
    moment = design.T @ target + shrink * prior
    refitted = torch.linalg.solve(gram[kept][:, kept], moment[kept])  # (n + 1, H)

    past = batch.past_values[:4].clone()
    mask = batch.past_observed_mask[:4].clone()
    mask[:, : length - observed_steps] = False
    past[~mask] = 1e6  # padding is invisible
    with torch.no_grad():
        output, _ = model(past, mask)
    short, _ = model.scaler(past, mask, torch.float64)
    expected = torch.cat([short[:, -observed_steps:], torch.ones(4, 1)], dim=1) @ refitted
    torch.testing.assert_close(output.draft.double(), expected, rtol=1e-4, atol=1e-4)


def test_the_padding_is_imputed_in_the_chosen_bands_of_history_only(tiny_config):
    """A row whose band of history imputes is forecast as by a model imputing in every band,
    any other row as by one reading the padding as the mean."""
    rng = np.random.default_rng(4)
    panel = _panel(np.sin(np.arange(300) / 3) + 0.3 * rng.normal(size=(8, 300)))
    config, h = tiny_config, tiny_config.prediction_length
    origins = panel.window_origins(h, min_context=config.context_length)
    model = PatchTransformer(config).eval()
    fit = fit_linear_start(model, WindowSet(panel, origins), torch.device("cpu"))
    model.padding_factor.copy_(fit.padding_factor)
    batch = gather_windows(panel, origins[:6], config.context_length, h)
    mask = batch.past_observed_mask.clone()
    for row, seen in enumerate([1, 2, 4, 8, 16, 31]):  # one row in each band (L = 32)
        mask[row, : config.context_length - seen] = False
    bands = history_band(mask)
    assert bands.tolist() == list(range(N_HISTORY_BANDS))

    def drafts(chosen: list[bool]) -> torch.Tensor:
        model.padding_imputed.copy_(torch.tensor(chosen))
        with torch.no_grad():
            return model(batch.past_values, mask)[0].draft

    some = [True, False, False, True, False, True]
    everywhere, nowhere, mixed = drafts([True] * 6), drafts([False] * 6), drafts(some)
    chosen = torch.tensor(some)
    torch.testing.assert_close(mixed[chosen], everywhere[chosen])
    torch.testing.assert_close(mixed[~chosen], nowhere[~chosen])
    assert not torch.allclose(everywhere[chosen], nowhere[chosen])


def test_linear_start_ridge_is_chosen_by_cross_validation(tiny_config):
    """When the future is unrelated to the past, cross-validation picks the most shrinkage,
    towards the context's mean."""
    rng = np.random.default_rng(3)
    panel = _panel(rng.normal(size=(10, 400)))
    model = PatchTransformer(tiny_config).eval()
    origins = panel.window_origins(tiny_config.prediction_length)
    fit = fit_linear_start(model, WindowSet(panel, origins), torch.device("cpu"))
    assert fit == LinearStartFit(max(LINEAR_START_RIDGES), "mean")


@pytest.mark.parametrize(("observed", "slope"), [(True, 2.0), (False, 5 / 8)])
def test_the_drift_of_a_short_history_is_read_from_its_first_observation(
    tiny_config, observed, slope
):
    """A 6-point trend rising by 2 a step, left-padded to L = 32, with the drift's gate open:
    the head's drift continues the trend. Read over the span (8 steps, the previous rule), the
    slope runs from the padding, read as the row's mean (5, against 10 at the end): 5 / 8 a
    step, under a third of the trend."""
    config = ModelConfig(
        **{**tiny_config.__dict__, "prediction_length": 2, "observed_drift": observed}
    )
    model = _model(config)
    torch.nn.init.zeros_(model.point_head.weight)
    index = list(naive_forecast_maps(32, 2, 1)).index("drift over 8 steps")
    with torch.no_grad():
        model.naive_head.weight.zero_()
        model.naive_head.bias.fill_(-1.0)[index] = 1.0
    past = torch.zeros(1, 32, dtype=torch.float64)
    past[0, -6:] = torch.arange(6, dtype=torch.float64) * 2.0  # 0, 2, ..., 10
    mask = past != 0
    mask[0, -6] = True
    forecast = model(past, mask)[0].denormalize().mean
    torch.testing.assert_close(forecast, 10.0 + slope * torch.tensor([[1.0, 2.0]]).double())


def test_observed_drift_is_the_drift_map_where_the_history_fills_its_span():
    context = torch.arange(1.0, 13.0).double().unsqueeze(0)  # L = 12
    observed = torch.ones_like(context, dtype=torch.bool)
    design = torch.cat([context, torch.ones(1, 1).double()], dim=1)
    drift_map = naive_forecast_maps(12, 2, season_length=1)["drift over 8 steps"]
    torch.testing.assert_close(observed_drift(context, observed, 8, 2), design @ drift_map)
    # One observed step: no slope to read, the last value.
    observed[:, :-1] = False
    torch.testing.assert_close(
        observed_drift(context, observed, 8, 2), torch.full((1, 2), 12.0).double()
    )


def test_naive_forecast_maps_are_the_naive_forecasts():
    context = torch.arange(1.0, 13.0)  # L = 12
    design = torch.cat([context, torch.ones(1)]).double()  # the intercept last
    priors = naive_forecast_maps(12, 6, season_length=4)
    assert list(priors) == ["mean", "last value", "last season"]
    torch.testing.assert_close(design @ priors["mean"], torch.zeros(6, dtype=torch.float64))
    torch.testing.assert_close(design @ priors["last value"], torch.full((6,), 12.0).double())
    seasonal = torch.tensor([9.0, 10.0, 11.0, 12.0, 9.0, 10.0]).double()
    torch.testing.assert_close(design @ priors["last season"], seasonal)
    assert list(naive_forecast_maps(12, 6, season_length=1)) == ["mean", "last value"]
    # Two steps ahead, the slope read over DRIFT_HORIZONS = 4 horizons: 8 steps, 4 -> 12.
    priors = naive_forecast_maps(12, 2, season_length=1)
    assert list(priors) == ["mean", "last value", "drift over 8 steps"]
    torch.testing.assert_close(
        design @ priors["drift over 8 steps"], torch.tensor([13.0, 14.0]).double()
    )


def test_the_long_season_is_one_more_naive_forecast_where_the_context_holds_it():
    """A week of hourly data: each horizon step forecast by the same step a long cycle earlier,
    beside the daily cycle's; a context shorter than the cycle, or a cycle no longer than the
    main season, adds nothing."""
    context = torch.arange(1.0, 13.0)  # L = 12
    design = torch.cat([context, torch.ones(1)]).double()
    priors = naive_forecast_maps(12, 8, season_length=2, long_season_length=6)
    assert list(priors) == ["mean", "last value", "last season", "last long season"]
    weekly = torch.tensor([7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 7.0, 8.0]).double()
    torch.testing.assert_close(design @ priors["last long season"], weekly)
    assert "last long season" not in naive_forecast_maps(12, 8, 2, long_season_length=24)
    assert "last long season" not in naive_forecast_maps(12, 8, 6, long_season_length=6)
    # A cycle exactly as long as the context is in view: its one cycle is the whole context.
    assert "last season" in naive_forecast_maps(12, 8, season_length=12)
    assert "last long season" in naive_forecast_maps(12, 8, 2, long_season_length=12)


def test_hourly_day_ahead_forecasts_blend_last_week():
    """Hourly data forecast a day ahead reads a context of seven horizons, exactly one week:
    the week's last cycle is one of the naive forecasts its head blends."""
    config = ModelConfig(prediction_length=24).for_frequency("h")
    assert config.context_length == config.long_season_length == 168
    model = PatchTransformer(config)
    maps = naive_forecast_maps(168, 24, season_length=24, long_season_length=168)
    assert "last long season" in maps
    assert model.naive_head.out_features == len(maps)
    torch.testing.assert_close(model.naive_maps, torch.stack(list(maps.values())).float())


def test_the_naive_head_blends_the_long_season_when_the_config_has_one(tiny_config):
    """The head gets one more output for the long cycle's forecast; a config without one (a
    model saved before the field existed reads None) builds the head it was saved with."""
    base = {**tiny_config.__dict__, "season_length": 4}
    without = _model(ModelConfig(**{**base, "long_season_length": None}))
    with_long = _model(ModelConfig(**{**base, "long_season_length": 8}))
    assert with_long.naive_head.out_features == without.naive_head.out_features + 1
    past, mask, _, _ = _inputs(with_long.config)
    assert torch.isfinite(with_long(past, mask)[0].mean).all()


@pytest.mark.parametrize(("season", "expected"), [(1, "last value"), (8, "last season")])
def test_linear_start_is_shrunk_towards_the_naive_forecast_the_data_follows(
    tiny_config, season, expected
):
    """Short noisy windows of random walks (seasonal ones: one walk per phase of the season)
    want heavy shrinkage, and shrunk towards their mean they would revert to their past level:
    cross-validation shrinks them towards the matching naive forecast instead, and not
    towards the drift, which these walks do not have."""
    rng = np.random.default_rng(0)
    steps = rng.normal(size=(12, 64 // season, season)).cumsum(axis=1).reshape(12, -1)
    panel = _panel(50 + steps + rng.normal(0, 0.3, size=steps.shape))
    # H = 4, so that the drift's span (four horizons) fits in the context and is a candidate.
    config = ModelConfig(
        **{**tiny_config.__dict__, "season_length": season, "prediction_length": 4}
    )
    model = PatchTransformer(config).eval()
    origins = panel.window_origins(config.prediction_length)
    fit = fit_linear_start(model, WindowSet(panel, origins), torch.device("cpu"))
    assert fit.prior == expected


def _trends(rng: np.random.Generator, n_series: int, length: int = 24) -> np.ndarray:
    """Short noisy series, each on a straight trend of its own (up or down) plus a slow walk."""
    slopes = rng.choice([-1.0, 1.0], size=(n_series, 1)) * rng.uniform(0.5, 1.5, (n_series, 1))
    walk = rng.normal(0, 0.3, size=(n_series, length)).cumsum(axis=1)
    noise = rng.normal(0, 1.0, size=(n_series, length))
    return 50 + slopes * np.arange(length) + walk + noise


def test_linear_start_follows_the_drift_of_short_trending_series(tiny_config, monkeypatch):
    """A few short trending series (shorter than the context, like yearly data) want heavy
    shrinkage; shrunk towards the last value, the map forecasts fresh series of the same kind
    a third worse than when cross-validation may shrink it towards the last value with drift."""
    config = ModelConfig(**{**tiny_config.__dict__, "season_length": 1, "prediction_length": 4})
    rng = np.random.default_rng(0)
    train, fresh = _panel(_trends(rng, 8)), _panel(_trends(rng, 200))
    batch = gather_windows(fresh, fresh.offsets[1:] - 4, config.context_length, 4)

    def fit_and_score() -> tuple[LinearStartFit, float]:
        model = PatchTransformer(config).eval()
        windows = WindowSet(train, train.window_origins(4))
        fit = fit_linear_start(model, windows, torch.device("cpu"))
        with torch.no_grad():
            output, _ = model(batch.past_values, batch.past_observed_mask)
        return fit, float((output.denormalize().mean - batch.future_values).abs().mean())

    fit, error = fit_and_score()
    assert fit.prior == "drift over 16 steps" and fit.ridge >= 10
    monkeypatch.setattr("forecaster.model.DRIFT_HORIZONS", 100)  # no drift prior: its span > L
    fit_without, error_without = fit_and_score()
    assert fit_without.prior == "last value"
    assert error < 0.8 * error_without


def test_linear_start_can_shrink_all_the_way_to_the_naive_forecast(tiny_config):
    """For a few short random walks the naive forecast is the best there is: the ridge grid
    reaches far enough that cross-validation can pick (nearly) it, and the fitted map then
    forecasts fresh walks as well as the naive forecast does. With 10 the strongest ridge,
    the map stayed 2.5 % behind it."""
    config = ModelConfig(**{**tiny_config.__dict__, "season_length": 1})
    rng = np.random.default_rng(0)
    train = _panel(50 + rng.normal(size=(12, 64)).cumsum(axis=1))
    fresh = _panel(50 + rng.normal(size=(200, 64)).cumsum(axis=1))
    model = PatchTransformer(config).eval()
    h = config.prediction_length
    fit = fit_linear_start(model, WindowSet(train, train.window_origins(h)), torch.device("cpu"))
    assert fit.prior == "last value" and fit.ridge > 10
    origins = fresh.window_origins(h, min_context=config.context_length)
    batch = gather_windows(fresh, origins, config.context_length, h)
    with torch.no_grad():
        output, _ = model(batch.past_values, batch.past_observed_mask)
    error = (output.denormalize().mean - batch.future_values).abs().mean()
    naive_error = (batch.past_values[:, -1:] - batch.future_values).abs().mean()
    assert error < naive_error * 1.005


def test_linear_start_fits_the_short_series_when_most_series_are_short(tiny_config):
    """Nine short sine waves and one long noise series: the only full-context windows are the
    noise's, and a map fitted on them alone would not forecast the sines."""
    rng = np.random.default_rng(0)
    steps = np.arange(36)
    series = [np.sin(2 * np.pi * steps / 8 + phase) + 3 for phase in rng.uniform(0, 6, 9)]
    series.append(rng.normal(size=300))
    offsets = np.cumsum([0] + [len(s) for s in series])
    flat = np.concatenate(series)
    panel = SeriesPanel(
        values=flat,
        covariates=np.zeros((flat.size, 0), np.float32),
        series_ids=[str(i) for i in range(len(series))],
        offsets=offsets,
        loss_scale=series_scales(flat, offsets, "rms"),
    )
    h = tiny_config.prediction_length
    model = PatchTransformer(tiny_config).eval()
    fit_linear_start(model, WindowSet(panel, panel.window_origins(h)), torch.device("cpu"))
    last = offsets[1:10] - h  # the last window of each sine
    batch = gather_windows(panel, last, tiny_config.context_length, h)
    with torch.no_grad():
        output, _ = model(batch.past_values, batch.past_observed_mask)
    error = (output.denormalize().mean - batch.future_values).abs().mean()
    assert error < 0.25  # amplitude 1; fitted on the noise series alone, the map is off by 0.58


def _reference_fit(config: ModelConfig, panel: SeriesPanel, origins: np.ndarray) -> LinearStartFit:
    """The ridge of LINEAR_START_RIDGES and the prior (the mean, zero in normalised units, or
    the last value) with the lowest blocked 5-fold error, written out in numpy: the
    configured point loss, counted in each series' units as validation counts it."""
    model = PatchTransformer(config)
    batch = gather_windows(panel, origins, config.context_length, config.prediction_length)
    x, stats = model.scaler(batch.past_values, batch.past_observed_mask, torch.float64)
    x = model.linear_start_input(x, batch.past_observed_mask).numpy()
    design = np.c_[x, np.ones(len(x))]
    target = ((batch.future_values - stats.loc) / stats.scale).numpy()
    unit = (stats.scale / batch.loss_scale).numpy()
    series = panel.series_of(origins)
    fold = np.empty(len(origins), dtype=int)
    for s in np.unique(series):
        rows = np.flatnonzero(series == s)
        fold[rows] = np.arange(len(rows)) * 5 // len(rows)
    last_value = np.zeros((design.shape[1], config.prediction_length))
    last_value[config.context_length - 1] = 1.0
    errors = {}
    for prior_name, prior in (("mean", 0.0 * last_value), ("last value", last_value)):
        for ridge in LINEAR_START_RIDGES:
            error = 0.0
            for k in range(5):
                a, b = design[fold != k], target[fold != k]
                shrink = ridge * len(a)
                weights = np.linalg.solve(
                    a.T @ a + shrink * np.eye(a.shape[1]), a.T @ b + shrink * prior
                )
                residual = (design[fold == k] @ weights - target[fold == k]) * unit[fold == k]
                error += (np.abs(residual) if config.loss == "mae" else residual**2).sum()
            errors[LinearStartFit(ridge, prior_name)] = error
    return min(errors, key=errors.get)


@pytest.mark.parametrize(("loss", "expected"), [("mae", 3.0), ("mse", 1.0)])
def test_linear_start_ridge_is_judged_by_the_validation_loss(tiny_config, loss, expected):
    """Heavy-tailed noise on series of different scales: the configured loss, in series units,
    picks the ridge (MAE and MSE pick different ones here), as the numpy reference does."""
    rng = np.random.default_rng(0)
    steps = np.arange(160)
    scale = rng.uniform(0.5, 20, size=(8, 1))
    phase = rng.uniform(0, 6, size=(8, 1))
    values = scale * (np.sin(2 * np.pi * steps / 8 + phase) + 0.7 * rng.standard_t(2, (8, 160)))
    panel = _panel(values)
    config = ModelConfig(**{**tiny_config.__dict__, "loss": loss})
    origins = panel.window_origins(config.prediction_length, min_context=config.context_length)
    fit = fit_linear_start(PatchTransformer(config), WindowSet(panel, origins), torch.device("cpu"))
    assert fit == _reference_fit(config, panel, origins) == LinearStartFit(expected, "mean")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("n_heads", 3, "n_heads: expected a divisor of d_model=16, got 3"),
        ("patch_length", 0, "patch_length: expected None or >= 1, got 0"),
        ("season_length", 0, "season_length: expected None or >= 1, got 0"),
        ("quantiles", (0.5, 1.5), "quantiles: expected distinct values strictly between 0 and 1"),
        # Both 'q0.1': one trained level's column silently replaced the other's.
        ("quantiles", (0.1, 0.1000001), "quantiles: expected levels whose forecast columns"),
        ("loss", "rmse", "loss: expected mae or mse or huber, got 'rmse'"),
        ("loss_unit", "mad", "loss_unit: expected rms or std or rms_mase, got 'mad'"),
        ("naive_blend", "relu", "naive_blend: expected gates or softmax, got 'relu'"),
        ("horizon_dropout", 1.0, "horizon_dropout: expected in [0, 1), got 1.0"),
        # Once a RuntimeError on allocating 400 TB, after the data was read.
        ("context_length", 10**7, "context_length: expected in [1, 16384], got 10000000"),
        ("calendar_features", ("week_of_moon",), "calendar_features: expected names from"),
    ],
)
def test_invalid_config_says_expected_and_actual(tiny_config, field, value, message):
    with pytest.raises(
        InvalidConfigError,
        match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\["),
    ) as error:
        ModelConfig(**{**tiny_config.__dict__, field: value})
    assert error.value.field == field


@pytest.mark.parametrize(
    ("config", "field", "value", "expected"),
    [
        (ModelConfig, "context_length", 1.5, "an integer"),  # once a TypeError deep in torch
        (ModelConfig, "n_heads", 2.0, "an integer"),
        (ModelConfig, "d_model", True, "an integer"),
        (ModelConfig, "dropout", "0.1", "a finite number"),
        (ModelConfig, "linear_start", "false", "true or false"),  # "false" read as true
        (ModelConfig, "covariates", "promo", "a list of str values"),  # once split in letters
        (TrainConfig, "learning_rate", float("inf"), "a finite number"),  # trained to NaN
        (TrainConfig, "patience", 1.5, "an integer"),
        (TrainConfig, "max_train_seconds", 0.0, "None or > 0"),
        (TrainConfig, "max_train_seconds", "600", "a finite number"),
        (TrainConfig, "compile", "false", "true or false"),
        (TrainConfig, "cooldown_share", 1.0, r"in \[0, 1\)"),  # no stable phase left
        (TrainConfig, "replay_restarts", (2, -1), "None or epoch indices >= 0"),
        (TrainConfig, "seed", -1, r"in \[0, 2\*\*32\)"),
        (TrainConfig, "seed", None, "an integer"),
        (TrainConfig, "device", "gpu", "auto, cpu, cuda, cuda:N or mps"),
    ],
)
def test_a_config_value_of_the_wrong_type_is_refused_naming_its_field(
    config, field, value, expected
):
    with pytest.raises(InvalidConfigError, match=f"{field}: expected {expected}") as error:
        config(**{field: value})
    assert error.value.field == field


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_device_without_cuda_is_a_config_error_naming_the_device():
    config = TrainConfig(device="cuda")  # valid: a GPU machine may run what this one writes
    with pytest.raises(InvalidConfigError, match="CUDA is not available") as error:
        Forecaster(train_config=config)
    assert error.value.field == "device"


@pytest.mark.parametrize(
    "value", [0.0, -1.0, float("nan"), float("inf"), (1.0, 1.0), (1.0,) * 5 + (-1.0,), "1.5"]
)
def test_an_interval_scale_that_is_not_a_positive_factor_is_refused(value):
    with pytest.raises(
        InvalidConfigError,
        match="interval_scale: expected (None, a positive finite factor or 6|a finite number or a list)",
    ):
        TrainConfig(interval_scale=value)


@pytest.mark.parametrize("field", ["frequency_mask_probability", "frequency_mask_rate"])
def test_a_frequency_mask_share_outside_0_1_is_refused(field):
    with pytest.raises(InvalidConfigError, match=rf"{field}: expected in \[0, 1\], got 1.5"):
        TrainConfig(**{field: 1.5})


def test_one_interval_scale_stands_for_every_band_of_history():
    assert TrainConfig(interval_scale=1.5).interval_scale == (1.5,) * N_HISTORY_BANDS
    assert TrainConfig(interval_scale=[1, 2, 3, 4, 5, 6]).interval_scale == (1, 2, 3, 4, 5, 6)
    # A list, as JSON gives it, is taken for impute_padding too (it was refused as not "6 of
    # them" with six of them).
    choice = [True, False, True, False, True, False]
    assert TrainConfig(impute_padding=choice).impute_padding == tuple(choice)


def test_history_band_counts_steps_since_the_first_observation():
    length = 64  # edges at 2, 4, 8, 16 and 32 steps
    seen = torch.tensor([0, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64])
    mask = torch.arange(length) >= length - seen.unsqueeze(-1)  # (12, L): left padding
    mask[-1, 20] = False  # a gap inside the history does not shorten it
    assert history_band(mask).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]


def test_each_row_takes_the_interval_factor_of_its_band_of_history(tiny_config):
    model = PatchTransformer(tiny_config).eval()
    nn.init.normal_(model.quantile_head.weight)
    length = tiny_config.context_length
    values = torch.randn(2, length, dtype=torch.float64)
    mask = torch.ones(2, length, dtype=torch.bool)
    mask[0, : length - 3] = False  # a new series: 3 steps of history, band 2 of L = 32
    with torch.inference_mode():
        base, _ = model(values, mask)
        model.interval_scale.copy_(torch.tensor([1.0, 1.0, 2.0, 1.0, 1.0, 3.0]))
        scaled, _ = model(values, mask)
    offsets = base.quantiles - base.mean.unsqueeze(-1)
    expected = base.mean.unsqueeze(-1) + offsets * torch.tensor([2.0, 3.0])[:, None, None]
    torch.testing.assert_close(scaled.quantiles, expected.sort(dim=-1).values)


def test_configs_are_frozen(tiny_config):
    """A fitted model's configs are what it was saved with: no field changes after the checks."""
    with pytest.raises(AttributeError):
        tiny_config.d_model = 32
    with pytest.raises(AttributeError):
        TrainConfig().learning_rate = 1.0
