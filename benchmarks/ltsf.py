"""Long-term forecasting benchmark (ETTh1 protocol) for the patch Transformer.

    python -m benchmarks.ltsf --data ../shared/data/ETTh1.csv --json benchmarks/results/etth1.json

Protocol of the long-term forecasting literature (Informer, Autoformer, PatchTST, DLinear):
- ETTh borders: train rows [0, 8640), validation [8640 - L, 11520), test [11520 - L, 14400)
  (ETTm: the same months at 4 rows per hour; any other CSV: 70 / 10 / 20 % by time);
- a StandardScaler fitted on the training rows only, every variable, channel-independent;
- stride-1 windows, every test window scored (no dropped last batch);
- MSE and MAE on the scaled data, averaged over variables, horizon steps and windows.

`--peers` runs NeuralForecast's PatchTST, NHITS and DLinear on the same split (the `peers`
extra, in its own environment: `.venv-peers/bin/python -m benchmarks.ltsf ... --peers NHITS
DLinear --no-ours`): trained on the training rows alone, every test window scored on the same
scaled data. PatchTST with its defaults takes about 75 minutes per horizon on one CPU thread.

Data credit: ETT dataset (Zhou et al., Informer, AAAI 2021), CC BY-ND 4.0, read from
`../shared/data/`; no copy is kept in this repository.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from sklearn.preprocessing import StandardScaler

from benchmarks.overrides import add_set_option, overrides_of
from benchmarks.peers import MAX_STEPS, neuralforecast_model
from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster.config import MAX_DEFAULT_CONTEXT
from forecaster.data import wide_to_long
from forecaster.explain import LABELS, PARTS, attention_summary, uniform_attention
from forecaster.metrics import coverage

HORIZONS = (96, 192, 336, 720)
# Published test MSE on ETTh1 for reference (see README for sources).
ANCHORS = {
    "PatchTST/42, re-run with every test window": {96: 0.385, 192: 0.413, 336: 0.440, 720: 0.456},
    "PatchTST/64 as published": {96: 0.370, 192: 0.413, 336: 0.422, 720: 0.447},
    "DLinear (L=336)": {96: 0.375, 192: 0.405, 336: 0.439, 720: 0.472},
}


@dataclasses.dataclass(frozen=True)
class Borders:
    train_end: int
    val_end: int
    test_end: int


def borders_for(path: Path, n_rows: int) -> Borders:
    """The standard split: ETT's fixed months, else 70 / 10 / 20 % by time."""
    name = path.name.lower()
    hours = 30 * 24
    if name.startswith("etth"):
        return Borders(12 * hours, 16 * hours, 20 * hours)
    if name.startswith("ettm"):
        return Borders(12 * hours * 4, 16 * hours * 4, 20 * hours * 4)
    train_end = int(n_rows * 0.7)
    test_start = n_rows - int(n_rows * 0.2)
    return Borders(train_end, test_start, n_rows)


@dataclasses.dataclass(frozen=True)
class Splits:
    train: pd.DataFrame
    val: pd.DataFrame
    test: pd.DataFrame
    n_test_windows: int  # per variable


def _scaled(path: Path) -> tuple[pd.DataFrame, str, Borders]:
    """The wide frame scaled by a StandardScaler fitted on the training rows, its time column
    and the split's borders."""
    wide = pd.read_csv(path)
    time_column = wide.columns[0]
    values = wide.drop(columns=[time_column]).astype("float64")
    b = borders_for(path, len(wide))
    scaler = StandardScaler().fit(values.iloc[: b.train_end].to_numpy())
    scaled = pd.DataFrame(scaler.transform(values.to_numpy()), columns=values.columns)
    scaled.insert(0, time_column, pd.to_datetime(wide[time_column]))
    return scaled, time_column, b


def load_splits(path: Path, lookback: int, horizon: int) -> Splits:
    scaled, time_column, b = _scaled(path)

    def part(start: int, end: int) -> pd.DataFrame:
        return wide_to_long(scaled.iloc[start:end].reset_index(drop=True), time_column=time_column)

    return Splits(
        train=part(0, b.train_end),
        val=part(b.train_end - lookback, b.val_end),
        test=part(b.val_end - lookback, b.test_end),
        n_test_windows=b.test_end - b.val_end - horizon + 1,
    )


# Ablation variants: the config overrides that isolate each part of the model.
VARIANTS = {
    "full": ({}, {}),
    "linear start alone": ({}, {"max_epochs": 0}),
    "Transformer alone": ({"linear_start": False}, {}),
}


def _scores(forecaster: Forecaster, frame: pd.DataFrame) -> dict[str, float]:
    """MSE, MAE and the band's coverage over every window of `frame`, summed a batch at a time
    (Electricity's or Traffic's test split at H = 720 holds tens of GB of forecasts)."""
    squared = absolute = inside = 0.0
    points = windows = 0
    banded = False
    for batch in forecaster.iter_forecast_windows(frame):
        error = batch.mean - batch.target
        squared += float(np.sum(error**2))
        absolute += float(np.sum(np.abs(error)))
        points += error.size
        windows += len(error)
        if batch.quantiles is not None and batch.quantiles.shape[-1] >= 2:
            # Targets inside the band between the outer quantiles (0.8 is the aim of the
            # default 0.1-0.9 band).
            low, high = batch.quantiles[..., 0], batch.quantiles[..., -1]
            inside += coverage(batch.target, low, high) * error.size
            banded = True
    scores = {"mse": squared / points, "mae": absolute / points, "windows": windows}
    if banded:
        scores["band_coverage"] = inside / points
    return scores


def uniform_attention_scores(
    forecaster: Forecaster, frame: pd.DataFrame, n_origins: int = 12
) -> dict:
    """Validation MSE and MAE with each kind of attention made uniform (forecaster.explain),
    and how peaked the learned attention is, averaged over `n_origins` forecast origins spread
    over `frame`."""
    earned = {}
    for part in PARTS:
        with uniform_attention(forecaster.model, part):
            scores = _scores(forecaster, frame)
        earned[f"uniform {LABELS[part]}"] = {"val_mse": scores["mse"], "val_mae": scores["mae"]}
    times = np.sort(frame["ds"].unique())
    first, last = forecaster.context_length - 1, len(times) - 1
    origins = times[np.linspace(first, last, n_origins).round().astype(int)]
    summaries = [attention_summary(forecaster.attention(frame[frame["ds"] <= t])) for t in origins]
    earned["summary"] = {k: float(np.mean([s[k] for s in summaries])) for k in summaries[0]}
    return earned


def run_one(
    data: Path,
    horizon: int,
    lookback: int,
    seed: int,
    device: str,
    overrides: dict,
    variant: str = "full",
    attention: bool = False,
) -> dict[str, object]:
    splits = load_splits(data, lookback, horizon)
    model_extra, train_extra = VARIANTS[variant]
    model_config = ModelConfig(
        **{
            **overrides.get("model", {}),
            **model_extra,
            "context_length": lookback,
            "prediction_length": horizon,
        }
    )
    train_config = TrainConfig(
        **{**overrides.get("train", {}), **train_extra, "seed": seed, "device": device}
    )
    forecaster = Forecaster(model_config, train_config)
    started = time.perf_counter()
    forecaster.fit(splits.train, val_df=splits.val)
    train_seconds = time.perf_counter() - started
    val = _scores(forecaster, splits.val)
    test = _scores(forecaster, splits.test)
    # The band as trained, before its calibration on the validation windows.
    scales = forecaster.model.interval_scale.clone()
    forecaster.model.interval_scale.fill_(1.0)
    uncalibrated = _scores(forecaster, splits.test).get("band_coverage")
    forecaster.model.interval_scale.copy_(scales)
    n_vars = splits.test["unique_id"].nunique()
    assert test["windows"] == splits.n_test_windows * n_vars, "every test window must be scored"
    result = forecaster.train_result
    earned = None
    # The linear start alone never trains its attention: nothing to measure.
    if attention and variant != "linear start alone":
        earned = uniform_attention_scores(forecaster, splits.val)
    return {
        "dataset": data.stem,
        "variant": variant,
        "horizon": horizon,
        "lookback": lookback,
        "seed": seed,
        "mse": test["mse"],
        "mae": test["mae"],
        "val_mse": val["mse"],
        "val_mae": val["mae"],
        "test_windows": splits.n_test_windows,
        "train_seconds": round(train_seconds, 1),
        "epochs": len(result.epochs),
        "best_epoch": result.best_epoch,
        # The validation objective (the configured loss, in series units) before and after.
        "initial_val_loss": result.initial_val_loss,
        "best_val_loss": result.best_val_loss,
        # Per epoch: the training objective and the validation loss (the learning curve).
        "train_losses": [round(e.train_loss, 5) for e in result.epochs],
        "val_losses": [None if e.val_loss is None else round(e.val_loss, 5) for e in result.epochs],
        "linear_start_ridge": result.linear_start_ridge,
        "linear_start_prior": result.linear_start_prior,
        # The intervals' calibration factor and the band's coverage of the targets.
        "interval_scale": result.interval_scale,
        # The share of the way to the drift forecast that forecasts move, chosen on validation.
        "drift_weight": result.drift_weight,
        "val_band_coverage": val.get("band_coverage"),
        "test_band_coverage": test.get("band_coverage"),
        "test_band_coverage_uncalibrated": uncalibrated,
        "patch_length": forecaster.model_config.patch_length,
        "parameters": sum(p.numel() for p in forecaster.model.parameters()),
        # With --attention: validation scores with each kind of attention made uniform.
        "attention": earned,
        "device": result.device
        if result.device != "cpu"
        else f"cpu ({torch.get_num_threads()} threads, {platform.processor() or platform.machine()})",
    }


# NeuralForecast's models (the `peers` extra) on the same split, with the peers' settings
# (benchmarks.peers) and input_size the protocol's lookback L.
PEERS = ("PatchTST", "NHITS", "DLinear")


def peer_scores(predicted: pd.DataFrame, name: str) -> dict[str, float]:
    """MSE and MAE of column `name` of NeuralForecast's cross-validation frame (`unique_id`,
    `cutoff`, `y`, one column per model), and the windows (id, cutoff) it holds."""
    error = predicted[name].to_numpy(np.float64) - predicted["y"].to_numpy(np.float64)
    windows = len(predicted[["unique_id", "cutoff"]].drop_duplicates())
    return {
        "mse": float(np.mean(error**2)),
        "mae": float(np.mean(np.abs(error))),
        "windows": windows,
    }


def run_peer(data: Path, name: str, horizon: int, lookback: int, seed: int) -> dict | None:
    """NeuralForecast's `name` trained on the training rows alone (validation and test rows
    are cut from its training windows), scored on every test window; None when NeuralForecast
    is not installed."""
    try:
        from neuralforecast import NeuralForecast
    except ImportError:
        print("peers: neuralforecast not installed (pip install -e '.[peers]')", file=sys.stderr)
        return None
    scaled, time_column, b = _scaled(data)
    frame = wide_to_long(scaled.iloc[: b.test_end], time_column=time_column)
    freq = pd.infer_freq(scaled[time_column].iloc[:3]) or "h"
    # Validation losses would only be logged (no early stopping by default): skip them.
    peer = neuralforecast_model(name, horizon, lookback, seed, val_check_steps=MAX_STEPS)
    started = time.perf_counter()
    predicted = NeuralForecast(models=[peer], freq=freq).cross_validation(
        frame,
        n_windows=None,
        step_size=1,
        val_size=b.val_end - b.train_end,
        test_size=b.test_end - b.val_end,
    )
    seconds = time.perf_counter() - started
    scores = peer_scores(predicted, name)
    n_test_windows = b.test_end - b.val_end - horizon + 1
    assert scores["windows"] == n_test_windows * frame["unique_id"].nunique(), "every window"
    return {
        "dataset": data.stem,
        "variant": f"NeuralForecast {name}",
        "horizon": horizon,
        "lookback": lookback,
        "seed": seed,
        "mse": scores["mse"],
        "mae": scores["mae"],
        "test_windows": n_test_windows,
        "train_seconds": round(seconds, 1),
        # NeuralForecast trains on a GPU when there is one.
        "device": "cuda"
        if torch.cuda.is_available()
        else f"cpu ({torch.get_num_threads()} threads)",
    }


def print_table(
    results: list[dict[str, object]], anchors: dict[str, dict[int, float]] | None = None
) -> None:
    """The results as Markdown tables; `anchors`, published test MSE of the same data set by
    horizon, as rows beside ours."""
    full = [r for r in results if r["variant"] == "full"]
    horizons = sorted({int(r["horizon"]) for r in results})
    header = "| model | " + " | ".join(str(h) for h in horizons) + " |"
    rule = "|---" * (len(horizons) + 1) + "|"

    def cell(rows: list[dict], key: str, digits: int) -> str:
        values = [float(r[key]) for r in rows]
        if not values:
            return "-"
        if len(values) == 1:
            return f"{values[0]:.{digits}f}"
        mean, spread = statistics.mean(values), statistics.stdev(values)
        return f"{mean:.{digits}f} ± {spread:.{digits}f} (n={len(values)})"

    def row(name: str, rows: list[dict], key: str, digits: int = 3) -> str:
        cells = [cell([r for r in rows if int(r["horizon"]) == h], key, digits) for h in horizons]
        return f"| {name} | " + " | ".join(cells) + " |"

    peers = [r for r in results if str(r["variant"]).startswith("NeuralForecast")]
    if full or peers:
        lookback = (full or peers)[0]["lookback"]
        print("Test MSE, every window (defaults chosen on validation only):")
        print(header)
        print(rule)
        if full:
            print(row(f"ours (L={lookback})", full, "mse"))
            print(row("ours, test MAE (not MSE)", full, "mae"))
        for name in dict.fromkeys(str(r["variant"]) for r in peers):
            same = [r for r in peers if r["variant"] == name]
            print(row(f"{name} (L={lookback}, same split)", same, "mse"))
            print(row(f"{name}, train + predict s", same, "train_seconds", digits=0))
        for name, anchor in (anchors or {}).items():
            print(
                f"| {name} | "
                + " | ".join(f"{anchor[h]:.3f}" if h in anchor else "-" for h in horizons)
                + " |"
            )
        print()
    results = [r for r in results if r not in peers]
    if not results:
        return
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in results)]
    if len(variants) > 1:
        for key, metric in (("val_mse", "MSE"), ("val_mae", "MAE")):
            print(f"Ablation, validation {metric} (every validation window):")
            print(header)
            print(rule)
            for variant in variants:
                print(row(variant, [r for r in results if r["variant"] == variant], key))
            print()
    earned = [r for r in results if r.get("attention")]
    if earned:
        print("What attention earns: validation MSE / MAE, learned and with one kind made uniform")
        print(
            "| variant | horizon | seed | learned | "
            + " | ".join(f"uniform {LABELS[p]}" for p in PARTS)
            + " | entropy / uniform (enc, dec, cross) | cross rows apart |"
        )
        print("|---" * (len(PARTS) + 6) + "|")
        for r in earned:
            a = r["attention"]
            uniform = [a[f"uniform {LABELS[p]}"] for p in PARTS]
            cells = [f"{u['val_mse']:.4f} / {u['val_mae']:.4f}" for u in uniform]
            s = a["summary"]
            print(
                f"| {r['variant']} | {r['horizon']} | {r['seed']} "
                f"| {r['val_mse']:.4f} / {r['val_mae']:.4f} | "
                + " | ".join(cells)
                + f" | {s['encoder_entropy']:.2f}, {s['decoder_self_entropy']:.2f}, "
                f"{s['cross_entropy']:.2f} | {s['cross_row_distance']:.2f} |"
            )
        print()
    print(
        "| variant | horizon | seed | test MSE | test MAE | val MSE | val loss: start -> best "
        "| epochs (best) | train s | parameters | device |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        start = r["initial_val_loss"]
        best = r["best_val_loss"]
        change = (
            "-"
            if start is None
            else f"{start:.4f} -> {best:.4f} ({(best / start - 1) * 100:+.1f}%)"
        )
        print(
            f"| {r['variant']} | {r['horizon']} | {r['seed']} | {r['mse']:.4f} | {r['mae']:.4f} "
            f"| {r['val_mse']:.4f} | {change} | {r['epochs']} ({r['best_epoch']}) "
            f"| {r['train_seconds']} | {r['parameters']:,} | {r['device']} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", type=Path, required=True, help="CSV: a date column then numeric columns"
    )
    parser.add_argument(
        "--horizon", type=int, action="append", help="repeatable; default 96 192 336 720"
    )
    parser.add_argument(
        "--lookback",
        type=int,
        default=MAX_DEFAULT_CONTEXT,
        help="the protocol's lookback L, the model's context; default 336, what the model reads "
        "by default at every horizon from 48 steps",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one run per seed")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--ablation",
        action="store_true",
        help="also train the linear start alone and the Transformer alone (validation table)",
    )
    parser.add_argument(
        "--attention",
        action="store_true",
        help="also score validation with each kind of attention made uniform (what it earns)",
    )
    parser.add_argument(
        "--peers",
        nargs="*",
        choices=PEERS,
        help="also run these of NeuralForecast's models on the same split (the peers extra; "
        f"no name: {', '.join(PEERS)})",
    )
    parser.add_argument("--no-ours", action="store_true", help="run the peers only")
    add_set_option(parser)
    args = parser.parse_args(argv)
    if not args.data.is_file():
        print(f"error: --data {args.data}: no such file", file=sys.stderr)
        return 2
    overrides = overrides_of(args)

    variants = [] if args.no_ours else list(VARIANTS) if args.ablation else ["full"]
    results = []
    for horizon in args.horizon or HORIZONS:
        for seed in args.seeds:
            for name in (args.peers or PEERS) if args.peers is not None else ():
                peer = run_peer(args.data, name, horizon, args.lookback, seed)
                if peer is None:
                    break
                print(json.dumps(peer), file=sys.stderr, flush=True)
                results.append(peer)
            for variant in variants:
                result = run_one(
                    args.data,
                    horizon,
                    args.lookback,
                    seed,
                    args.device,
                    overrides,
                    variant,
                    attention=args.attention,
                )
                print(json.dumps(result), file=sys.stderr, flush=True)
                results.append(result)
    # ETTh1's published figures name no other data set: beside another file they would mislead.
    print_table(results, ANCHORS if args.data.name.lower() == "etth1.csv" else None)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"results": results, "overrides": overrides}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
