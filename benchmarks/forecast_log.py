"""Scoring the forecast log at a production size: what every retrain's monitoring step reads.

    python -m benchmarks.forecast_log --series 10000 --days 30

A log of `--series` series forecast `--horizon` steps ahead once a day for `--days` days (a
new version every `--version-days` days), as the service writes it (one Parquet file a
flush, one flush a day), and the hourly actuals of those days. Prints the seconds of
`read_log` and of `monitor.score`, and the process's peak resident memory after each (the
high-water mark of the whole run, in a process of its own). Without `--log-dir` the log is
written to a temporary directory (about 10 MB a million rows).
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from forecaster.validation import ID, TARGET, TIME
from pipelines.forecast_log import SCHEMA, ForecastLog, read_log
from pipelines.monitor import score

START = np.datetime64("2026-01-01T00", "h")


def _codes(index: np.ndarray, values: list[str]) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(index.astype(np.int32)), pa.array(values))


def write_log(directory: Path, n_series: int, horizon: int, days: int, version_days: int) -> int:
    """One day's forecasts of every series per file; returns the rows written."""
    rng = np.random.default_rng(0)
    ids = [f"series_{i:07d}" for i in range(n_series)]
    log = ForecastLog(directory, retention_days=None, flush_rows=2**62)
    n = n_series * horizon
    step = np.tile(np.arange(1, horizon + 1, dtype=np.int32), n_series)
    for day in range(days):
        origin = START + np.timedelta64(24 * day, "h")
        mean = rng.normal(size=n)
        table = pa.table(
            {
                "model_name": _codes(np.zeros(n), ["forecaster"]),
                "model_version": _codes(np.zeros(n), [str(1 + day // version_days)]),
                "unique_id": _codes(np.repeat(np.arange(n_series), horizon), ids),
                "origin": pa.array(np.full(n, origin, "datetime64[ns]")),
                "step": pa.array(step),
                "ds": pa.array((origin + step.astype("timedelta64[h]")).astype("datetime64[ns]")),
                "mean": pa.array(mean),
                "lower": pa.array(mean - 1.3),
                "upper": pa.array(mean + 1.3),
                "level": pa.array(np.full(n, 0.8)),
                "logged_at": pa.array(
                    np.full(n, (origin + np.timedelta64(1, "h")).astype("datetime64[ms]")),
                    pa.timestamp("ms", tz="UTC"),
                ),
            },
            schema=SCHEMA,
        )
        log.append(table)
        log.flush()
    return n * days


def actuals(n_series: int, days: int) -> pd.DataFrame:
    """Hourly values of every series from a week before the first forecast to the last."""
    ds = np.arange(START - np.timedelta64(24 * 7, "h"), START + np.timedelta64(24 * days, "h"))
    values = np.random.default_rng(1).normal(size=n_series * len(ds))
    return pd.DataFrame(
        {
            ID: np.repeat([f"series_{i:07d}" for i in range(n_series)], len(ds)),
            TIME: np.tile(ds.astype("datetime64[ns]"), n_series),
            TARGET: values,
        }
    )


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux


def run(args: argparse.Namespace, directory: Path) -> dict[str, float]:
    rows = None
    if not any(directory.glob("part-*.parquet")):
        rows = write_log(directory, args.series, args.horizon, args.days, args.version_days)
    started = time.perf_counter()
    log = read_log(directory, model_name="forecaster")
    read_s, read_peak = time.perf_counter() - started, peak_gb()
    observed = actuals(args.series, args.days)
    started = time.perf_counter()
    realised = score(log, observed, season=24)
    score_s = time.perf_counter() - started
    return {
        "log_rows": len(log) if rows is None else rows,
        "actual_rows": len(observed),
        "versions": len(realised.versions),
        "scored_rows": len(realised.scored),
        "read_log_s": round(read_s, 1),
        "peak_gb_after_read": round(read_peak, 2),
        "score_s": round(score_s, 1),
        "peak_gb_after_score": round(peak_gb(), 2),
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=10_000)
    parser.add_argument("--horizon", type=int, default=48)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--version-days", type=int, default=7, help="days between versions")
    parser.add_argument("--log-dir", type=Path, help="reuse (or keep) the log written here")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.log_dir is not None:
        figures = run(args, args.log_dir)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            figures = run(args, Path(tmp))
    for name, value in figures.items():
        print(f"{name:>22}  {value:,}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        given = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"args": given, **figures}, indent=1) + "\n")
    return figures


if __name__ == "__main__":
    main()
