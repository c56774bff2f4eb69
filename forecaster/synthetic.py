"""Synthetic multi-series data: level, trend, daily and weekly seasonality, noise.

Used by the demo and the tests so that the project runs without downloading anything. Each
series draws its own level, trend, seasonal amplitudes and phases and noise level, so a model
has to adapt to scale and shape rather than memorise one curve. Seasonality is a function of
the wall-clock time of `ds`, so it is meaningful at any frequency up to daily.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from forecaster.data import ID, TARGET, TIME
from forecaster.errors import InvalidConfigError
from forecaster.time_axis import regular_range

PROMO = "promo"


def generate_synthetic(
    n_series: int = 8,
    n_steps: int = 24 * 7 * 12,
    freq: str = "h",
    start: str = "2024-01-01",
    seed: int = 0,
    with_covariates: bool = False,
) -> pd.DataFrame:
    """Long frame (`unique_id`, `ds`, `y`) of `n_series` series of `n_steps` points each.

    y = level + trend * t + daily + weekly (+ lift * promo) + noise, where the daily and weekly
    terms are two harmonics each of the time of day and of the week, with per-series
    amplitudes and phases, and noise is AR(1) with a per-series scale.

    With `with_covariates`, a known-future 0/1 column `promo` is added: promotions run for
    random spells of a few hours to a day (about 15% of the time) and lift `y` by a per-series
    amount of half to all of its daily amplitude scale (several times the noise), so a model
    that reads the column forecasts visibly better than one that does not.
    """
    for name, value in (("n_series", n_series), ("n_steps", n_steps)):
        if not isinstance(value, int | np.integer) or value < 1:
            raise InvalidConfigError(f"{name}: expected an int >= 1, got {value!r}", field=name)
    rng = np.random.default_rng(seed)
    ds = pd.DatetimeIndex(regular_range(start, n_steps, freq))
    hours = (ds - ds[0]) / pd.Timedelta(hours=1)
    day_phase = 2 * np.pi * (ds.hour + ds.minute / 60.0).to_numpy() / 24.0
    week_phase = 2 * np.pi * (ds.day_of_week.to_numpy() + day_phase / (2 * np.pi)) / 7.0
    t = np.asarray(hours, dtype=np.float64) / 24.0  # days since start

    level = rng.uniform(10.0, 100.0, n_series)
    scale = level * rng.uniform(0.05, 0.3, n_series)  # seasonal amplitude relative to level
    trend = rng.normal(0.0, 0.02, n_series) * scale  # per day
    daily_amp = scale * rng.uniform(0.5, 1.0, n_series)
    weekly_amp = scale * rng.uniform(0.2, 0.8, n_series)
    phases = rng.uniform(0, 2 * np.pi, (n_series, 4))
    noise_sd = scale * rng.uniform(0.05, 0.2, n_series)

    def harmonic(amp: np.ndarray, phase: np.ndarray, p0: np.ndarray, p1: np.ndarray):
        return amp[:, None] * (
            np.sin(phase[None, :] + p0[:, None]) + 0.4 * np.sin(2 * phase[None, :] + p1[:, None])
        )

    y = (
        level[:, None]
        + trend[:, None] * t[None, :]
        + harmonic(daily_amp, day_phase, phases[:, 0], phases[:, 1])
        + harmonic(weekly_amp, week_phase, phases[:, 2], phases[:, 3])
        + _ar1_noise(rng, n_series, n_steps, noise_sd)
    )
    columns = {
        ID: pd.array(np.repeat([f"series_{i:03d}" for i in range(n_series)], n_steps), dtype="str"),
        TIME: np.tile(ds.to_numpy(), n_series),
    }
    if with_covariates:
        promo = _promotions(rng, n_series, n_steps, step_hours=_step_hours(ds))
        lift = scale * rng.uniform(0.5, 1.0, n_series)
        y = y + lift[:, None] * promo
        columns[TARGET] = y.reshape(-1)
        columns[PROMO] = promo.reshape(-1).astype(np.float64)
    else:
        columns[TARGET] = y.reshape(-1)
    return pd.DataFrame(columns)


def _ar1_noise(rng: np.random.Generator, n_series: int, n_steps: int, sd: np.ndarray):
    """AR(1) noise with coefficient 0.6 and marginal standard deviation `sd` per series."""
    phi = 0.6
    eps = rng.normal(0.0, 1.0, (n_series, n_steps)) * np.sqrt(1 - phi**2)
    out = np.empty_like(eps)
    out[:, 0] = rng.normal(0.0, 1.0, n_series)
    for i in range(1, n_steps):  # vectorised over series; one pass over time
        out[:, i] = phi * out[:, i - 1] + eps[:, i]
    return out * sd[:, None]


def _step_hours(ds: pd.DatetimeIndex) -> float:
    if len(ds) < 2:
        return 1.0
    return float((ds[1] - ds[0]) / pd.Timedelta(hours=1))


def _promotions(
    rng: np.random.Generator, n_series: int, n_steps: int, step_hours: float
) -> np.ndarray:
    """0/1 spells covering about 15% of the steps, 4 to 24 hours long (at least one step)."""
    spell_min = max(1, round(4 / step_hours))
    spell_max = max(spell_min + 1, round(24 / step_hours) + 1)
    mean_spell = (spell_min + spell_max - 1) / 2
    p_start = 0.15 / mean_spell
    promo = np.zeros((n_series, n_steps), dtype=np.int8)
    starts = rng.random((n_series, n_steps)) < p_start
    lengths = rng.integers(spell_min, spell_max, (n_series, n_steps))
    s_idx, t_idx = np.nonzero(starts)
    for s, t, length in zip(s_idx, t_idx, lengths[s_idx, t_idx], strict=True):
        promo[s, t : t + length] = 1
    return promo
