"""Catalogues of short series, shaped like M4's Yearly group and like a weekly product
catalogue: how the defaults do when most histories are shorter than the context.

    python -m benchmarks.short_catalogue --json OUT [--kind weekly|sensors] [--set model.context_length=128]

The data is synthetic and seeded (no yearly or weekly data set ships with the project):
- annual (default): 600 series with lengths log-normal around 29 points (13 to 300, as in M4
  Yearly), each a random walk in logs whose drift itself wanders (a damped local trend) with
  noise of 2-12 % a year; horizon 6 (M4 Yearly's).
- weekly: 360 series, a third of them shorter than a 336-week context plus the horizon (20
  to 348 weeks, the others 349 to 900), a local level in logs with a small trend, a yearly
  cycle of 52.18 weeks (not a whole number of steps, as in real weekly data) of up to 30 % and
  noise of 3-15 %; horizon 13 (M4 Weekly's).
- sensors: 200 hourly series of 30 points each (`forecaster.synthetic`: daily and weekly
  harmonics on a level, AR(1) noise), sensors installed a day ago; horizon 12, so every
  history has 18 points, fewer than a day.

Each series' last horizon is held out and scored by sMAPE and MASE (scaled by the in-sample
naive MAE, seasonality 1, as M4 scores every group but Hourly), beside naive (the last value),
drift (the last value plus the average step of the history) and the history's mean. It checks
that short histories are read well; no default was chosen on it.

Peers run in the same command when statsforecast is installed (`pip install -e ".[peers]"`,
best in its own virtual environment: statsforecast needs pandas < 3), each fitted per series:
AutoETS, AutoARIMA and AutoTheta on the annual catalogue; AutoETS and AutoTheta with a season
of 52 on the weekly one (AutoARIMA with that season takes hours), without a season on the
sensors (18 points hold no whole day).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.overrides import add_set_option, overrides_of
from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster.data import quantile_column
from forecaster.metrics import coverage, coverage_by_history, mase_scale, smape
from forecaster.synthetic import generate_synthetic

HORIZON = 6
N_SERIES = 600


def make_catalogue(seed: int = 0) -> tuple[list[np.ndarray], pd.DataFrame]:
    """The annual series (histories and held-out points together) and the histories as a long
    frame."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.exp(rng.normal(np.log(29), 0.6, N_SERIES)).astype(int), 13, 300)
    series, frames = [], []
    for i, n in enumerate(lengths + HORIZON):
        drift, persistence, noise = (
            rng.normal(0.03, 0.04),
            rng.uniform(0.6, 1.0),
            rng.uniform(0.02, 0.12),
        )
        growth = np.empty(n)
        growth[0] = drift
        for t in range(1, n):  # the yearly growth rate reverts towards the series' drift
            growth[t] = (
                persistence * growth[t - 1] + (1 - persistence) * drift + rng.normal(0, noise / 3)
            )
        y = np.exp(np.log(rng.uniform(1e3, 1e4)) + np.cumsum(growth + rng.normal(0, noise, n)))
        series.append(y)
        ds = pd.date_range(end="2020-01-01", periods=n - HORIZON, freq="YS")
        frames.append(pd.DataFrame({"unique_id": f"Y{i}", "ds": ds, "y": y[:-HORIZON]}))
    return series, pd.concat(frames, ignore_index=True)


WEEKLY_HORIZON = 13
WEEKLY_SERIES = 360


def make_weekly_catalogue(seed: int = 0) -> tuple[list[np.ndarray], pd.DataFrame]:
    """The weekly series and their histories, as `make_catalogue` gives the annual ones."""
    rng = np.random.default_rng(seed)
    h = WEEKLY_HORIZON
    series, frames = [], []
    for i in range(WEEKLY_SERIES):
        short = rng.integers(20, 349)  # shorter than a context of 336 + the horizon
        n = int(rng.choice([short, rng.integers(349, 900)], p=[1 / 3, 2 / 3])) + h
        t = np.arange(n)
        season = rng.uniform(0, 0.3) * np.sin(2 * np.pi * t / 52.18 + rng.uniform(0, 2 * np.pi))
        level = np.cumsum(rng.normal(0, rng.uniform(0.005, 0.03), n))
        trend = rng.normal(0.002, 0.002) * t
        noise = rng.normal(0, rng.uniform(0.03, 0.15), n)
        y = np.exp(np.log(rng.uniform(50, 5000)) + level + trend + season + noise)
        series.append(y)
        ds = pd.date_range(end="2024-12-29", periods=n - h, freq="W-SUN")
        frames.append(pd.DataFrame({"unique_id": f"W{i}", "ds": ds, "y": y[:-h]}))
    return series, pd.concat(frames, ignore_index=True)


SENSORS_HORIZON = 12
SENSORS = 200


def make_sensor_catalogue(seed: int = 0) -> tuple[list[np.ndarray], pd.DataFrame]:
    """The hourly sensors and their histories, as `make_catalogue` gives the annual ones."""
    frame = generate_synthetic(n_series=SENSORS, n_steps=30, seed=seed)
    series = [group["y"].to_numpy() for _, group in frame.groupby("unique_id", sort=False)]
    history = frame.groupby("unique_id", sort=False).head(30 - SENSORS_HORIZON)
    return series, history.reset_index(drop=True)


@dataclass(frozen=True)
class Catalogue:
    make: Callable[[int], tuple[list[np.ndarray], pd.DataFrame]]
    horizon: int
    freq: str
    peer_season: int  # statsforecast's season_length
    peers: tuple[str, ...]


CATALOGUES = {
    "annual": Catalogue(make_catalogue, HORIZON, "YS", 1, ("AutoETS", "AutoARIMA", "AutoTheta")),
    "weekly": Catalogue(
        make_weekly_catalogue, WEEKLY_HORIZON, "W-SUN", 52, ("AutoETS", "AutoTheta")
    ),
    "sensors": Catalogue(make_sensor_catalogue, SENSORS_HORIZON, "h", 1, ("AutoETS", "AutoTheta")),
}


def score(series: list[np.ndarray], forecast: np.ndarray) -> dict[str, float]:
    """Mean sMAPE and MASE of (S, H) forecasts of each series' last H points."""
    h = forecast.shape[1]
    actual = np.stack([y[-h:] for y in series])
    scales = np.array([mase_scale(y[:-h], 1) for y in series])
    return {
        "smape": smape(actual, forecast),
        "mase": float(np.mean(np.abs(forecast - actual).mean(axis=1) / scales)),
    }


def run_peers(
    history: pd.DataFrame, catalogue: Catalogue
) -> Iterator[tuple[str, pd.DataFrame, float]]:
    """The catalogue's statsforecast peers, each as it finishes: (name, forecast frame with the
    model's column, seconds); nothing when statsforecast is not installed."""
    try:
        import statsforecast.models
        from statsforecast import StatsForecast
    except ImportError:
        print("peers: statsforecast not installed (pip install -e '.[peers]')", file=sys.stderr)
        return
    for name in catalogue.peers:
        model = getattr(statsforecast.models, name)(season_length=catalogue.peer_season)
        started = time.perf_counter()
        predicted = StatsForecast(models=[model], freq=catalogue.freq, n_jobs=1).forecast(
            df=history, h=catalogue.horizon
        )
        seconds = time.perf_counter() - started
        yield model.alias, predicted, seconds


def _by_series(forecast: pd.DataFrame, column: str, order: np.ndarray) -> np.ndarray:
    """(S, H) forecasts in the catalogue's series order from a long forecast frame."""
    return forecast.pivot(index="unique_id", columns="ds", values=column).loc[order].to_numpy()


def _band_coverage(
    series: list[np.ndarray],
    forecast: pd.DataFrame,
    order: np.ndarray,
    levels: tuple[float, ...],
    context_length: int,
) -> dict:
    """Share of the held-out points inside the band between the outer quantiles, overall and
    by the band of history the model saw, and the band's mean width in units of each history's
    standard deviation (a band can cover by being uselessly wide)."""
    if len(levels) < 2:
        return {}
    low, high = (_by_series(forecast, quantile_column(q), order) for q in (levels[0], levels[-1]))
    horizon = low.shape[1]
    actual = np.stack([y[-horizon:] for y in series])
    history = np.array([len(y) - horizon for y in series])
    spread = np.array([np.std(y[:-horizon]) for y in series])
    return {
        "band_coverage": coverage(actual, low, high),
        "band_width_over_std": float(np.mean((high - low).mean(axis=1) / spread)),
        "band_coverage_by_history": coverage_by_history(actual, low, high, history, context_length),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kind", choices=list(CATALOGUES), default="annual", help="catalogue")
    parser.add_argument("--seed", type=int, default=0, help="training seed")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--no-peers", action="store_true", help="skip the statsforecast peers")
    add_set_option(parser)
    args = parser.parse_args(argv)
    overrides = overrides_of(args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    catalogue = CATALOGUES[args.kind]
    h = catalogue.horizon
    series, history = catalogue.make(0)
    steps = np.arange(1, h + 1)
    last = np.array([y[-h - 1] for y in series])[:, None]
    slope = np.array([(y[-h - 1] - y[0]) / (len(y) - h - 1) for y in series])
    history_mean = np.array([y[:-h].mean() for y in series])[:, None]
    rows = [
        {"model": "naive", **score(series, np.repeat(last, h, axis=1))},
        {"model": "drift", **score(series, last + slope[:, None] * steps)},
        {"model": "mean", **score(series, np.repeat(history_mean, h, axis=1))},
    ]
    model_config = ModelConfig(**{**overrides["model"], "prediction_length": h})
    train_config = TrainConfig(**{**overrides["train"], "seed": args.seed})
    forecaster = Forecaster(model_config, train_config)
    started = time.perf_counter()
    forecaster.fit(history)
    forecast = forecaster.predict(history)
    seconds = time.perf_counter() - started
    order = history["unique_id"].unique()
    result = forecaster.train_result
    rows.append(
        {
            "model": f"ours (seed {args.seed})",
            **score(series, _by_series(forecast, "mean", order)),
            "seconds": round(seconds, 1),
            "epochs": len(result.epochs),
            "best_epoch": result.best_epoch,
            "tail_epochs": 0 if result.tail is None else len(result.tail.epochs),
            "initial_val_loss": result.initial_val_loss,
            "best_val_loss": result.best_val_loss,
            "linear_start_ridge": result.linear_start_ridge,
            "linear_start_prior": result.linear_start_prior,
            "interval_scale": result.interval_scale,
            "drift_weight": result.drift_weight,
            **_band_coverage(
                series,
                forecast,
                order,
                forecaster.quantiles,
                forecaster.model_config.context_length,
            ),
            "context_length": forecaster.model_config.context_length,
            "patch_length": forecaster.model_config.patch_length,
        }
    )
    for name, predicted, seconds in () if args.no_peers else run_peers(history, catalogue):
        forecast = _by_series(predicted, name, order)
        rows.append(
            {
                "model": f"statsforecast {name}",
                **score(series, forecast),
                "seconds": round(seconds, 1),
            }
        )
    print("| model | sMAPE | MASE | fit + predict s |\n|---|---|---|---|")
    for row in rows:
        seconds = f"{row['seconds']:.0f}" if "seconds" in row else "-"
        print(f"| {row['model']} | {row['smape']:.3f} | {row['mase']:.3f} | {seconds} |")
    if args.json:
        args.json.write_text(
            json.dumps({"kind": args.kind, "overrides": overrides, "results": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
