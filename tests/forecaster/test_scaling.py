"""The instance scaler: mask-aware statistics, precision, and rows with no spread."""

import pandas as pd
import pytest
import torch

from forecaster.scaling import InstanceScaler


def _statistics(values: list[float], observed: list[bool]):
    stats = InstanceScaler.statistics(
        torch.tensor([values], dtype=torch.float64), torch.tensor([observed])
    )
    return float(stats.loc), float(stats.scale)


@pytest.mark.parametrize("filler", [0.0, -1e9, float("nan")])
def test_unobserved_steps_take_no_part_in_the_statistics(filler):
    assert _statistics([filler, 2.0, 4.0], [False, True, True]) == (3.0, 1.0)


def test_a_series_far_from_zero_keeps_the_precision_of_its_moves():
    values = torch.tensor([[1e9, 1e9 + 1.0, 1e9 + 2.0, 1e9 + 1.0]], dtype=torch.float64)
    normalized, stats = InstanceScaler()(values, torch.ones_like(values, dtype=torch.bool))
    expected = torch.tensor([[-1.0, 0.0, 1.0, 0.0]]) * (2.0**0.5)
    torch.testing.assert_close(normalized, expected)
    assert float(stats.scale) == pytest.approx(0.5**0.5)


@pytest.mark.parametrize(
    ("values", "moves"),
    [
        ([1e12 + t for t in range(336)], 96.99),  # a counter at 1e12 that rises by 1
        ([1e12 + 3.0 * (-1) ** t for t in range(336)], 3.0),  # a reading at 1e12, +-3
        ([1e-12 * (t % 24) for t in range(336)], 6.92e-12),  # a series in units of 1e-12
        ([-5e-15 - 1e-18 * (t % 7) for t in range(336)], 2e-18),
    ],
)
def test_a_row_that_moves_is_scaled_by_its_spread_at_any_magnitude(values, moves):
    """Constant is relative to the level: neither small units nor a large level make a
    series that moves read as one that stood still (scaled by its level, it would forecast
    flat, or with a band a million times too wide)."""
    assert _statistics(values, [True] * len(values))[1] == pytest.approx(moves, rel=1e-3)


@pytest.mark.parametrize(
    ("values", "observed", "scale"),
    [
        ([0.0, 7.0, 0.0], [False, True, False], 7.0),  # one value: nothing says how it varies
        ([-2e6, -2e6, 0.0], [True, True, False], 1e6),  # n >= L / 2 equal values: level / n
        ([5.0] * 500, [True] * 500, 0.01),
        ([5.0] * 500, [True] * 249 + [False] * 251, 5.0),  # too few to say it stands still
        ([0.0, 0.0, 0.0], [True, True, True], 1.0),  # all zeros: the unit of its counts
        ([0.0, 0.0, 0.0], [False, False, False], 1.0),
    ],
)
def test_a_row_without_spread_gets_a_positive_scale(values, observed, scale):
    assert _statistics(values, observed)[1] == pytest.approx(scale)


def test_a_series_that_stood_still_forecasts_flat_with_a_narrow_band(fitted, series):
    """A meter stuck at 1e6 for the whole context (32 steps here) is scaled by 1e6 / 32, not by
    its level, which gave it a band wider than the level itself."""
    history = series[series["unique_id"] == series["unique_id"].iloc[0]].copy()
    history["unique_id"] = "stuck"
    history["y"] = 1e6
    forecast = fitted.predict(pd.concat([series, history], ignore_index=True))
    stuck = forecast[forecast["unique_id"] == "stuck"]
    assert (stuck["mean"] - 1e6).abs().max() < 1e4
    assert (stuck["q0.9"] - stuck["q0.1"]).max() < 1e5  # under 10 % of the level
    assert (stuck["q0.1"] <= stuck["q0.9"]).all()
    moving = forecast[forecast["unique_id"] != "stuck"]
    assert (moving["q0.9"] - moving["q0.1"]).min() > 0  # the others keep their bands


@pytest.mark.parametrize(
    ("values", "observed", "band_season", "unit"),
    [
        # Three steps of a cycle of 24 at level 100: its std (0.816) understates its swing.
        ([99.0, 100.0, 101.0], [True] * 3, 24, 100.0 / (2 / 3) ** 0.5),
        ([99.0, 100.0, 101.0], [True] * 3, 3, 1.0),  # a whole season observed: the std
        ([99.0, 100.0, 101.0], [True] * 3, 1, 1.0),  # no season
        ([0.0, 0.0, 0.0, -1.0, 0.0, 1.0], [False] * 3 + [True] * 3, 24, 1.0),  # level 0 < std
        ([7.0, 7.0, 0.0], [True, True, False], 24, 1.0),  # no spread: scaled by its level
    ],
)
def test_a_window_shorter_than_a_season_learns_its_band_in_its_level(
    values, observed, band_season, unit
):
    stats = InstanceScaler.statistics(
        torch.tensor([values], dtype=torch.float64), torch.tensor([observed]), band_season
    )
    assert float(stats.band_unit) == pytest.approx(unit)


@pytest.mark.parametrize(("value", "n"), [(0.1, 1000), (123.456, 10_000), (0.3, 1000)])
def test_a_constant_row_whose_mean_rounds_still_stood_still(value, n):
    """The mean of n equal float64 values is off by a few eps (0.1 x 1000 leaves a std of
    2.8e-17, 2.8e-16 of the level): still constant, scaled by level / n, not by that noise
    (which made its normalised values +-1 instead of 0)."""
    assert _statistics([value] * n, [True] * n)[1] == pytest.approx(value / n)


def test_the_scaler_applies_its_band_season_in_the_forward_pass():
    """The model's scaler is built with the season as its band_season; its forward pass,
    which training and prediction call, must use it, not only `statistics`."""
    values = torch.tensor([[0.0] * 21 + [99.0, 100.0, 101.0]], dtype=torch.float64)
    observed = torch.tensor([[False] * 21 + [True] * 3])
    _, stats = InstanceScaler(band_season=24)(values, observed)
    assert float(stats.band_unit) == pytest.approx(100.0 / (2 / 3) ** 0.5)
    _, stats = InstanceScaler()(values, observed)
    assert float(stats.band_unit) == 1.0
