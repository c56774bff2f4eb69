"""Spark batch scoring beside the in-process batched predict: series/s, and where time goes.

    python -m benchmarks.spark_predict --series 25000 100000 --json benchmarks/results/spark.json

For each size N, N synthetic hourly series of ``--steps`` points (``forecaster.synthetic``)
are written to Parquet as pandas writes it, and scored by one model (the default
architecture with the whole series as context and a horizon of 24, trained for one short
epoch: the weights do not change the cost). Each figure is steady state, the model loaded
and Spark's Python workers warm (session start and the warm-up job are reported apart):

- ``local``: ``predict_file``, what ``forecaster predict`` runs: read Parquet, one batched
  ``predict`` per 2,048 series, write Parquet; torch with all cores.
- ``spark``: ``predict_spark``, what ``forecaster predict --engine spark`` runs on
  ``--master``: read, hash the series into buckets, Arrow to the Python workers, one batched
  ``predict`` per bucket, write Parquet parts.
- ``spark_no_model``: the same job with a pandas function that returns nothing: the cost of
  Spark's read, shuffle, Arrow and Python workers alone.
- ``spark_per_series`` (``--per-series N``): one group per series, i.e.
  ``groupBy("unique_id")``, on the first N series.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster.synthetic import generate_synthetic
from forecaster.validation import ID, TARGET, TIME
from pipelines.predict import predict_file
from pipelines.spark import forecast_spark, predict_spark, read_input, spark_session


def _nothing(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.iloc[:0][[ID]]


def _train(steps: int, horizon: int, root: Path) -> Path:
    config = ModelConfig(context_length=steps, prediction_length=horizon)
    train = TrainConfig(max_epochs=1, max_windows_per_epoch=512, progress=False, device="cpu")
    model = Forecaster(config, train)
    model.fit(generate_synthetic(n_series=8, n_steps=steps * 4, seed=1))
    model.save(root / "model")
    return root / "model"


def _timed(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--series", type=int, nargs="+", default=[100_000])
    parser.add_argument("--steps", type=int, default=96, help="points per series")
    parser.add_argument("--horizon", type=int, default=24)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--per-series", type=int, help="also group by series on this many")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per figure; the fastest, least disturbed counts"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from pyspark.sql import functions as F

    root = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    model_dir = _train(args.steps, args.horizon, root)
    model = Forecaster.load(model_dir, device="cpu")

    started = time.perf_counter()
    spark = spark_session(args.master)
    session_s = time.perf_counter() - started
    warm = root / "warm.parquet"
    generate_synthetic(n_series=64, n_steps=args.steps, seed=2).to_parquet(warm)
    warm_up_s = _timed(lambda: predict_spark(str(model_dir), str(warm), str(root / "warm-out")))
    print(f"spark session {session_s:.1f}s, warm-up job {warm_up_s:.1f}s", file=sys.stderr)

    results = []
    for n in args.series:
        data = root / f"series-{n}.parquet"
        generate_synthetic(n_series=n, n_steps=args.steps, seed=3).to_parquet(data)
        row = {"series": n, "rows": n * args.steps}
        buckets = int(spark.conf.get("spark.sql.shuffle.partitions"))

        def no_model(data=data, buckets=buckets) -> None:
            frame = read_input(spark, str(data)).select(ID, TIME, TARGET)
            grouped = frame.groupBy(F.pmod(F.xxhash64(ID), F.lit(buckets)))
            grouped.applyInPandas(_nothing, "unique_id string").write.format("noop").mode(
                "overwrite"
            ).save()

        runs = {
            "local": lambda data=data: predict_file(
                model, data, root / "local.parquet", progress=False
            ),
            "spark": lambda data=data: predict_spark(
                str(model_dir), str(data), str(root / "spark-out")
            ),
            "spark_no_model": no_model,
        }
        # Interleaved, so a burst of other work on the machine slows every kind alike.
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.repeat):
            for name, run in runs.items():
                times[name].append(round(_timed(run), 2))
        for name in runs:
            row[f"{name}_s"] = min(times[name])
            row[f"{name}_runs_s"] = times[name]
        for name in ("local", "spark", "spark_no_model"):
            row[f"{name}_series_per_s"] = round(n / row[f"{name}_s"], 1)
        row["spark_vs_local"] = round(row["local_s"] / row["spark_s"], 3)
        results.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)

    per_series = None
    if args.per_series:
        n = args.per_series
        data = root / f"per-series-{n}.parquet"
        generate_synthetic(n_series=n, n_steps=args.steps, seed=3).to_parquet(data)

        def by_series() -> None:
            # Hashed into 10**9 buckets, each series is its own group, as groupBy("unique_id").
            frame = read_input(spark, str(data))
            forecast_spark(frame, str(model_dir), buckets=10**9).write.format("noop").mode(
                "overwrite"
            ).save()

        seconds = _timed(by_series)
        per_series = {"series": n, "seconds": seconds, "series_per_s": round(n / seconds, 1)}
        print(json.dumps({"spark_per_series": per_series}), file=sys.stderr)
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)

    print(f"\n{'series':>8} {'local s/s':>10} {'spark s/s':>10} {'ratio':>6} {'no-model s/s':>13}")
    for row in results:
        print(
            f"{row['series']:>8} {row['local_series_per_s']:>10.0f} "
            f"{row['spark_series_per_s']:>10.0f} {row['spark_vs_local']:>6.2f} "
            f"{row['spark_no_model_series_per_s']:>13.0f}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "command": "python -m benchmarks.spark_predict " + " ".join(argv or sys.argv[1:]),
            "master": args.master,
            "steps": args.steps,
            "horizon": args.horizon,
            "cpus": os.cpu_count(),
            "spark_session_s": round(session_s, 2),
            "spark_warm_up_s": round(warm_up_s, 2),
            "sizes": results,
            "spark_per_series": per_series,
        }
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
