import numpy as np
import torch

from forecaster.windows import WindowBatch, series_scales, with_outages


def batch_of(observed: torch.Tensor) -> WindowBatch:
    size, length = observed.shape
    values = torch.arange(1.0, length + 1, dtype=torch.float64).repeat(size, 1)
    return WindowBatch(
        past_values=torch.where(observed, values, torch.zeros_like(values)),
        past_observed_mask=observed,
        future_values=torch.zeros(size, 4, dtype=torch.float64),
        future_observed_mask=torch.ones(size, 4, dtype=torch.bool),
        past_covariates=None,
        future_covariates=None,
        loss_scale=torch.ones(size, 1, dtype=torch.float64),
    )


def test_an_outage_is_one_span_of_the_context_half_of_them_up_to_the_origin():
    size, length, max_span = 2000, 96, 30
    batch = batch_of(torch.ones(size, length, dtype=torch.bool))
    out = with_outages(batch, 1.0, max_span, np.random.default_rng(0))

    lost = ~out.past_observed_mask.numpy()
    spans = lost.sum(axis=1)
    assert spans.min() >= 1 and spans.max() <= max_span
    # One contiguous span per window: exactly one observed -> lost edge.
    edges = np.diff(np.pad(lost.astype(int), ((0, 0), (1, 0))), axis=1)
    assert ((edges == 1).sum(axis=1) == 1).all()
    assert 0.4 < lost[:, -1].mean() < 0.6, "half of the outages reach the forecast origin"
    # Lost steps read 0, as every unobserved value does; the rest is untouched.
    assert (out.past_values.numpy()[lost] == 0).all()
    np.testing.assert_array_equal(out.past_values.numpy()[~lost], batch.past_values.numpy()[~lost])
    assert out.future_values is batch.future_values


def test_outages_keep_padding_unobserved_and_two_observed_steps_per_window():
    length = 48
    observed = torch.ones(500, length, dtype=torch.bool)
    observed[:, :45] = False  # a series of 3 points, left-padded
    out = with_outages(batch_of(observed), 1.0, 48, np.random.default_rng(1))
    kept = out.past_observed_mask
    assert not (kept & ~observed).any(), "padding never becomes observed"
    assert (kept.sum(dim=1) >= 2).all()
    assert (kept.sum(dim=1) == 2).any(), "an outage can still hit a short window"


def test_outage_probability_is_per_window():
    batch = batch_of(torch.ones(4000, 48, dtype=torch.bool))
    out = with_outages(batch, 0.25, 24, np.random.default_rng(2))
    hit = (~out.past_observed_mask).any(dim=1).float().mean().item()
    assert 0.22 < hit < 0.28


def test_series_scales_count_errors_relative_to_the_level_or_to_the_spread():
    """Three series end to end: level 100 with spread 1 (NaN steps ignored), centred on zero
    with spread 2, and all zeros."""
    level = np.array([99.0, np.nan, 101.0, 99.0, np.nan, 101.0])
    centred = np.array([-2.0, 2.0, -2.0, 2.0])
    zeros = np.zeros(3)
    values = np.concatenate([level, centred, zeros])
    offsets = np.cumsum([0, len(level), len(centred), len(zeros)])
    # RMS: the level where there is one (sqrt(100^2 + 1)), the spread where the mean is 0.
    np.testing.assert_allclose(series_scales(values, offsets, "rms"), [np.sqrt(10001), 2, 1])
    np.testing.assert_allclose(series_scales(values, offsets, "std"), [1, 2, 1])
