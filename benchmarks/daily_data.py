"""Daily data in M4's file layout, for `benchmarks.m4 --group Daily`: no daily set ships with
the project, so three stand-ins are written, two summed from the shared hourly files and one
synthetic, shaped like M4 Daily.

    python -m benchmarks.daily_data --out /tmp/daily [--shared ../shared/data]
    python -m benchmarks.m4 --data /tmp/daily/ETTh1daily-train.csv --group Daily

- `ETTh1daily-train.csv`: ETTh1's 7 variables as means of its complete days (725 days).
- `M4HourlyAsDaily-train.csv`: M4 Hourly's 414 series as daily means (29-40 days each; the
  hours before each series' first whole day are dropped), short histories of a new catalogue.
- `SynthDaily-train.csv`: 1,000 seeded series of 107 to 3,000 days, most of them longer than
  the context, as in M4 Daily, where random walks dominate: half are random walks in logs
  (0.5-3 % a day, a small drift), a quarter random walks with a weekly cycle, a quarter smooth
  trends whose slope wanders (little noise, so MASE's in-sample scale is small there and
  following the trend counts).
- `SynthRandomWalk-train.csv`: 400 random walks of the same kind alone, where the naive
  forecast is the best there is (as on most of M4 Daily): a global model must not lose to it.

The first two need `../shared/data` (ETTh1 under CC BY-ND 4.0, credit: Zhou et al., Informer,
AAAI 2021; M4, Makridakis et al., IJF 2020): write them outside the repository and commit no
copy. Each file's last 14 points (M4 Daily's horizon) are what `benchmarks.m4` holds out. No
default was chosen on any of them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.competition_data import wide_frame
from benchmarks.m4 import read_wide


def etth1_daily(path: Path) -> pd.DataFrame:
    """ETTh1's variables as the means of the days it covers in full."""
    hourly = pd.read_csv(path, parse_dates=["date"]).set_index("date")
    complete = hourly.resample("D").size() == 24
    daily = hourly.resample("D").mean()[complete]
    return wide_frame(list(daily.columns), [daily[c].to_numpy() for c in daily.columns])


def m4_hourly_as_daily(path: Path) -> pd.DataFrame:
    """Each M4 Hourly series as daily means of its whole days (the first, partial day dropped,
    as M4 gives no timestamps: a day is 24 steps counted back from the series' end)."""
    days = []
    hourly = read_wide(path)
    for hours in hourly.values():
        hours = hours[len(hours) % 24 :]
        days.append(hours.reshape(-1, 24).mean(axis=1))  # (n_days * 24,) -> (n_days,)
    return wide_frame(list(hourly), days)


KINDS = ("random walk", "weekly", "trend")


def synthetic_daily(
    n_series: int = 1000, seed: int = 123, shares: tuple[float, ...] = (0.5, 0.25, 0.25)
) -> pd.DataFrame:
    """Seeded M4-Daily-like catalogue (see the module's docstring); `shares` of KINDS."""
    rng = np.random.default_rng(seed)
    ids, histories = [], []
    for i in range(n_series):
        n = int(np.exp(rng.uniform(np.log(107), np.log(3000))))
        kind = rng.choice(KINDS, p=list(shares))
        if kind == "random walk":
            sigma, drift = rng.uniform(0.005, 0.03), rng.normal(0, 0.0005)
            log_y = np.cumsum(rng.normal(drift, sigma, n))
        elif kind == "weekly":
            level = np.cumsum(rng.normal(0, rng.uniform(0.01, 0.05), n))
            cycle = rng.normal(0, rng.uniform(0.05, 0.3), 7)
            log_y = level + cycle[np.arange(n) % 7] + rng.normal(0, 0.03, n)
        else:
            slope = np.cumsum(rng.normal(0, 0.0003, n)) + rng.normal(0, 0.002)
            log_y = np.cumsum(slope) + rng.normal(0, 0.005, n)
        ids.append(f"D{i + 1}")
        histories.append(np.exp(log_y) * rng.uniform(50, 5000))
    return wide_frame(ids, histories)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="directory for the files")
    parser.add_argument(
        "--shared",
        type=Path,
        default=Path("../shared/data"),
        help="folder holding ETTh1.csv and m4/Hourly-train.csv (default: ../shared/data)",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    frames = {
        "SynthDaily-train.csv": synthetic_daily,
        # Random walks alone: what naive forecasts best, as on most of M4 Daily.
        "SynthRandomWalk-train.csv": lambda: synthetic_daily(400, seed=7, shares=(1, 0, 0)),
    }
    sources = {
        "ETTh1daily-train.csv": (etth1_daily, args.shared / "ETTh1.csv"),
        "M4HourlyAsDaily-train.csv": (m4_hourly_as_daily, args.shared / "m4" / "Hourly-train.csv"),
    }
    for name, (build, source) in sources.items():
        if source.exists():
            frames[name] = lambda build=build, source=source: build(source)
        else:
            print(f"skipped {name}: {source} not found", file=sys.stderr)
    for name, build in frames.items():
        frame = build()
        frame.to_csv(args.out / name, index=False)
        lengths = frame.iloc[:, 1:].notna().sum(axis=1)
        print(
            f"{args.out / name}: {len(frame)} series, {lengths.min()}-{lengths.max()} days: "
            f"--group Daily"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
