import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from forecaster import ModelConfig
from forecaster.metrics import mase_scale
from forecaster.validation import validate_long_frame
from forecaster.windows import (
    SeriesPanel,
    WindowBatch,
    covariate_matrix,
    gather_windows,
    series_scales,
    with_frequency_masking,
    with_history,
    with_outages,
)


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
    assert spans.min() == 1 and spans.max() == max_span, "every length 1 .. max_span"
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


def complete_batch(size: int, length: int, horizon: int, seed: int = 0) -> WindowBatch:
    rng = np.random.default_rng(seed)
    return WindowBatch(
        past_values=torch.from_numpy(rng.normal(size=(size, length))),
        past_observed_mask=torch.ones(size, length, dtype=torch.bool),
        future_values=torch.from_numpy(rng.normal(size=(size, horizon))),
        future_observed_mask=torch.ones(size, horizon, dtype=torch.bool),
        past_covariates=None,
        future_covariates=None,
        loss_scale=torch.ones(size, 1, dtype=torch.float64),
    )


def test_frequency_masking_zeroes_fourier_components_of_context_and_targets_together():
    size, length, horizon, rate = 400, 48, 24, 0.3
    batch = complete_batch(size, length, horizon)
    out = with_frequency_masking(batch, 1.0, rate, np.random.default_rng(0))

    joined = torch.cat([out.past_values, out.future_values], dim=1)
    spectrum = torch.fft.rfft(joined, dim=1)
    zeroed = (spectrum.abs() < 1e-9).double().mean().item()
    assert abs(zeroed - rate) < 0.02, "a share `rate` of the joined window's components is lost"
    # What is kept is the original's component: one signal, not context and targets apart.
    original = torch.fft.rfft(torch.cat([batch.past_values, batch.future_values], dim=1), dim=1)
    kept = spectrum.abs() >= 1e-9
    torch.testing.assert_close(spectrum[kept], original[kept])
    assert out.past_observed_mask is batch.past_observed_mask
    assert out.future_observed_mask is batch.future_observed_mask


def test_frequency_masking_leaves_padded_or_gappy_windows_and_the_unchosen_as_they_are():
    batch = complete_batch(3000, 48, 24)
    past_mask, future_mask = batch.past_observed_mask.clone(), batch.future_observed_mask.clone()
    past_mask[:1000, :5] = False  # left padding
    future_mask[1000:2000, -1] = False  # a missing target
    batch = dataclasses.replace(
        batch, past_observed_mask=past_mask, future_observed_mask=future_mask
    )
    out = with_frequency_masking(batch, 0.5, 0.3, np.random.default_rng(1))

    changed = (out.past_values != batch.past_values).any(dim=1)
    assert not changed[:2000].any(), "a window with unobserved steps has nothing to transform"
    assert 0.45 < changed[2000:].double().mean().item() < 0.55, "chosen with the probability"
    rate_zero = with_frequency_masking(batch, 1.0, 0.0, np.random.default_rng(2))
    torch.testing.assert_close(rate_zero.past_values, batch.past_values)
    torch.testing.assert_close(rate_zero.future_values, batch.future_values)


def test_frequency_masking_draws_nothing_from_a_batch_without_a_complete_window():
    """Catalogues of short series (every window padded) train exactly as without it."""
    batch = complete_batch(64, 48, 24)
    padded = batch.past_observed_mask.clone()
    padded[:, 0] = False
    batch = dataclasses.replace(batch, past_observed_mask=padded)
    rng = np.random.default_rng(3)
    assert with_frequency_masking(batch, 1.0, 0.3, rng) is batch
    assert rng.random() == np.random.default_rng(3).random()


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


def test_rms_mase_scales_are_the_geometric_mean_of_the_rms_and_the_metrics_mase_scale():
    """The loss unit reads MASE's scale as the metric does: the mean absolute change over a
    season between observed values, over one step where a series holds no more than a season;
    a series that never changes keeps its RMS."""
    seasonal = np.array([100.0, 110.0, 102.0, np.nan, 104.0, 114.0])  # changes 2, 2 (lag 2)
    season_and_a_step = np.array([10.0, 13.0, 14.0])  # 3 points, season 2: change 4 (lag 2)
    short = np.array([10.0, 13.0])  # 2 points, season 2: change 3 (lag 1)
    constant = np.full(4, 5.0)
    series = [seasonal, season_and_a_step, short, constant]
    values = np.concatenate(series)
    offsets = np.cumsum([0] + [len(s) for s in series])
    rms = series_scales(values, offsets, "rms")
    scales = series_scales(values, offsets, "rms_mase", season=2)
    expected = [np.sqrt(rms[0] * 2), np.sqrt(rms[1] * 4), np.sqrt(rms[2] * 3), rms[3]]
    np.testing.assert_allclose(scales, expected)
    for i, s in enumerate(series[:3]):
        assert scales[i] == pytest.approx(np.sqrt(rms[i] * mase_scale(s, 2)))
    # Over a season of one step, the first series' changes are 10, 8 and 10.
    one_step = series_scales(values, offsets, "rms_mase", season=1)
    np.testing.assert_allclose(one_step[0], np.sqrt(rms[0] * 28 / 3))


def test_training_windows_run_past_a_series_end_with_those_targets_unobserved():
    """A series shorter than a horizon trains, and a short one trains on contexts as long as
    the history it is forecast from, less one step; no window reads the next series."""
    values = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0, 30.0])  # series of 5, then of 3
    panel = SeriesPanel(
        values=values,
        covariates=np.zeros((8, 0), dtype=np.float32),
        series_ids=["a", "b"],
        offsets=np.array([0, 5, 8]),
        loss_scale=np.ones(2),
    )
    horizon = 4
    np.testing.assert_array_equal(panel.window_origins(horizon), [1])  # one whole horizon
    origins = panel.training_origins(horizon)
    np.testing.assert_array_equal(origins, [1, 2, 3, 4, 6, 7])
    batch = gather_windows(panel, origins, context_length=6, horizon=horizon)
    np.testing.assert_array_equal(batch.future_observed_mask.sum(dim=1), [4, 3, 2, 1, 2, 1])
    np.testing.assert_array_equal(batch.past_observed_mask.sum(dim=1), [1, 2, 3, 4, 1, 2])
    last_b = batch.future_values[-1].numpy()
    np.testing.assert_array_equal(last_b, [30.0, 0.0, 0.0, 0.0])  # not series a's values


def panel_of(*series: np.ndarray, covariates: bool = False) -> SeriesPanel:
    """Series laid end to end, each error unit its series' number (1, 2, ...); with
    `covariates`, one covariate that reads each step's index in the panel, plus one."""
    values = np.concatenate(series)
    cov = np.arange(1.0, len(values) + 1, dtype=np.float32)[:, None]
    return SeriesPanel(
        values=values,
        covariates=cov if covariates else np.zeros((len(values), 0), dtype=np.float32),
        series_ids=[f"s{k}" for k in range(len(series))],
        offsets=np.cumsum([0] + [len(s) for s in series]),
        loss_scale=np.arange(1.0, len(series) + 1),
    )


def test_window_origins_leave_min_context_steps_of_history_and_whole_horizons_of_targets():
    """Series of 7, 3 and 6 points at offsets 0, 7 and 10; a horizon of 2."""
    panel = panel_of(np.arange(7.0), np.arange(3.0), np.arange(6.0))
    np.testing.assert_array_equal(panel.window_origins(2, min_context=3), [3, 4, 5, 13, 14])
    # One minimum per series: the middle series now gives a window, the last one fewer.
    np.testing.assert_array_equal(
        panel.window_origins(2, min_context=np.array([1, 1, 4])), [1, 2, 3, 4, 5, 8, 14]
    )
    # One target inside the series is enough: origins run up to each series' last step.
    np.testing.assert_array_equal(
        panel.window_origins(2, min_context=3, min_targets=1), [3, 4, 5, 6, 13, 14, 15]
    )
    assert len(panel.window_origins(2, min_context=7)) == 0


def test_a_window_holds_the_context_before_its_origin_then_its_targets():
    """Context steps before the series' first step are padding and a NaN inside the series is
    a gap: both read 0 and unobserved; the step at the origin is the first target, never
    context."""
    panel = panel_of(np.array([1.0, 2.0, np.nan, 4.0, 5.0, 6.0]), np.array([10.0, 20.0, 30.0]))
    batch = gather_windows(panel, np.array([2, 4, 7]), context_length=4, horizon=2)
    np.testing.assert_array_equal(batch.past_values, [[0, 0, 1, 2], [1, 2, 0, 4], [0, 0, 0, 10]])
    np.testing.assert_array_equal(
        batch.past_observed_mask,
        [[False, False, True, True], [True, True, False, True], [False, False, False, True]],
    )
    np.testing.assert_array_equal(batch.future_values, [[0, 4], [5, 6], [20, 30]])
    np.testing.assert_array_equal(
        batch.future_observed_mask, [[False, True], [True, True], [True, True]]
    )
    np.testing.assert_array_equal(batch.loss_scale, [[1.0], [1.0], [2.0]])
    assert batch.past_covariates is None and batch.future_covariates is None


def test_forecast_windows_end_at_each_series_last_step_and_read_nothing_past_it():
    """From `last_origins` the context is the series' last steps and the targets, past its
    end, are unobserved: neither the next series nor its covariates leak into them."""
    panel = panel_of(np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0]), covariates=True)
    origins = panel.last_origins()
    np.testing.assert_array_equal(origins, [3, 5])
    np.testing.assert_array_equal(panel.series_of(origins), [0, 1])
    batch = gather_windows(panel, origins, context_length=3, horizon=2)
    np.testing.assert_array_equal(batch.past_values, [[1, 2, 3], [0, 10, 20]])
    np.testing.assert_array_equal(batch.past_observed_mask, [[True] * 3, [False, True, True]])
    assert not batch.future_observed_mask.any()
    assert not batch.future_values.any()
    np.testing.assert_array_equal(batch.loss_scale, [[1.0], [2.0]])
    # The covariate reads each step's index plus one; padding and steps past the end read 0.
    np.testing.assert_array_equal(batch.past_covariates[..., 0], [[1, 2, 3], [0, 4, 5]])
    assert not batch.future_covariates.any()


def test_covariates_of_a_window_are_those_of_its_steps():
    panel = panel_of(np.arange(6.0), covariates=True)
    batch = gather_windows(panel, np.array([1, 3]), context_length=2, horizon=2)
    np.testing.assert_array_equal(batch.past_covariates[..., 0], [[0, 1], [2, 3]])
    np.testing.assert_array_equal(batch.future_covariates[..., 0], [[2, 3], [4, 5]])


def test_with_history_keeps_only_the_last_steps_before_the_origin():
    """Each window as if its series had begun `keep` steps before the origin: earlier steps
    read 0 and unobserved, a gap or padding inside the kept steps stays unobserved, and the
    targets are untouched."""
    observed = torch.ones(4, 6, dtype=torch.bool)
    observed[1, 4] = False  # a gap among the kept steps
    observed[2, :3] = False  # left padding longer than what is cut
    batch = batch_of(observed)
    out = with_history(batch, torch.tensor([1, 3, 6, 0]))
    np.testing.assert_array_equal(
        out.past_observed_mask,
        [
            [False] * 5 + [True],
            [False, False, False, True, False, True],
            [False, False, False, True, True, True],
            [False] * 6,
        ],
    )
    np.testing.assert_array_equal(
        out.past_values, [[0, 0, 0, 0, 0, 6], [0, 0, 0, 4, 0, 6], [0, 0, 0, 4, 5, 6], [0] * 6]
    )
    assert out.future_values is batch.future_values
    assert out.future_observed_mask is batch.future_observed_mask


def test_frequency_masking_keeps_the_window_length_when_context_and_targets_are_odd():
    """L + H = 73: the joined window's spectrum is turned back into 73 steps, not 72."""
    batch = complete_batch(50, 48, 25)
    out = with_frequency_masking(batch, 1.0, 0.3, np.random.default_rng(0))
    assert out.past_values.shape == (50, 48) and out.future_values.shape == (50, 25)
    assert (out.future_values != batch.future_values).any()
    kept = with_frequency_masking(batch, 1.0, 0.0, np.random.default_rng(0))
    torch.testing.assert_close(kept.past_values, batch.past_values)
    torch.testing.assert_close(kept.future_values, batch.future_values)


def test_a_constant_series_counts_its_errors_relative_to_its_level():
    """Three readings of 0.1 leave a std of 1e-17 in floating point, not 0: the unit is still
    the level, not a spread that would weigh the series' errors 1e16 times."""
    values = np.concatenate([np.full(3, 0.1), np.full(7, 7.7)])
    np.testing.assert_allclose(series_scales(values, np.array([0, 3, 10]), "std"), [0.1, 7.7])


def test_a_panel_reads_the_rows_marked_unobserved_as_missing():
    """Masked rows (training glitches) are gaps: NaN in the panel, left out of the series'
    error unit too."""
    frame = pd.DataFrame(
        {
            "unique_id": ["a"] * 4 + ["b"] * 3,
            "ds": [*pd.date_range("2024-01-01", periods=4, freq="h")]
            + [*pd.date_range("2024-01-01", periods=3, freq="h")],
            "y": [1.0, 2.0, 1000.0, 4.0, 10.0, 20.0, 30.0],
        }
    )
    config = ModelConfig(prediction_length=2, loss_unit="std")
    unobserved = np.array([False, False, True, False, False, False, False])
    panel = SeriesPanel.from_validated(validate_long_frame(frame), config, unobserved)
    np.testing.assert_array_equal(panel.values, [1.0, 2.0, np.nan, 4.0, 10.0, 20.0, 30.0])
    assert panel.series_ids == ["a", "b"]
    np.testing.assert_array_equal(panel.offsets, [0, 4, 7])
    np.testing.assert_allclose(panel.loss_scale, [np.std([1.0, 2.0, 4.0]), np.std([10, 20, 30])])


def test_a_missing_covariate_reads_zero():
    frame = {"ds": pd.date_range("2024-01-01", periods=3, freq="h"), "x": [1.0, np.nan, 3.0]}
    cov = covariate_matrix(frame, ModelConfig(prediction_length=2, covariates=("x",)))
    assert cov.dtype == np.float32
    np.testing.assert_array_equal(cov, [[1.0], [0.0], [3.0]])
