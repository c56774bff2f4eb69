"""Regrouping a long file into chunks of whole series, as batch jobs and `forecaster predict`
read it: rows/s and peak memory, no model.

    python -m benchmarks.series_chunks --series 20000 --steps 100

A grouped Parquet file of N synthetic series of `--steps` rows is streamed through
`whole_series_chunks` (chunks of `--chunk-series` series) by each caller's reader:

- ``batch_job``: the service's `iter_input` (Arrow record batches of 65,536 rows, each turned
  into pandas), what a batch job on a grouped input runs.
- ``predict``: `pipelines.predict.read_chunks` (pandas frames of 200,000 rows).

Time is the fastest of `--repeats` passes. Peak memory, from one more pass under tracemalloc,
is what numpy and pandas held at once, beside the largest chunk in pandas: it should stay
about one chunk plus one input batch, whatever the file size.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from forecaster.validation import ID, TARGET, TIME
from pipelines.predict import read_chunks
from pipelines.series_chunks import whole_series_chunks
from service.job_files import iter_input


def write_grouped(path: Path, n_series: int, steps: int) -> None:
    ids = np.repeat([f"series_{i:07d}" for i in range(n_series)], steps)
    ds = np.tile(pd.date_range("2024-01-01", periods=steps, freq="h").to_numpy(), n_series)
    y = np.random.default_rng(0).normal(size=n_series * steps)
    pd.DataFrame({ID: ids, TIME: ds, TARGET: y}).to_parquet(path, index=False)


def readers(path: Path) -> dict[str, Callable[[], Iterator[pd.DataFrame]]]:
    columns = [ID, TIME, TARGET]
    return {
        "batch_job": lambda: (b.to_pandas() for b in iter_input(path, "parquet", columns)),
        "predict": lambda: read_chunks(path, columns)[0],
    }


def timed_pass(batches: Iterator[pd.DataFrame], chunk_series: int) -> tuple[float, int]:
    """Seconds and rows."""
    started = time.perf_counter()
    rows = sum(len(chunk) for chunk in whole_series_chunks(batches, chunk_series))
    return time.perf_counter() - started, rows


def memory_pass(batches: Iterator[pd.DataFrame], chunk_series: int) -> tuple[int, int]:
    """Peak bytes numpy and pandas held at once, and the largest chunk's bytes (a pass of its
    own: tracing allocations slows it several times)."""
    tracemalloc.start()
    largest = 0
    for chunk in whole_series_chunks(batches, chunk_series):
        largest = max(largest, int(chunk.memory_usage(deep=True).sum()))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, largest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--chunk-series", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "grouped.parquet"
        write_grouped(path, args.series, args.steps)
        size_mb = path.stat().st_size / 1e6
        print(
            f"{args.series:,} series x {args.steps} rows ({size_mb:.0f} MB Parquet), "
            f"chunks of {args.chunk_series:,} series"
        )
        for name, read in readers(path).items():
            seconds, rows = min(timed_pass(read(), args.chunk_series) for _ in range(args.repeats))
            peak, largest = memory_pass(read(), args.chunk_series)
            print(
                f"{name:>9}: {seconds:.2f} s, {rows / seconds / 1e6:.2f} M rows/s, "
                f"peak {peak / 1e6:.0f} MB allocated, largest chunk {largest / 1e6:.0f} MB"
            )


if __name__ == "__main__":
    main()
