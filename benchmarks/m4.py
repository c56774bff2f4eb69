"""M4 benchmark, the competition's protocol, for the patch Transformer and its peers, on any of
M4's six groups (Yearly, Quarterly, Monthly, Weekly, Daily, Hourly).

    python -m benchmarks.m4 --data ../shared/data/m4/Hourly-train.csv --json OUT
    python -m benchmarks.m4 --data Daily-train.csv --test Daily-test.csv   # the scored run
    python -m benchmarks.m4 --data some.csv --group Monthly

The group is `--group`, else the data file's name before its first "-" (`Daily-train.csv`);
`GROUPS` holds each group's settings. Without `--test`, each series' last H points (the group's
horizon: 48 for Hourly) are held out from the training file and scored (validation: every
default was chosen this way, on Hourly). With `--test` (the same layout: an id column, then the
H values after each series), the model is fitted on the whole training file and scored on the
test file. The library's defaults are used with prediction_length=H.

Metrics are the competition's: sMAPE (percent), MASE with the group's seasonality m (Hourly 24,
Monthly 12, Quarterly 4, Weekly, Daily and Yearly 1; scaled by each series' in-sample
seasonal-naive MAE), and OWA = (sMAPE / sMAPE_Naive2 + MASE / MASE_Naive2) / 2. OWA's Naive2
figures: for Hourly, the published ones of its test set (18.383 / 2.395), for every Hourly row,
as in every Hourly result reported so far; for the other groups, Naive2's own scores on the same
split (the "Naive2 (same split)" row, whose OWA is therefore 1), which with `--test` is the
competition's definition of OWA. Damaged histories (`--short-and-gappy`, `--gap-patterns`) are
scored against Naive2 on the undamaged histories; the JSON records the figures used.
Naive2 is the competition's: where m is 1, the last value.

M4 gives no timestamps: the library is fitted on a regular synthetic index of the group's
frequency, every series starting at the group's origin (Hourly: hourly from 2000-01-01), and
derives its patch and season from that frequency. The origins let every M4 series and its
horizon fit pandas' datetime64[ns] range (1677-09-22 .. 2262-04-11) where it can hold them:
Monthly's longest series (2,794 months, 233 years) start in 1800. Yearly's longest (835 years)
cannot fit: from 1678, the first year start in range, it holds 585 years, so the frame the
library is fitted on and predicts from keeps each series' most recent 579 points (585 minus the
horizon; the model reads at most context_length = 336 steps anyway). MASE's scale and Naive2
keep the full history; seasonal naive reads each series' last season only, which the cut keeps.

`--short-and-gappy` runs the same protocol on damaged histories, what catalogues of new
products or sensors look like: a third of the series are cut to a random length between 2
points and one context plus one horizon, and 5 % of every history's points are missing (NaN).
MASE keeps the scale of each series' full history. Ours is scored beside naive and seasonal
naive (which repeat the last observed values); the peers are skipped (they refuse NaN).

`--gap-patterns` scores each fitted model once more for each outage of `gap_patterns`, applied
at forecast time to every history, beside seasonal naive on the same damaged histories: what a
live feed's outage costs a model trained on clean data. Outages are counted in seasons of m
steps, named by what a season spans: for Hourly 5 % of points missing, the last day, one day a
week back, the last three days; for Monthly and Quarterly the last year, one year seven years
back, the last three years. Where m is 1 a season is one step, named by the step: on Daily data
"last day missing" is one missing point and "last three days missing" three, on Weekly
"one week seven weeks back missing", on Yearly "last year missing". An outage never takes a
history's first two points (M4's shortest Monthly and Quarterly holdout histories are two years).
The same option cuts every history to L - 1, L - m and L / 2 points (L the model's
context_length): series that began recently, forecast by a model trained on long ones.

`--refit` scores each fitted model's refit as well: the same configuration trained on every
window, each series' held-out validation tail included, along the path validation kept (what
`pipelines` serves after a promotion; `TrainConfig.tail_epochs` is the library's cheaper
default, docs/model-choices.md).

`--glitches` scores each fitted model on histories with one glitch a series, a reading ten
times too high ("x10") or zero ("zero") at a random observed step of the last context (one
draw for every kind, seed 0), with the library's glitch rule (`TrainConfig.glitch_threshold`,
`TrainConfig.seasonal_glitch_factor`, `forecaster.glitches`), with its window's test alone,
and without a rule, and the clean holdout in each setting: what the rule recovers and what it
costs clean histories.

`--dirty-training RATE` makes each reading of every history a glitch (ten times too high or
zero, evenly) with probability RATE before anything fits or forecasts, the holdout left clean:
what glitches all along the training data cost, and what leaving out those the rule finds
recovers (`--set train.mask_training_glitches=true`).

`--attention` scores each fitted model once more with each kind of its attention made uniform
(`forecaster.explain`): what attention earns on the held-out points, and how peaked it is.

Peers run in the same command when the optional extra is installed (`pip install -e
".[peers]"`, best in its own virtual environment: statsforecast needs pandas < 3): NeuralForecast's
NHITS and PatchTST with their documented defaults (h = H, input_size 7 * H, max_steps 1000,
scaler_type "robust") and statsforecast's MSTL with the group's seasons (Hourly 24 and 168,
Daily 7, Monthly 12, Quarterly 4; skipped for Weekly and Yearly), on the same index as ours.
NeuralForecast refuses to fit a series shorter than input_size unless its start padding is on
(off by default): every M4 group but Hourly has such series (Daily's shortest has 93 points, its
input_size is 98), so there the peers run with `start_padding_enabled=True`, and their rows say so.

Data: the M4 competition (Makridakis, Spiliotis and Assimakopoulos, IJF 2020), read from
`../shared/data/m4/`; no copy is kept in this repository.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from benchmarks.overrides import add_set_option, overrides_of
from benchmarks.peers import neuralforecast_model
from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster.baselines import SeasonalNaive
from forecaster.data import quantile_column
from forecaster.explain import LABELS, PARTS, attention_summary, uniform_attention
from forecaster.metrics import coverage, coverage_by_history, mase_scale, smape


@dataclass(frozen=True)
class Group:
    """One M4 group: the competition's horizon and season, and how this benchmark runs it."""

    name: str
    horizon: int  # H, the competition's
    season: int  # m of MASE's scale and of Naive2's seasonality test, the competition's
    freq: str  # pandas frequency of the synthetic regular index the library is fitted on
    origin: pd.Timestamp  # the index's first step: every series starts there
    mstl_seasons: tuple[int, ...]  # statsforecast MSTL's seasons; () skips MSTL
    season_label: str  # what one season of m steps spans, for labels ("day": 24 hours)
    # Published test-set scores of Naive2 (sMAPE, MASE): OWA's reference when given.
    naive2: tuple[float, float] | None = None
    # Published test-set scores printed under the table: (name, sMAPE, MASE, OWA or None).
    anchors: tuple[tuple[str, float, float, float | None], ...] = ()


# Any regular index will do, M4 gives no timestamps; the origins only have to let the series fit
# pandas' datetime64[ns] range (1677-09-22 .. 2262-04-11), and Hourly's is the one its earlier
# runs used, so they reproduce.
GROUPS = {
    group.name: group
    for group in (
        # The first year start in range; longer series are cut (see `max_history`).
        Group("Yearly", 6, 1, "YS", pd.Timestamp("1678-01-01"), (), "year"),
        # 1800: M4's longest Quarterly (866 + 8 steps), Monthly (2,794 + 18) series end by 2034.
        Group("Quarterly", 8, 4, "QS", pd.Timestamp("1800-01-01"), (4,), "year"),
        Group("Monthly", 18, 12, "MS", pd.Timestamp("1800-01-01"), (12,), "year"),
        # 2000: M4's longest Weekly (2,597 + 13 steps), Daily (9,919 + 14) series end by 2050.
        Group("Weekly", 13, 1, "W-SUN", pd.Timestamp("2000-01-02"), (), "week"),  # a Sunday
        Group("Daily", 14, 1, "D", pd.Timestamp("2000-01-01"), (7,), "day"),
        Group(
            "Hourly",
            48,
            24,
            "h",
            pd.Timestamp("2000-01-01"),
            (24, 168),
            "day",
            naive2=(18.383, 2.395),
            anchors=(
                ("seasonal naive (published)", 13.912, 1.193, None),
                ("ES-RNN, M4 winner (published)", 9.328, 0.893, 0.440),
            ),
        ),
    )
}


def group_of(name: str | None, data: Path) -> Group | None:
    """The group `name` (`--group`) gives, else the one the data file's name starts with before
    its first "-" (`Daily-train.csv`), either case-insensitively; None when neither names one."""
    key = name if name is not None else data.name.partition("-")[0]
    return GROUPS.get(key.capitalize())


@functools.cache
def max_history(group: Group) -> int:
    """Most points of a series the library is given: as many as fit pandas' datetime64[ns]
    range from the group's origin with the horizon after them (585 - 6 for Yearly)."""
    # Counted in seconds: pandas steps once past the end, which overflows nanoseconds.
    end = pd.Timestamp.max.floor("s").as_unit("s")
    steps = pd.date_range(group.origin, end, freq=group.freq, unit="s")
    return len(steps) - group.horizon


@dataclass(frozen=True)
class Split:
    group: Group
    ids: list[str]
    history: list[np.ndarray]  # per series, what the models see (NaN = missing)
    truth: np.ndarray  # (S, H)
    scales: np.ndarray  # (S,) in-sample seasonal-naive MAE of the full history, MASE's scale


def read_wide(path: Path) -> dict[str, np.ndarray]:
    """M4's layout: one row per series, the id first, then values (empty after the end)."""
    frame = pd.read_csv(path)
    ids = frame.iloc[:, 0].astype(str).tolist()
    values = frame.iloc[:, 1:].to_numpy(dtype=np.float64)
    return {sid: row[~np.isnan(row)] for sid, row in zip(ids, values, strict=True)}


def make_split(train_path: Path, test_path: Path | None, group: Group) -> Split:
    train = read_wide(train_path)
    ids = list(train)
    horizon = group.horizon
    if test_path is None:
        history = [train[sid][:-horizon] for sid in ids]
        truth = np.stack([train[sid][-horizon:] for sid in ids])
        return Split(group, ids, history, truth, _scales(history, group.season))
    test = read_wide(test_path)
    missing = [sid for sid in ids if sid not in test or len(test[sid]) < horizon]
    if missing:
        raise SystemExit(
            f"error: --test {test_path}: expected {horizon} values for every series of the "
            f"training file; {len(missing)} missing or short, e.g. {missing[0]!r}"
        )
    history = [train[sid] for sid in ids]
    truth = np.stack([test[sid][:horizon] for sid in ids])
    return Split(group, ids, history, truth, _scales(history, group.season))


def _scales(history: list[np.ndarray], season: int) -> np.ndarray:
    return np.array([mase_scale(h, season) for h in history])


def short_and_gappy(split: Split, context_length: int, seed: int = 0) -> Split:
    """A third of the series cut to 2 .. context + horizon points; 5 % of all points NaN."""
    rng = np.random.default_rng(seed)
    history = []
    cut = rng.random(len(split.ids)) < 1 / 3
    for h, short in zip(split.history, cut, strict=True):
        if short:
            h = h[-int(rng.integers(2, context_length + split.group.horizon + 1)) :]
        h = h.copy()
        missing = rng.random(len(h)) < 0.05
        missing[-1] = False  # the origin is observed: what is scored is the forecast, not luck
        if (~missing).sum() < 2:
            missing[:] = False
        h[missing] = np.nan
        history.append(h)
    return replace(split, history=history)


Damage = Callable[[np.ndarray, np.random.Generator], np.ndarray]


def _missing_at_random(h: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    missing = rng.random(len(h)) < 0.05
    missing[-1] = False
    return np.where(missing, np.nan, h)


def _missing_span(start: int, stop: int | None) -> Damage:
    def damage(h: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        h = h.copy()
        # The first two points stay observed: a history wholly missing has nothing to forecast
        # from (M4's shortest Monthly and Quarterly holdout histories are two seasons long).
        h[max(len(h) + start, 2) : stop] = np.nan
        return h

    return damage


def _cut_to(points: int) -> Damage:
    def damage(h: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return h[-points:]

    return damage


def gap_patterns(group: Group, context_length: int | None = None) -> dict[str, Damage]:
    """Outages a live feed has at forecast time, in seasons of the group's m steps (Hourly:
    days), applied to every history of a gap-free split, by label. With `context_length` L,
    also histories cut a little and a lot shorter than the context (L - 1, L - m and L / 2
    points): a series that began recently, forecast by a model trained on long ones."""
    m, season = group.season, group.season_label
    # Seven days make a week (Hourly, Daily); seven years or weeks are counted.
    seven = "a week" if season == "day" else f"seven {season}s"
    patterns = {
        "5% of points missing at random": _missing_at_random,
        f"last {season} missing": _missing_span(-m, None),
        f"one {season} {seven} back missing": _missing_span(-7 * m, -6 * m),
        f"last three {season}s missing": _missing_span(-3 * m, None),
    }
    if context_length is not None:
        cuts = {
            "one point short of the context": context_length - 1,
            f"one {season} short of the context": context_length - m,
            "half the context": context_length // 2,
        }
        taken: set[int] = set()  # where m is 1, L - 1 and L - m are one cut
        for label, points in cuts.items():
            if points >= 2 and points not in taken:
                taken.add(points)
                patterns[f"history cut to {points} points ({label})"] = _cut_to(points)
    return patterns


def with_gaps(
    split: Split, pattern: str, seed: int = 0, context_length: int | None = None
) -> Split:
    """The split with `pattern` of `gap_patterns` applied to every history (the scale of MASE
    unchanged)."""
    rng = np.random.default_rng(seed)
    damage = gap_patterns(split.group, context_length)[pattern]
    return replace(split, history=[damage(h, rng) for h in split.history])


GLITCHES: dict[str, Callable[[float], float]] = {"x10": lambda v: 10 * v, "zero": lambda v: 0 * v}


def with_glitches(split: Split, context_length: int, seed: int = 0) -> dict[str, Split]:
    """The split with one glitch of each kind of `GLITCHES` a series, at a random observed
    step of its last `context_length` (none in a history of fewer than three), by kind."""
    rng = np.random.default_rng(seed)
    glitched = {}
    for kind, glitch in GLITCHES.items():
        history = []
        for h in split.history:
            h = h.copy()
            start = max(0, len(h) - context_length)
            observed = np.flatnonzero(~np.isnan(h[start:])) + start
            if len(observed) > 2:
                step = rng.choice(observed)
                h[step] = glitch(h[step])
            history.append(h)
        glitched[kind] = replace(split, history=history)
    return glitched


def with_dirty_histories(split: Split, rate: float, seed: int = 0) -> Split:
    """The split with each observed reading of every history, with probability `rate`, made
    a glitch of one kind of `GLITCHES` (drawn evenly); the scale of MASE unchanged."""
    rng = np.random.default_rng(seed)
    kinds = list(GLITCHES.values())
    history = []
    for h in split.history:
        h = h.copy()
        for step in np.flatnonzero(~np.isnan(h) & (rng.random(len(h)) < rate)):
            h[step] = kinds[rng.integers(len(kinds))](h[step])
        history.append(h)
    return replace(split, history=history)


def glitch_rules(rule: TrainConfig) -> list[tuple[str, TrainConfig]]:
    """The model's glitch rule, its window's test alone (where it has the cycle's too), and
    no rule: the forecast-time settings `--glitches` scores, by label."""
    rules = [("glitch rule", rule)]
    if rule.glitch_threshold is not None and rule.seasonal_glitch_factor is not None:
        window_alone = replace(rule, seasonal_glitch_factor=None, zero_glitch_ratio=None)
        rules.append(("window's glitch test alone", window_alone))
    return [*rules, ("no glitch rule", replace(rule, glitch_threshold=None))]


def long_frame(split: Split) -> pd.DataFrame:
    """The histories on the group's synthetic index, each cut to its most recent `max_history`
    points (only Yearly's longest series are longer)."""
    group = split.group
    history = [h[-max_history(group) :] for h in split.history]
    lengths = [len(h) for h in history]
    index = pd.date_range(group.origin, periods=max(lengths), freq=group.freq).values
    return pd.DataFrame(
        {
            "unique_id": np.repeat(split.ids, lengths),
            "ds": np.concatenate([index[:n] for n in lengths]),
            "y": np.concatenate(history),
        }
    )


def forecasts_from_frame(split: Split, frame: pd.DataFrame, column: str) -> np.ndarray:
    """(S, H) from a long forecast frame, series in the split's order."""
    frame = frame.assign(unique_id=frame["unique_id"].astype(str)).sort_values(["unique_id", "ds"])
    by_id = {sid: g[column].to_numpy() for sid, g in frame.groupby("unique_id", sort=False)}
    return np.stack([by_id[sid][: split.group.horizon] for sid in split.ids])


def errors(split: Split, forecast: np.ndarray) -> tuple[float, float]:
    """sMAPE and MASE, each averaged over the series."""
    assert forecast.shape == split.truth.shape, (
        f"one forecast of {split.group.horizon} steps per series"
    )
    assert np.isfinite(forecast).all(), "every series forecast"
    s = float(np.mean([smape(y, f) for y, f in zip(split.truth, forecast, strict=True)]))
    m = float(np.mean(np.abs(split.truth - forecast).mean(axis=1) / split.scales))
    return s, m


def score(split: Split, forecast: np.ndarray, reference: tuple[float, float]) -> dict[str, float]:
    """sMAPE, MASE and OWA against `reference`, Naive2's (sMAPE, MASE)."""
    s, m = errors(split, forecast)
    return {"smape": s, "mase": m, "owa": 0.5 * (s / reference[0] + m / reference[1])}


# ------------------------------------------------------------------------------------------
# reference forecasts


def seasonal_naive(split: Split) -> np.ndarray:
    """The last season repeated; missing values and short series handled as the library does."""
    group = split.group
    frame = long_frame(split)
    predicted = (
        SeasonalNaive(season_length=group.season, horizon=group.horizon).fit(frame).predict(frame)
    )
    return forecasts_from_frame(split, predicted, "mean")


def naive(split: Split) -> np.ndarray:
    """The last observed value, repeated."""
    last = [pd.Series(h).ffill().iloc[-1] for h in split.history]
    return np.repeat(np.array(last)[:, None], split.group.horizon, axis=1)


def drift(split: Split) -> np.ndarray:
    """The last observed value with drift: the mean step from the first observed value to it
    (FPP3 5.2's drift method), the last value where only one is observed."""
    steps = np.arange(1, split.group.horizon + 1)
    out = []
    for h in split.history:
        seen = np.flatnonzero(~np.isnan(h))
        first, last = seen[0], seen[-1]
        slope = (h[last] - h[first]) / (last - first) if last > first else 0.0
        out.append(h[last] + slope * (len(h) - 1 - last + steps))
    return np.stack(out)


def naive2(split: Split) -> np.ndarray:
    """M4's Naive2: the last value of the seasonally adjusted series, reseasonalised.

    A series counts as seasonal when its autocorrelation at lag m passes the competition's
    90% test; its seasonal indices come from a classical multiplicative decomposition. With
    m = 1 (Yearly, Weekly, Daily) no series is seasonal, as in the competition: the last value.
    """
    m, horizon = split.group.season, split.group.horizon
    out = []
    for h in split.history:
        indices = _seasonal_indices(h, m) if m > 1 and _is_seasonal(h, m) else np.ones(m)
        phase = np.arange(len(h)) % m
        adjusted = h / indices[phase]
        future_phase = np.arange(len(h), len(h) + horizon) % m
        out.append(adjusted[-1] * indices[future_phase])
    return np.stack(out)


def _acf(x: np.ndarray, k: int) -> float:
    d = x - x.mean()
    return float(np.sum(d[k:] * d[:-k]) / np.sum(d**2))


def _is_seasonal(x: np.ndarray, m: int) -> bool:
    # As in the competition's code: acf(1) + sum of squared acf(2..m-1).
    s = _acf(x, 1) + sum(_acf(x, k) ** 2 for k in range(2, m))
    limit = 1.645 * np.sqrt((1 + 2 * s) / len(x))
    return abs(_acf(x, m)) > limit


def _seasonal_indices(x: np.ndarray, m: int) -> np.ndarray:
    """Multiplicative indices per phase: x over its centred 2 x m moving average, averaged
    (the centring needs an even m, as every M4 season above 1 is)."""
    kernel = np.r_[0.5, np.ones(m - 1), 0.5] / m
    trend = np.convolve(x, kernel, mode="valid")  # aligned with x[m/2 : -m/2]
    half = m // 2
    ratio = x[half : len(x) - half] / trend
    phase = np.arange(half, len(x) - half) % m
    indices = np.array([ratio[phase == p].mean() for p in range(m)])
    return indices / indices.mean()


# ------------------------------------------------------------------------------------------
# models


def run_ours(split: Split, seed: int, overrides: dict) -> tuple[Forecaster, np.ndarray, dict]:
    model_config = ModelConfig(
        **{**overrides.get("model", {}), "prediction_length": split.group.horizon}
    )
    train_config = TrainConfig(**{**overrides.get("train", {}), "seed": seed})
    forecaster = Forecaster(model_config, train_config)
    frame = long_frame(split)
    started = time.perf_counter()
    forecaster.fit(frame)
    seconds = time.perf_counter() - started
    predicted = forecaster.predict(long_frame(split))
    forecast = forecasts_from_frame(split, predicted, "mean")
    r = forecaster.train_result
    return (
        forecaster,
        forecast,
        {
            "train_seconds": round(seconds, 1),
            "epochs": len(r.epochs),
            "best_epoch": r.best_epoch,
            "tail_epochs": 0 if r.tail is None else len(r.tail.epochs),
            "initial_val_loss": r.initial_val_loss,
            "best_val_loss": r.best_val_loss,
            "linear_start_ridge": r.linear_start_ridge,
            "linear_start_prior": r.linear_start_prior,
            "interval_scale": r.interval_scale,
            "drift_weight": r.drift_weight,
            "impute_padding": r.impute_padding,
            "patch_length": forecaster.model_config.patch_length,
            "parameters": sum(p.numel() for p in forecaster.model.parameters()),
            "training_glitches": r.n_glitches,
            **calibration(
                split, predicted, forecaster.quantiles, forecaster.model_config.context_length
            ),
        },
    )


def calibration(
    split: Split, predicted: pd.DataFrame, levels: tuple[float, ...], context_length: int
) -> dict:
    """How often the truth falls below each quantile forecast (ideally the level itself), and
    inside the band between the outer quantiles (ideally their difference), overall and by
    the band of history the model saw (`forecaster.model.history_band`)."""
    bands = {q: forecasts_from_frame(split, predicted, quantile_column(q)) for q in levels}
    out: dict = {"share_below": {str(q): float(np.mean(split.truth < b)) for q, b in bands.items()}}
    if len(levels) >= 2:
        low, high = bands[levels[0]], bands[levels[-1]]
        out["band_coverage"] = {f"{levels[0]}-{levels[-1]}": coverage(split.truth, low, high)}
        history = np.array([len(h) for h in split.history])
        out["band_coverage_by_history"] = coverage_by_history(
            split.truth, low, high, history, context_length
        )
    return out


def refit_ours(forecaster: Forecaster, split: Split) -> Forecaster:
    """What `pipelines` serves after a promotion: a fresh model of the same configuration
    trained on every window of the split's histories along the path validation kept, with its
    interval factors."""
    return Forecaster(forecaster.model_config, forecaster.refit_config()).fit(long_frame(split))


def predict_ours(forecaster: Forecaster, split: Split) -> np.ndarray:
    return forecasts_from_frame(split, forecaster.predict(long_frame(split)), "mean")


PEERS = ("NHITS", "PatchTST", "MSTL")
# statsforecast's models, each fitted per series; AutoETS and AutoTheta only when asked
# (`--peers`), the classical peers of the Yearly, Quarterly and Monthly groups.
STATISTICAL_PEERS = ("MSTL", "AutoETS", "AutoTheta")


def run_peers(
    split: Split, seed: int, names: tuple[str, ...] = PEERS
) -> Iterator[tuple[str, np.ndarray, float]]:
    """The peers of `names` among NeuralForecast's NHITS and PatchTST and statsforecast's MSTL
    (when the group has seasons for it), AutoETS and AutoTheta, each as it finishes:
    (name, forecast, seconds); nothing when not installed."""
    group = split.group
    frame = long_frame(split)
    try:
        from neuralforecast import NeuralForecast
    except ImportError:
        print("peers: neuralforecast not installed (pip install -e '.[peers]')", file=sys.stderr)
    else:
        input_size = 7 * group.horizon
        # NeuralForecast refuses a series shorter than input_size unless it pads its start.
        pad = int(frame.groupby("unique_id").size().min()) < input_size
        for name in ("NHITS", "PatchTST"):
            if name not in names:
                continue
            peer = neuralforecast_model(
                name, group.horizon, input_size, seed, start_padding_enabled=pad
            )
            started = time.perf_counter()
            forecaster = NeuralForecast(models=[peer], freq=group.freq)
            forecaster.fit(frame)
            predicted = forecaster.predict().reset_index()
            seconds = time.perf_counter() - started
            yield (
                f"NeuralForecast {name} (defaults{', start padding' if pad else ''})",
                forecasts_from_frame(split, predicted, name),
                seconds,
            )
    statistical = [
        n for n in names if n in STATISTICAL_PEERS and (n != "MSTL" or group.mstl_seasons)
    ]
    if not statistical:
        return
    try:
        from statsforecast import StatsForecast
        from statsforecast.models import MSTL, AutoETS, AutoTheta, Naive
    except ImportError:
        print("peers: statsforecast not installed (pip install -e '.[peers]')", file=sys.stderr)
        return
    seasons = ", ".join(map(str, group.mstl_seasons))
    models = {
        "MSTL": (lambda: MSTL(season_length=list(group.mstl_seasons)), f"MSTL ({seasons})"),
        # The competitions' classical peers, each fitted per series with the group's season.
        "AutoETS": (lambda: AutoETS(season_length=group.season), f"AutoETS (m={group.season})"),
        "AutoTheta": (
            lambda: AutoTheta(season_length=group.season),
            f"AutoTheta (m={group.season})",
        ),
    }
    for name in statistical:
        make, label = models[name]
        started = time.perf_counter()
        # A series too short for the model (AutoETS refuses fewer points than its
        # parameters) gets the last value instead, as statsforecast's fallback.
        sf = StatsForecast(models=[make()], freq=group.freq, n_jobs=-1, fallback_model=Naive())
        predicted = sf.forecast(df=frame, h=group.horizon).reset_index()
        seconds = time.perf_counter() - started
        yield f"statsforecast {label}", forecasts_from_frame(split, predicted, name), seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True, help="M4 <Group>-train.csv")
    parser.add_argument("--test", type=Path, help="score on this file instead of a holdout")
    parser.add_argument(
        "--group",
        type=str.capitalize,
        choices=list(GROUPS),
        help="the M4 group (any case); default: the --data file's name before its first '-'",
    )
    parser.add_argument(
        "--horizon",
        type=int,
        help="forecast this many steps instead of the group's (another competition's horizon); "
        "OWA is then against Naive2 on the same split",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one run per seed")
    parser.add_argument(
        "--no-peers", action="store_true", help="skip the NeuralForecast and statsforecast peers"
    )
    parser.add_argument(
        "--peers",
        nargs="+",
        choices=[*PEERS, *STATISTICAL_PEERS[1:]],
        default=list(PEERS),
        help="which peers to run (default: %(default)s)",
    )
    parser.add_argument("--no-ours", action="store_true", help="run the baselines and peers only")
    parser.add_argument(
        "--short-and-gappy",
        action="store_true",
        help="cut a third of the histories short and make 5%% of the points missing",
    )
    parser.add_argument(
        "--gap-patterns",
        action="store_true",
        help="also score each fitted model on histories with outages at forecast time",
    )
    parser.add_argument(
        "--attention",
        action="store_true",
        help="also score each fitted model with each kind of attention made uniform",
    )
    parser.add_argument(
        "--glitches",
        action="store_true",
        help="also score each fitted model on histories with one glitch a series, with and "
        "without the glitch rule",
    )
    parser.add_argument(
        "--dirty-training",
        type=float,
        metavar="RATE",
        help="make each reading of every history a glitch (x10 or zero) with probability "
        "RATE before anything fits: what glitches all along the training data cost",
    )
    parser.add_argument(
        "--refit",
        action="store_true",
        help="also score each fitted model refit on every window along its kept path",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    add_set_option(parser)
    args = parser.parse_args(argv)
    for name, path in (("--data", args.data), ("--test", args.test)):
        if path is not None and not path.is_file():
            print(f"error: {name} {path}: no such file", file=sys.stderr)
            return 2
    group = group_of(args.group, args.data)
    if group is None:
        print(
            f"error: --data {args.data}: no M4 group in the file name (e.g. Daily-train.csv); "
            f"pass --group, one of {', '.join(GROUPS)}",
            file=sys.stderr,
        )
        return 2
    if args.horizon is not None:
        if args.horizon < 1:
            print(f"error: --horizon {args.horizon}: expected 1 or more", file=sys.stderr)
            return 2
        # M4's published Naive2 figures and anchors are for its own horizon.
        group = replace(group, horizon=args.horizon, naive2=None, anchors=())
    if args.dirty_training is not None and not 0 < args.dirty_training < 1:
        print(
            f"error: --dirty-training {args.dirty_training}: expected a rate between 0 and 1",
            file=sys.stderr,
        )
        return 2
    overrides = overrides_of(args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    split = make_split(args.data, args.test, group)
    horizon = group.horizon
    # Naive2 on the undamaged split: its own row, and OWA's reference where none is published.
    naive2_forecast = naive2(split)
    reference = group.naive2 or errors(split, naive2_forecast)
    mode = "test file" if args.test else f"holdout (last {horizon} points of each series)"
    # As fit will resolve it for this group's data: the context the damaged histories are cut to.
    model_config = ModelConfig(**{**overrides["model"], "prediction_length": horizon})
    model_config = model_config.for_frequency(group.freq)
    if args.short_and_gappy:
        split = short_and_gappy(split, model_config.context_length)
        mode += ", a third of the histories cut short, 5% of points missing"
    if args.dirty_training is not None:
        split = with_dirty_histories(split, args.dirty_training)
        mode += f", {args.dirty_training:g} of the readings glitches (x10 or zero)"
    rows: list[dict] = []

    def add(
        name: str, forecast: np.ndarray, seconds: float | None, scored: Split = split, **extra
    ) -> None:
        rows.append(
            {"model": name, **score(scored, forecast, reference), "seconds": seconds, **extra}
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)

    if args.short_and_gappy:
        add("naive (same split)", naive(split), None)
    else:  # Naive2's decomposition needs complete histories of two seasons or more
        add("Naive2 (same split)", naive2_forecast, None)
    add("seasonal naive (same split)", seasonal_naive(split), None)
    add("drift (same split)", drift(split), None)
    patterns = gap_patterns(group, model_config.context_length) if args.gap_patterns else {}
    damaged = {p: with_gaps(split, p, context_length=model_config.context_length) for p in patterns}
    glitched = with_glitches(split, model_config.context_length) if args.glitches else {}
    for seed in [] if args.no_ours else args.seeds:
        forecaster, forecast, info = run_ours(split, seed, overrides)
        if args.attention:
            info["attention"] = attention_summary(forecaster.attention(long_frame(split)))
        add(f"ours (seed {seed})", forecast, info["train_seconds"], seed=seed, **info)
        if args.refit:
            started = time.perf_counter()
            refit = refit_ours(forecaster, split)
            seconds = round(time.perf_counter() - started, 1)
            add(f"ours (seed {seed}), refit on every window", predict_ours(refit, split), seconds)
        for part in PARTS if args.attention else ():
            with uniform_attention(forecaster.model, part):
                add(
                    f"ours (seed {seed}), uniform {LABELS[part]}",
                    predict_ours(forecaster, split),
                    None,
                )
        rule = forecaster.train_config
        for label, read in glitch_rules(rule) if glitched else ():
            forecaster.train_config = read
            if read != rule:
                add(f"ours (seed {seed}), {label}", predict_ours(forecaster, split), None)
            for kind, damaged_split in glitched.items():
                add(
                    f"ours (seed {seed}), one {kind} glitch a series, {label}",
                    predict_ours(forecaster, damaged_split),
                    None,
                    damaged_split,
                )
        forecaster.train_config = rule
        for pattern, gappy in damaged.items():
            predicted = forecaster.predict(long_frame(gappy))
            add(
                f"ours (seed {seed}), {pattern}",
                forecasts_from_frame(gappy, predicted, "mean"),
                None,
                gappy,
                **calibration(
                    gappy, predicted, forecaster.quantiles, forecaster.model_config.context_length
                ),
            )
    for pattern, gappy in damaged.items():
        add(f"seasonal naive, {pattern}", seasonal_naive(gappy), None, gappy)
    if not (args.no_peers or args.short_and_gappy):
        if "MSTL" in args.peers and not group.mstl_seasons:
            print(f"peers: MSTL skipped, M4 {group.name} has no seasons for it", file=sys.stderr)
        for name, forecast, seconds in run_peers(split, args.seeds[0], tuple(args.peers)):
            add(name, forecast, round(seconds, 1))

    print(
        f"{args.data.name} (M4 {group.name} protocol), {len(split.ids)} series, horizon {horizon}, "
        f"scored on the {mode}"
    )
    print("| model | sMAPE | MASE | OWA | fit + predict s |")
    print("|---|---|---|---|---|")
    for r in rows:
        seconds = "-" if r["seconds"] is None else f"{r['seconds']:.0f}"
        print(f"| {r['model']} | {r['smape']:.3f} | {r['mase']:.3f} | {r['owa']:.3f} | {seconds} |")
    for name, s, m, owa in group.anchors:
        print(
            f"| {name}, test set | {s:.3f} | {m:.3f} | {'-' if owa is None else f'{owa:.3f}'} | - |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        machine = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
        args.json.write_text(
            json.dumps(
                {
                    "data": args.data.name,
                    "group": group.name,
                    "horizon": horizon,
                    "mode": mode,
                    "machine": machine,
                    "overrides": overrides,
                    # Naive2's (sMAPE, MASE) every OWA divides by, and where they come from.
                    "owa_reference": {
                        "smape": reference[0],
                        "mase": reference[1],
                        "source": "published" if group.naive2 else "Naive2 on the same split",
                    },
                    "results": rows,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
