"""Fit and predict on a large synthetic catalogue: where the time goes with many series.

    python -m benchmarks.fit_scale --series 48000 --horizon 18 --freq ME --epochs 2
    python -m benchmarks.fit_scale --series 48000 --horizon 18 --freq ME --epochs 2 \\
        --set train.max_val_windows=0          # every validation window, the old default
    python -m benchmarks.fit_scale --series 48000 --freq ME --validate-only 6

M4's Monthly group holds 48,000 series of 42 to 2,794 points (horizon 18); its Yearly and
Quarterly groups over 23,000 each. The catalogue here has that shape: log-normal lengths around
200 steps (42 to 2,800), levels spread over orders of magnitude, a yearly cycle, a trend and
noise. Nothing is scored: it measures the cost of validating the frame, the linear start's fit,
each epoch (training and validation), the intervals' calibration and one forecast per series,
with `--epochs` capping training so a run takes minutes. `--validate-only N` validates the frame
N times instead, printing each run's wall, user and system (kernel) seconds: the frame's
validation is the part of `fit` and `predict` whose time varies most between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from benchmarks.overrides import add_set_option, overrides_of
from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster.time_axis import season_length
from forecaster.validation import validate_long_frame


def catalogue(n_series: int, freq: str, seed: int = 0) -> pd.DataFrame:
    """A long frame of `n_series` seasonal series of log-normal lengths (42 .. 2,800 steps)."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(200), 0.6, n_series).astype(np.int64), 42, 2800)
    step = np.concatenate([np.arange(n) for n in lengths])
    level = np.repeat(rng.lognormal(8, 1, n_series), lengths)
    period = max(season_length(freq), 2)
    y = level * (
        1
        + 0.1 * np.sin(2 * np.pi * step / period)
        + 0.001 * step
        + 0.05 * rng.standard_normal(len(step))
    )
    ds = pd.date_range("1900-01-31", periods=int(lengths.max()), freq=freq).to_numpy()[step]
    ids = np.repeat(np.array([f"S{i:06d}" for i in range(n_series)], dtype=object), lengths)
    return pd.DataFrame({"unique_id": ids, "ds": ds, "y": y})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--series", type=int, default=48000)
    parser.add_argument("--horizon", type=int, default=18)
    parser.add_argument("--freq", default="ME", help="pandas frequency of the catalogue")
    parser.add_argument("--epochs", type=int, default=2, help="train.max_epochs")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--validate-only",
        type=int,
        metavar="N",
        help="validate the frame N times (what fit and predict do first), nothing else",
    )
    add_set_option(parser)
    args = parser.parse_args(argv)
    overrides = overrides_of(args)

    frame = catalogue(args.series, args.freq)
    if args.validate_only:
        figures = {"series": args.series, "rows": len(frame), "freq": args.freq}
        figures["validation_runs"] = [_timed_validation(frame) for _ in range(args.validate_only)]
        return _report(figures, args.json)
    model_config = ModelConfig(**{**overrides.get("model", {}), "prediction_length": args.horizon})
    train_config = TrainConfig(
        **{"progress": False, **overrides.get("train", {}), "max_epochs": args.epochs}
    )
    forecaster = Forecaster(model_config, train_config)
    started = time.perf_counter()
    forecaster.fit(frame)
    fit_seconds = time.perf_counter() - started
    result = forecaster.train_result
    started = time.perf_counter()
    forecast = forecaster.predict(frame)
    predict_seconds = time.perf_counter() - started

    figures = {
        "series": args.series,
        "rows": len(frame),
        "freq": args.freq,
        "horizon": args.horizon,
        "train_windows": result.n_train_windows,
        "val_windows": result.n_val_windows,
        "epochs": len(result.epochs),
        # Each epoch's wall time: its training steps, then one validation pass.
        "epoch_seconds": [round(e.seconds, 1) for e in result.epochs],
        # Everything else fit does: validating the frame, the linear start's fit, the
        # validation of epoch 0 and the intervals' calibration.
        "fit_seconds_outside_epochs": round(fit_seconds - sum(e.seconds for e in result.epochs), 1),
        "fit_seconds": round(fit_seconds, 1),
        "predict_seconds": round(predict_seconds, 1),
        "forecast_rows": len(forecast),
        "overrides": overrides,
    }
    return _report(figures, args.json)


def _timed_validation(frame: pd.DataFrame) -> dict[str, float]:
    """One validation of `frame` as fit does it: wall, user and system seconds. System time is
    the kernel's, mostly zeroing the pages of fresh arrays of a hundred MB."""
    before, started = os.times(), time.perf_counter()
    validate_long_frame(frame, allow_missing=True)
    wall, after = time.perf_counter() - started, os.times()
    return {
        "wall_seconds": round(wall, 2),
        "user_seconds": round(after.user - before.user, 2),
        "system_seconds": round(after.system - before.system, 2),
    }


def _report(figures: dict, path: Path | None) -> int:
    figures["machine"] = f"{platform.machine()}, {torch.get_num_threads()} torch threads"
    print(json.dumps(figures, indent=2))
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
