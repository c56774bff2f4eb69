"""How often does promotion move the champion? False-promotion rate and power, measured.

    python -m benchmarks.promotion --trials 10 --json benchmarks/results/promotion.json

Each trial trains a champion and a challenger on the same data and applies the promotion rule
of `pipelines.promote` (the same function `forecaster promote` calls, without the registry)
on the same backtest windows:

- null trials: the same configuration, another seed. Equally good models; every promotion is
  a false one. The defaults aim at no more than 1 in 10.
- power trials: a deliberately weakened champion, the same model with a context of one
  horizon (it cannot see the weekly season), against the challenger as usual; one clear
  improvement, which promotion should take.

Data: synthetic hourly series (`forecaster.synthetic`) unless `--data` names a long CSV.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd

from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster.backtest import backtest
from forecaster.baselines import SeasonalNaive
from forecaster.data import load_frame
from forecaster.synthetic import generate_synthetic
from pipelines.promote import decide
from pipelines.settings import PipelineSettings


def _scores(model, frame: pd.DataFrame, horizon: int, windows: int, metric: str) -> pd.Series:
    return backtest(model, frame, n_windows=windows, horizon=horizon).by_window(metric)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, help="long CSV/Parquet; default: synthetic")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--series", type=int, default=40, help="synthetic series")
    parser.add_argument("--horizon", type=int, default=24)
    parser.add_argument("--context", type=int, default=168)
    parser.add_argument("--max-epochs", type=int, default=10)
    parser.add_argument("--windows-per-epoch", type=int, default=8192)
    parser.add_argument("--kinds", nargs="+", choices=["null", "power"], default=["null", "power"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    defaults = PipelineSettings.model_fields
    metric = defaults["promotion_metric"].default
    margin = defaults["promotion_margin"].default
    alpha = defaults["promotion_alpha"].default
    test = defaults["promotion_test"].default
    windows = defaults["backtest_windows"].default

    if args.data is not None:
        frame = load_frame(args.data)
    else:
        frame = generate_synthetic(n_series=args.series, n_steps=24 * 60, freq="h", seed=0)
    # Hold the backtest windows out of training, as the pipeline's split does.
    cut = frame.groupby("unique_id")["ds"].transform(
        lambda ds: ds.iloc[-windows * args.horizon - 1]
    )
    train = frame[frame["ds"] <= cut]

    def fit(seed: int, context: int) -> Forecaster:
        model_config = ModelConfig(context_length=context, prediction_length=args.horizon)
        train_config = TrainConfig(
            max_epochs=args.max_epochs,
            seed=seed,
            progress=False,
            max_windows_per_epoch=args.windows_per_epoch,
        )
        return Forecaster(model_config, train_config).fit(train)

    naive = _scores(
        SeasonalNaive(horizon=args.horizon).fit(frame), frame, args.horizon, windows, metric
    )
    rows = []
    for kind in args.kinds:
        for trial in range(args.trials):
            started = time.perf_counter()
            champion = fit(2 * trial, args.context if kind == "null" else args.horizon)
            challenger = fit(2 * trial + 1, args.context)
            verdict = decide(
                _scores(challenger, frame, args.horizon, windows, metric),
                _scores(champion, frame, args.horizon, windows, metric),
                naive,
                metric=metric,
                margin=margin,
                alpha=alpha,
                test=test,
            )
            rows.append(
                {
                    "kind": kind,
                    "trial": trial,
                    "promoted": verdict.promoted,
                    "challenger": verdict.challenger_score,
                    "champion": verdict.champion_score,
                    "p_value": verdict.test.p_value,
                    "seconds": round(time.perf_counter() - started, 1),
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    rule = f"{metric}, margin {margin:.0%}, {test} one-sided alpha {alpha}, {windows} windows"
    null = [r["promoted"] for r in rows if r["kind"] == "null"]
    power = [r["promoted"] for r in rows if r["kind"] == "power"]
    print(f"promotion rule: {rule}; {frame['unique_id'].nunique()} series")
    print(f"false promotions (same config, other seed): {sum(null)} of {len(null)}")
    print(
        f"promotions of a clear improvement (context of one horizon -> full context): {sum(power)} of {len(power)}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rule": rule, "trials": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
