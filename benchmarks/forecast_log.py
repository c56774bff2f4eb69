"""Scoring the forecast log at a production size: what every retrain's monitoring step reads.

    python -m benchmarks.forecast_log --series 10000 --days 30

A log of `--series` series forecast `--horizon` steps ahead once a day for `--days` days (a
new version every `--version-days` days), as the service writes it (one Parquet file a
flush, one flush a day), and the hourly actuals of those days. Prints the seconds the
monitoring step takes to read and score the log (in parts of `--part-rows` rows, as a retrain
does), the resident memory before it (the actuals, as a retrain holds its data) and the
step's peak (Linux's high-water mark, reset once the actuals are built). Without
`--log-dir` the log is written to a temporary directory (about 10 MB a million rows).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from forecaster.validation import ID, TARGET, TIME
from pipelines.forecast_log import SCHEMA, ForecastLog, read_log_parts
from pipelines.monitor import PART_ROWS, score_parts

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
    """The process's peak resident memory since it started, or since `reset_peak`."""
    try:
        status = Path("/proc/self/status").read_text()
        return int(status.split("VmHWM:")[1].split()[0]) / 1e6  # kB
    except (OSError, IndexError):  # not Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def reset_peak() -> None:
    """Start `peak_gb` again from the memory held now (Linux; elsewhere a no-op), so that a
    step's peak is not the transient peak of what ran before it."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def run(args: argparse.Namespace, directory: Path) -> dict[str, float]:
    rows = None
    if not any(directory.glob("part-*.parquet")):
        rows = write_log(directory, args.series, args.horizon, args.days, args.version_days)
    observed = actuals(args.series, args.days)
    reset_peak()
    base = peak_gb()  # the actuals, held as a retrain holds its data
    started = time.perf_counter()
    # What a retrain's monitoring step runs: the log read and scored part by part.
    parts = read_log_parts(
        directory,
        model_name="forecaster",
        max_rows=args.part_rows or None,
        spill_dir=args.spill_dir,
    )
    realised = score_parts(parts, observed, season=24)
    seconds = time.perf_counter() - started
    return {
        "log_rows": realised.log_rows if rows is None else rows,
        "actual_rows": len(observed),
        "versions": len(realised.versions),
        "scored_rows": realised.scored_rows,
        "read_and_score_s": round(seconds, 1),
        "gb_before": round(base, 2),
        "peak_gb": round(peak_gb(), 2),
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=10_000)
    parser.add_argument("--horizon", type=int, default=48)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--version-days", type=int, default=7, help="days between versions")
    parser.add_argument(
        "--part-rows",
        type=int,
        default=PART_ROWS,
        help="rows scored at a time, as monitoring does (default %(default)s; 0: the whole log)",
    )
    parser.add_argument("--spill-dir", type=Path, help="where the parts are sorted to (tmp)")
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
