"""Glitches: an isolated reading far from its neighbours is masked before forecasting, and
nothing a real series does often (level shifts, spikes at the end, flat counts) is."""

import copy
import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch

from forecaster import Forecaster, ModelConfig, TrainConfig, glitches
from forecaster.errors import InvalidConfigError
from forecaster.glitches import glitch_mask, mask_glitches, series_glitches
from tests.forecaster.conftest import TINY_MODEL, TINY_TRAIN


def _noisy_daily_cycle(n: int = 200, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return 100 + 10 * np.sin(2 * np.pi * t / 24) + rng.normal(0, 1, n)


def _glitches(
    values: np.ndarray,
    observed: np.ndarray | None = None,
    season: int = 24,
    seasonal_factor: float | None = None,
    threshold: float = 8.0,
    zero_ratio: float | None = None,
) -> list[int]:
    """The glitches of one series: the window's test alone at 8 robust deviations unless a
    `seasonal_factor` asks the cycle's too, or a `zero_ratio` the zeros'."""
    x = torch.tensor(values[None], dtype=torch.float64)
    mask = (
        torch.ones_like(x, dtype=torch.bool) if observed is None else torch.tensor(observed[None])
    )
    found = glitch_mask(x, mask, threshold, season, seasonal_factor, zero_ratio)
    return torch.nonzero(found[0]).flatten().tolist()


# The defaults' rule: both tests, at their default thresholds.
RULE = {
    "threshold": TrainConfig().glitch_threshold,
    "seasonal_factor": TrainConfig().seasonal_glitch_factor,
    "zero_ratio": TrainConfig().zero_glitch_ratio,
}


def _strong_daily_cycle(n: int = 24 * 14, seed: int = 0) -> np.ndarray:
    """A cycle whose daily swing dwarfs its level's noise, as a load or traffic series'."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return 50 + 40 * np.sin(2 * np.pi * t / 24) + rng.normal(0, 1, n)


def test_a_clean_series_has_no_glitch():
    assert _glitches(_noisy_daily_cycle()) == []


@pytest.mark.parametrize("factor", [10.0, 0.0, -1.0])
def test_a_single_reading_far_from_its_neighbours_is_a_glitch(factor):
    values = _noisy_daily_cycle()
    values[120] *= factor
    assert _glitches(values) == [120]


@pytest.mark.parametrize("steps", [2, 3, 5, 30])
def test_a_level_shift_is_not_a_glitch(steps):
    """Two outlying steps in a row or more are the series moving, not a bad reading."""
    values = _noisy_daily_cycle()
    values[-steps:] += 200
    assert _glitches(values) == []
    values = _noisy_daily_cycle()
    values[100 : 100 + steps] += 200
    assert _glitches(values) == []


@pytest.mark.parametrize("seed", range(5))
def test_a_shift_that_lasts_to_the_end_is_never_masked(seed):
    """Under the defaults' rule, at every length: where the window is cut at the row's end, it
    held as many steps before the shift as after it, and the first step of a shift held over
    the last 12 was masked (9 of 190 trials)."""
    rng = np.random.default_rng(seed)
    for steps in range(2, 25):
        values = _noisy_daily_cycle(24 * 14, seed=int(rng.integers(1 << 30)))
        values[-steps:] += rng.choice([-1, 1]) * rng.uniform(20, 80)
        assert _glitches(values, **RULE) == [], steps


def test_a_step_with_one_neighbour_must_lie_twice_as_far_out():
    """The last reading, a series' first and one beside a gap cannot be told from the start
    of a shift by their other side: 12 robust deviations out is a glitch between two ordinary
    neighbours, not at an edge; 30 is one anywhere."""
    rng = np.random.default_rng(0)
    noise = 100 + rng.normal(0, 1, 120)  # robust deviation about 1
    for where in (0, 60, 119):
        for jump, glitch in ((12.0, where == 60), (30.0, True)):
            values = noise.copy()
            values[where] += jump
            assert _glitches(values) == ([where] if glitch else []), (where, jump)
    values = noise.copy()
    values[60] += 12.0
    observed = np.ones_like(values, dtype=bool)
    observed[61] = False  # beside a gap
    assert _glitches(values, observed) == []
    values[60] += 18.0
    assert _glitches(values, observed) == [60]


def test_a_drop_inside_a_strong_cycle_is_found_by_the_cycle_not_the_window():
    """A zero at the top of a daily swing lies within the swing of its 25-step window, so the
    window's median misses it; the same hour of the days around it does not."""
    values = _strong_daily_cycle()
    values[24 * 7 + 6] = 0.0  # 06:00, the day's peak (90)
    assert _glitches(values) == []
    assert _glitches(values, **RULE) == [24 * 7 + 6]


@pytest.mark.parametrize("where", [1, 3, 26, 28])
def test_a_zero_near_the_ends_of_a_trend_is_found_by_its_neighbours(where):
    """Without a season the cycle's reference is the steps on either side. Near the ends of a
    short trending series the window is cut and its median lags the trend, so a zero there
    lies within the window's spread, not within its neighbours'; and one neighbour that is a
    glitch does not make the next step look like one."""
    rng = np.random.default_rng(1)
    values = 1000 + 100 * np.arange(30) + rng.normal(0, 20, 30)
    values[where] = 0.0
    assert _glitches(values, season=1) == []
    assert _glitches(values, season=1, **RULE) == [where]


@pytest.mark.parametrize("kind", ["a day apart", "the cycle moving", "a level shift"])
def test_what_a_cycle_does_as_a_whole_is_not_a_glitch(kind):
    """Steps that leave the cycle together (a holiday, the peak moving to another hour from a
    day on, a new level) are the series changing: none is isolated."""
    t = np.arange(24 * 14)
    values = _strong_daily_cycle()
    if kind == "a day apart":
        values[24 * 7 : 24 * 8] = 50 + 5 * np.sin(2 * np.pi * t[:24] / 24)
    elif kind == "the cycle moving":
        values[24 * 9 :] = 50 + 40 * np.sin(2 * np.pi * (t[24 * 9 :] - 3) / 24)
    else:
        values[24 * 9 + 5 :] += 60
    assert _glitches(values, **RULE) == []


def test_a_glitch_found_by_the_window_is_not_read_into_the_cycle():
    """The window finds a reading ten times too high first; the cycle's test then reads the
    days around without it, so the same hour a day away is not taken for a glitch too."""
    values = _strong_daily_cycle(seed=3)
    values[24 * 7 + 6] *= 10
    assert _glitches(values, **RULE) == [24 * 7 + 6]


@pytest.mark.parametrize("seed", [0, 1, 4])
def test_a_dropped_reading_in_a_short_noisy_trend_is_found_by_the_zeros_test(seed):
    """Twenty noisy points of a trend: a zero lies within the spread both references measure,
    but far below every other reading of the series."""
    rng = np.random.default_rng(seed)
    values = 2000 + 150 * np.arange(20) + rng.normal(0, 300, 20)
    values[10] = 0.0
    without_zeros = {**RULE, "zero_ratio": None}
    assert _glitches(values, season=1, **without_zeros) == []
    assert _glitches(values, season=1, **RULE) == [10]


def test_a_zero_with_one_neighbour_needs_the_others_twice_as_far_from_zero():
    """Readings spread over 40-160 around 100: a zero between two of them is a glitch at a
    ratio of 0.3 (their nearest approach, 0.4 of the level, is further), the last reading
    zero only at a ratio of 0.15 (0.3 with one neighbour)."""
    rng = np.random.default_rng(0)
    values = 100 + rng.uniform(-60, 60, 60)
    values[30] = 0.0
    assert _glitches(values, season=1, seasonal_factor=1.0, threshold=12, zero_ratio=0.3) == [30]
    values[30], values[-1] = 100.0, 0.0
    assert _glitches(values, season=1, seasonal_factor=1.0, threshold=12, zero_ratio=0.3) == []
    assert _glitches(values, season=1, seasonal_factor=1.0, threshold=12, zero_ratio=0.15) == [59]


@pytest.mark.parametrize("mean", [2.0, 5.0, 10.0])
def test_counts_of_a_few_units_keep_their_zeros(mean):
    """A zero among counts of a few units is a few steps of their resolution from the other
    readings: it is data, not a dropout."""
    rng = np.random.default_rng(0)
    counts = torch.tensor(rng.poisson(mean, size=(100, 336)).astype(np.float64))
    assert (counts == 0).any()
    found = glitch_mask(counts, torch.ones_like(counts, dtype=torch.bool), **RULE, season=24)
    assert not (found & (counts == 0)).any()


def test_flat_counts_are_never_glitches():
    """Where most readings equal the window's median (intermittent sales), its absolute
    deviation is 0, and any sale would otherwise be a glitch."""
    values = np.zeros(100)
    values[[10, 40, 41, 77]] = [5.0, 1.0, 30.0, 2.0]
    assert _glitches(values) == []
    assert _glitches(values, season=7, **RULE) == []


def test_unobserved_steps_take_no_part_and_may_hold_anything():
    values = _noisy_daily_cycle()
    values[120] *= 10
    observed = np.ones_like(values, dtype=bool)
    observed[[50, 51, 52, 130]] = False
    values[[50, 51, 52, 130]] = [np.nan, 1e12, -1e12, np.nan]
    assert _glitches(values, observed) == [120]
    observed[[119, 121]] = False  # a glitch between two gaps: no neighbour to judge it by
    assert _glitches(values, observed) == []


@pytest.mark.parametrize("length", [20, 25, 26, 336])
def test_many_rows_median_as_torch_nanmedian_does_to_the_bit(length, monkeypatch):
    """Blocks of many rows take a selection network instead of `torch.nanmedian`: the same
    medians, with ties, gaps, whole rows unobserved and windows cut at the ends; rows shorter
    than a window keep nanmedian. Every block takes the network here, however small."""
    monkeypatch.setattr(glitches, "_NETWORK_MIN_WINDOWS", 1)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(400, length, dtype=torch.float64, generator=generator).round(decimals=1)
    x[::5, 3:9] = float("nan")
    x[1::7, -2:] = float("nan")
    x[2::11] = float("nan")
    half = glitches.GLITCH_WINDOW // 2
    windows = torch.nn.functional.pad(x, (half, half), value=float("nan")).unfold(
        1, glitches.GLITCH_WINDOW, 1
    )  # (B, L, W)
    expected = windows.nanmedian(dim=-1).values
    found = glitches._rolling_nanmedian(x, glitches.GLITCH_WINDOW)
    assert torch.equal(found.isnan(), expected.isnan())
    assert torch.equal(found.nan_to_num(), expected.nan_to_num())


def test_no_threshold_masks_nothing():
    values = torch.tensor(_noisy_daily_cycle()[None])
    values[0, 120] *= 10
    observed = torch.ones_like(values, dtype=torch.bool)
    assert mask_glitches(values, observed, None) is observed
    assert not mask_glitches(values, observed, 8.0)[0, 120]


def test_series_laid_end_to_end_are_each_read_alone(monkeypatch):
    """`series_glitches` finds in each series of a panel what `glitch_mask` finds in it alone,
    however many series share a block of rows."""
    rng = np.random.default_rng(1)
    histories = []
    for n in [2, 5, 40, 200, 333, 24 * 14]:
        values = _noisy_daily_cycle(n, seed=n)
        values[rng.choice(n, size=1 + n // 60, replace=False)] *= 10
        values[rng.random(n) < 0.05] = np.nan
        histories.append(values)
    expected = np.concatenate(
        [
            glitch_mask(torch.tensor(h[None]), torch.tensor(~np.isnan(h[None])), **RULE, season=24)
            .numpy()
            .ravel()
            for h in histories
        ]
    )
    assert expected.sum() >= 4
    values = np.concatenate(histories)
    offsets = np.cumsum([0] + [len(h) for h in histories])
    for steps_at_once in [1 << 20, 400, 1]:
        monkeypatch.setattr(glitches, "_STEPS_AT_ONCE", steps_at_once)
        found = series_glitches(
            values, offsets, RULE["threshold"], 24, RULE["seasonal_factor"], RULE["zero_ratio"]
        )
        np.testing.assert_array_equal(found, expected)
    assert not series_glitches(values, offsets, None).any()


def test_contexts_read_from_their_first_observation_find_what_whole_rows_do(monkeypatch):
    """`mask_glitches` skips each row's left padding and groups rows by width; it masks what
    `glitch_mask` finds reading every row whole, whatever the padding holds, for rows
    as short as one observed step and rows with nothing observed."""
    rng = np.random.default_rng(2)
    length, rows = 24 * 14, []
    for k, n in enumerate([0, 1, 2, 3, 5, 30, 40, 150, 200, 335, length, length]):
        values = np.full(length, np.nan)
        values[length - n :] = _noisy_daily_cycle(n, seed=k)
        if n:
            values[length - n + rng.choice(n, size=1 + n // 60, replace=False)] *= 10
        values[rng.random(length) < 0.05] = np.nan
        rows.append(values)
    rows[4][-3] = 0.0  # a zero far out of its short row's range
    values = torch.tensor(np.stack(rows))
    observed = ~values.isnan()
    expected = glitch_mask(values, observed, **RULE, season=24)
    assert expected.sum() >= 5
    values = torch.where(observed, values, torch.tensor(rng.normal(0, 1e6, values.shape)))
    for steps_at_once in [1 << 20, 400, 1]:
        monkeypatch.setattr(glitches, "_STEPS_AT_ONCE", steps_at_once)
        kept = mask_glitches(
            values, observed, RULE["threshold"], 24, RULE["seasonal_factor"], RULE["zero_ratio"]
        )
        assert torch.equal(kept, observed & ~expected)


def _with_glitch(series: pd.DataFrame, value: float) -> pd.DataFrame:
    """`series` with one reading, ten steps before the end of the first series, replaced."""
    first = series["unique_id"] == series["unique_id"].iloc[0]
    where = series.index[first][-10]
    changed = series.copy()
    changed.loc[where, "y"] = value
    return changed


def test_a_glitch_forecasts_as_the_same_step_missing(fitted, series):
    """The masked glitch is read as a NaN is: the forecast is the gap's, to the digit, and far
    from what the unmasked glitch gives."""
    level = float(series["y"].abs().max())
    glitched = fitted.predict(_with_glitch(series, 10 * level))
    missing = fitted.predict(_with_glitch(series, np.nan))
    pd.testing.assert_frame_equal(glitched, missing)
    named = fitted.prepare(_with_glitch(series, 10 * level)).glitch_timestamps
    assert list(named[0]) == [
        series["ds"][series["unique_id"] == series["unique_id"].iloc[0]].iloc[-10]
    ]
    assert all(len(stamps) == 0 for stamps in named[1:])
    unmasked = copy.copy(fitted)
    unmasked.train_config = dataclasses.replace(fitted.train_config, glitch_threshold=None)
    raw = unmasked.predict(_with_glitch(series, 10 * level))
    assert (raw["mean"] - missing["mean"]).abs().max() > 1e-3 * level


def test_fit_names_the_glitches_of_whole_histories_and_trains_on_them(series):
    """By default fit reads each series' whole history by the model's rule and names what it
    finds, and trains on the readings as they are; without a rule it finds nothing."""
    level = float(series["y"].abs().max())
    model, train = ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN)
    glitched = _with_glitch(series, 10 * level)
    fitted = Forecaster(model, train).fit(glitched)
    first = series[series["unique_id"] == series["unique_id"].iloc[0]]
    assert fitted.training_glitches.to_dict("list") == {
        "unique_id": [first["unique_id"].iloc[-10]],
        "ds": [first["ds"].iloc[-10]],
    }
    assert fitted.train_result.n_glitches == 1
    missing = Forecaster(model, train).fit(_with_glitch(series, np.nan))
    difference = fitted.predict(series)["mean"] - missing.predict(series)["mean"]
    assert difference.abs().max() > 1e-3 * level  # trained on
    no_rule = dataclasses.replace(train, glitch_threshold=None)
    unread = Forecaster(model, no_rule).fit(glitched)
    assert unread.training_glitches.empty and unread.train_result.n_glitches == 0
    assert missing.training_glitches.empty
    # Integer ids and Berlin times: named as given, so that they merge back onto the frame
    # (they came as text ids and naive UTC times).
    codes = {sid: k for k, sid in enumerate(series["unique_id"].unique())}
    typed = glitched.assign(
        unique_id=glitched["unique_id"].map(codes).astype("int64"),
        ds=glitched["ds"].dt.tz_localize("Europe/Berlin"),
    )
    named = Forecaster(model, train).fit(typed).training_glitches
    found = typed.merge(named, on=["unique_id", "ds"])
    assert len(found) == 1 and found["y"].iloc[0] == 10 * level


def test_masked_training_leaves_a_glitch_out_as_a_missing_reading(series):
    """With `mask_training_glitches` a glitch in the training data neither sets a window's
    scale nor counts as a target: the model trains as if the reading were missing, to the
    digit."""
    level = float(series["y"].abs().max())
    model = ModelConfig(**TINY_MODEL)
    train = TrainConfig(**TINY_TRAIN, mask_training_glitches=True)
    glitched = Forecaster(model, train).fit(_with_glitch(series, 10 * level))
    missing = Forecaster(model, train).fit(_with_glitch(series, np.nan))
    pd.testing.assert_frame_equal(glitched.predict(series), missing.predict(series))
    assert (glitched.train_result.n_glitches, missing.train_result.n_glitches) == (1, 0)


def test_a_model_saved_before_the_rule_loads_without_it(fitted, tmp_path):
    path = fitted.save(tmp_path / "model")
    meta = json.loads((path / "config.json").read_text())
    del meta["train_config"]["glitch_threshold"]
    (path / "config.json").write_text(json.dumps(meta))
    del meta["train_config"]["seasonal_glitch_factor"]
    (path / "config.json").write_text(json.dumps(meta))
    del meta["train_config"]["zero_glitch_ratio"]
    (path / "config.json").write_text(json.dumps(meta))
    old = Forecaster.load(path).train_config
    assert (old.glitch_threshold, old.seasonal_glitch_factor, old.zero_glitch_ratio) == (
        None,
        None,
        None,
    )
    new = Forecaster.load(fitted.save(tmp_path / "new")).train_config
    assert (new.glitch_threshold, new.seasonal_glitch_factor, new.zero_glitch_ratio) == (
        12.0,
        1.0,
        0.1,
    )


@pytest.mark.parametrize("threshold", [0.0, -1.0, float("inf"), float("nan")])
def test_the_threshold_must_be_positive_and_finite(threshold):
    with pytest.raises(InvalidConfigError, match="glitch_threshold"):
        TrainConfig(glitch_threshold=threshold)
    with pytest.raises(InvalidConfigError, match="seasonal_glitch_factor"):
        TrainConfig(seasonal_glitch_factor=threshold)
    with pytest.raises(InvalidConfigError, match="zero_glitch_ratio"):
        TrainConfig(zero_glitch_ratio=threshold - 1.0)


@pytest.mark.parametrize("second", [400.0, -200.0])
def test_two_outlying_steps_in_a_row_are_not_glitches_however_far_apart(second):
    """A neighbour that is itself outlying is no ordinary reading to judge a step by, even
    when the two lie far from each other (+200 then +400, or +200 then -200)."""
    values = _noisy_daily_cycle()
    values[100] += 200
    values[101] += second
    assert _glitches(values) == []
    assert _glitches(values, **RULE) == []


def test_the_seasonal_factor_scales_the_cycles_threshold():
    """A zero at the day's peak lies about 80 robust deviations from the same hour of the days
    around it: a glitch at 8 or 40 of them, not at 160."""
    values = _strong_daily_cycle()
    values[24 * 7 + 6] = 0.0
    assert _glitches(values, seasonal_factor=1.0) == [24 * 7 + 6]
    assert _glitches(values, seasonal_factor=5.0) == [24 * 7 + 6]
    assert _glitches(values, seasonal_factor=20.0) == []


@pytest.mark.parametrize("spike", [29, 31])
def test_a_zero_beside_a_glitch_is_judged_as_beside_a_gap(spike):
    """The level's glitch is masked before the zeros are read: the zero beside it has one
    neighbour, so the other readings (their nearest 0.4 of the level) must lie twice the
    ratio from zero: at 0.3 it is kept, at 0.15 it is a glitch."""
    rng = np.random.default_rng(0)
    values = 100 + rng.uniform(-60, 60, 60)
    values[spike], values[30] = 1000.0, 0.0
    rule = {"season": 1, "seasonal_factor": 1.0, "threshold": 12}
    assert _glitches(values, **rule, zero_ratio=0.3) == [spike]
    assert _glitches(values, **rule, zero_ratio=0.15) == sorted([spike, 30])
