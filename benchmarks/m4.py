"""M4 Hourly benchmark, the competition's protocol, for the patch Transformer and its peers.

    python -m benchmarks.m4 --data ../shared/data/m4/Hourly-train.csv --json OUT
    python -m benchmarks.m4 --data Hourly-train.csv --test Hourly-test.csv   # the scored run

Without `--test`, each series' last 48 points are held out from the training file and scored
(validation: every default was chosen this way). With `--test` (the same layout: an id column,
then the 48 values after each series), the model is fitted on the whole training file and
scored on the test file. The library's defaults are used with prediction_length=48.

Metrics are the competition's: sMAPE (percent), MASE with seasonality 24 (scaled by each
series' in-sample seasonal-naive MAE), and OWA = (sMAPE / sMAPE_Naive2 + MASE / MASE_Naive2) / 2
against the published Naive2 figures (18.383 / 2.395). Naive2 on the same split is printed too.

`--short-and-gappy` runs the same protocol on damaged histories, what catalogues of new
products or sensors look like: a third of the series are cut to a random length between 2
points and one context plus one horizon, and 5 % of every history's points are missing (NaN).
MASE keeps the scale of each series' full history. Ours is scored beside naive and seasonal
naive (which repeat the last observed values); the peers are skipped (they refuse NaN).

`--gap-patterns` scores each fitted model once more for each outage in `GAP_PATTERNS`, applied
at forecast time to every history (5 % of points missing, the last day, one day a week back,
the last three days), beside seasonal naive on the same damaged histories: what a live feed's
outage costs a model trained on clean data.

`--attention` scores each fitted model once more with each kind of its attention made uniform
(`forecaster.explain`): what attention earns on the held-out points, and how peaked it is.

Peers run in the same command when the optional extra is installed (`pip install -e
".[peers]"`, best in its own virtual environment: statsforecast needs pandas < 3): NeuralForecast's
NHITS and PatchTST with their documented defaults (input_size 7 * H, max_steps 1000,
scaler_type "robust") and statsforecast's MSTL (seasons 24 and 168).

Data: the M4 competition (Makridakis, Spiliotis and Assimakopoulos, IJF 2020), read from
`../shared/data/m4/`; no copy is kept in this repository.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from benchmarks.overrides import add_set_option, overrides_of
from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster.baselines import SeasonalNaive
from forecaster.data import quantile_column
from forecaster.explain import LABELS, PARTS, attention_summary, uniform_attention
from forecaster.metrics import coverage, coverage_by_history, mase_scale, smape

HORIZON = 48
SEASON = 24
# Published Naive2 scores of M4 Hourly's test set (sMAPE, MASE), the OWA reference.
NAIVE2 = (18.383, 2.395)
# Published test scores for reference (sMAPE, MASE, OWA).
ANCHORS = {
    "seasonal naive (published)": (13.912, 1.193, None),
    "ES-RNN, M4 winner (published)": (9.328, 0.893, 0.440),
}
# Any regular hourly index will do: M4 gives no timestamps.
ORIGIN = pd.Timestamp("2000-01-01")


@dataclass(frozen=True)
class Split:
    ids: list[str]
    history: list[np.ndarray]  # per series, what the models see (NaN = missing)
    truth: np.ndarray  # (S, 48)
    scales: np.ndarray  # (S,) in-sample seasonal-naive MAE of the full history, MASE's scale


def read_wide(path: Path) -> dict[str, np.ndarray]:
    """M4's layout: one row per series, the id first, then values (empty after the end)."""
    frame = pd.read_csv(path)
    ids = frame.iloc[:, 0].astype(str).tolist()
    values = frame.iloc[:, 1:].to_numpy(dtype=np.float64)
    return {sid: row[~np.isnan(row)] for sid, row in zip(ids, values, strict=True)}


def make_split(train_path: Path, test_path: Path | None) -> Split:
    train = read_wide(train_path)
    ids = list(train)
    if test_path is None:
        history = [train[sid][:-HORIZON] for sid in ids]
        truth = np.stack([train[sid][-HORIZON:] for sid in ids])
        return Split(ids, history, truth, _scales(history))
    test = read_wide(test_path)
    missing = [sid for sid in ids if sid not in test or len(test[sid]) < HORIZON]
    if missing:
        raise SystemExit(
            f"error: --test {test_path}: expected {HORIZON} values for every series of the "
            f"training file; {len(missing)} missing or short, e.g. {missing[0]!r}"
        )
    history = [train[sid] for sid in ids]
    return Split(ids, history, np.stack([test[sid][:HORIZON] for sid in ids]), _scales(history))


def _scales(history: list[np.ndarray]) -> np.ndarray:
    return np.array([mase_scale(h, SEASON) for h in history])


def short_and_gappy(split: Split, context_length: int, seed: int = 0) -> Split:
    """A third of the series cut to 2 .. context + horizon points; 5 % of all points NaN."""
    rng = np.random.default_rng(seed)
    history = []
    cut = rng.random(len(split.ids)) < 1 / 3
    for h, short in zip(split.history, cut, strict=True):
        if short:
            h = h[-int(rng.integers(2, context_length + HORIZON + 1)) :]
        h = h.copy()
        missing = rng.random(len(h)) < 0.05
        missing[-1] = False  # the origin is observed: what is scored is the forecast, not luck
        if (~missing).sum() < 2:
            missing[:] = False
        h[missing] = np.nan
        history.append(h)
    return Split(split.ids, history, split.truth, split.scales)


def _missing_at_random(h: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    missing = rng.random(len(h)) < 0.05
    missing[-1] = False
    return np.where(missing, np.nan, h)


def _missing_span(start: int, stop: int | None):
    def damage(h: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        h = h.copy()
        h[start:stop] = np.nan
        return h

    return damage


# Outages a live feed has at forecast time, applied to every history of a gap-free split.
GAP_PATTERNS = {
    "5% of points missing at random": _missing_at_random,
    "last day missing": _missing_span(-SEASON, None),
    "one day a week back missing": _missing_span(-7 * SEASON, -6 * SEASON),
    "last three days missing": _missing_span(-3 * SEASON, None),
}


def with_gaps(split: Split, pattern: str, seed: int = 0) -> Split:
    """The split with `pattern` applied to every history (the scale of MASE unchanged)."""
    rng = np.random.default_rng(seed)
    history = [GAP_PATTERNS[pattern](h, rng) for h in split.history]
    return Split(split.ids, history, split.truth, split.scales)


def long_frame(split: Split) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "unique_id": np.repeat(split.ids, [len(h) for h in split.history]),
            "ds": np.concatenate(
                [pd.date_range(ORIGIN, periods=len(h), freq="h").values for h in split.history]
            ),
            "y": np.concatenate(split.history),
        }
    )


def forecasts_from_frame(split: Split, frame: pd.DataFrame, column: str) -> np.ndarray:
    """(S, 48) from a long forecast frame, series in the split's order."""
    frame = frame.assign(unique_id=frame["unique_id"].astype(str)).sort_values(["unique_id", "ds"])
    by_id = {sid: g[column].to_numpy() for sid, g in frame.groupby("unique_id", sort=False)}
    return np.stack([by_id[sid][:HORIZON] for sid in split.ids])


def score(split: Split, forecast: np.ndarray) -> dict[str, float]:
    assert forecast.shape == split.truth.shape, "one forecast of 48 steps per series"
    assert np.isfinite(forecast).all(), "every series forecast"
    s = float(np.mean([smape(y, f) for y, f in zip(split.truth, forecast, strict=True)]))
    m = float(np.mean(np.abs(split.truth - forecast).mean(axis=1) / split.scales))
    return {"smape": s, "mase": m, "owa": 0.5 * (s / NAIVE2[0] + m / NAIVE2[1])}


# ------------------------------------------------------------------------------------------
# reference forecasts


def seasonal_naive(split: Split) -> np.ndarray:
    """The last season repeated; missing values and short series handled as the library does."""
    frame = long_frame(split)
    predicted = SeasonalNaive(season_length=SEASON, horizon=HORIZON).fit(frame).predict(frame)
    return forecasts_from_frame(split, predicted, "mean")


def naive(split: Split) -> np.ndarray:
    """The last observed value, repeated."""
    last = [pd.Series(h).ffill().iloc[-1] for h in split.history]
    return np.repeat(np.array(last)[:, None], HORIZON, axis=1)


def naive2(split: Split) -> np.ndarray:
    """M4's Naive2: the last value of the seasonally adjusted series, reseasonalised.

    A series counts as seasonal when its autocorrelation at lag 24 passes the competition's
    90% test; its seasonal indices come from a classical multiplicative decomposition.
    """
    out = []
    for h in split.history:
        indices = _seasonal_indices(h) if _is_seasonal(h) else np.ones(SEASON)
        phase = np.arange(len(h)) % SEASON
        adjusted = h / indices[phase]
        future_phase = np.arange(len(h), len(h) + HORIZON) % SEASON
        out.append(adjusted[-1] * indices[future_phase])
    return np.stack(out)


def _acf(x: np.ndarray, k: int) -> float:
    d = x - x.mean()
    return float(np.sum(d[k:] * d[:-k]) / np.sum(d**2))


def _is_seasonal(x: np.ndarray) -> bool:
    # As in the competition's code: acf(1) + sum of squared acf(2..m-1).
    s = _acf(x, 1) + sum(_acf(x, k) ** 2 for k in range(2, SEASON))
    limit = 1.645 * np.sqrt((1 + 2 * s) / len(x))
    return abs(_acf(x, SEASON)) > limit


def _seasonal_indices(x: np.ndarray) -> np.ndarray:
    """Multiplicative indices per phase: x over its centred 2x24 moving average, averaged."""
    kernel = np.r_[0.5, np.ones(SEASON - 1), 0.5] / SEASON
    trend = np.convolve(x, kernel, mode="valid")  # aligned with x[12:-12]
    half = SEASON // 2
    ratio = x[half : len(x) - half] / trend
    phase = np.arange(half, len(x) - half) % SEASON
    indices = np.array([ratio[phase == p].mean() for p in range(SEASON)])
    return indices / indices.mean()


# ------------------------------------------------------------------------------------------
# models


def run_ours(split: Split, seed: int, overrides: dict) -> tuple[Forecaster, np.ndarray, dict]:
    model_config = ModelConfig(**{**overrides.get("model", {}), "prediction_length": HORIZON})
    train_config = TrainConfig(**{**overrides.get("train", {}), "seed": seed})
    forecaster = Forecaster(model_config, train_config)
    frame = long_frame(split)
    started = time.perf_counter()
    forecaster.fit(frame)
    seconds = time.perf_counter() - started
    predicted = forecaster.predict(long_frame(split))
    forecast = forecasts_from_frame(split, predicted, "mean")
    r = forecaster.train_result
    return (
        forecaster,
        forecast,
        {
            "train_seconds": round(seconds, 1),
            "epochs": len(r.epochs),
            "best_epoch": r.best_epoch,
            "initial_val_loss": r.initial_val_loss,
            "best_val_loss": r.best_val_loss,
            "linear_start_ridge": r.linear_start_ridge,
            "interval_scale": r.interval_scale,
            "patch_length": forecaster.model_config.patch_length,
            "parameters": sum(p.numel() for p in forecaster.model.parameters()),
            **calibration(
                split, predicted, forecaster.quantiles, forecaster.model_config.context_length
            ),
        },
    )


def calibration(
    split: Split, predicted: pd.DataFrame, levels: tuple[float, ...], context_length: int
) -> dict:
    """How often the truth falls below each quantile forecast (ideally the level itself), and
    inside the band between the outer quantiles (ideally their difference), overall and by
    the band of history the model saw (`forecaster.model.history_band`)."""
    bands = {q: forecasts_from_frame(split, predicted, quantile_column(q)) for q in levels}
    out: dict = {"share_below": {str(q): float(np.mean(split.truth < b)) for q, b in bands.items()}}
    if len(levels) >= 2:
        low, high = bands[levels[0]], bands[levels[-1]]
        out["band_coverage"] = {f"{levels[0]}-{levels[-1]}": coverage(split.truth, low, high)}
        history = np.array([len(h) for h in split.history])
        out["band_coverage_by_history"] = coverage_by_history(
            split.truth, low, high, history, context_length
        )
    return out


def predict_ours(forecaster: Forecaster, split: Split) -> np.ndarray:
    return forecasts_from_frame(split, forecaster.predict(long_frame(split)), "mean")


PEERS = ("NHITS", "PatchTST", "MSTL")


def run_peers(
    split: Split, seed: int, names: tuple[str, ...] = PEERS
) -> Iterator[tuple[str, np.ndarray, float]]:
    """NeuralForecast's NHITS and PatchTST, statsforecast's MSTL, each as it finishes: (name,
    forecast, seconds); nothing when not installed."""
    frame = long_frame(split)
    try:
        from neuralforecast import NeuralForecast
        from neuralforecast.models import NHITS, PatchTST
    except ImportError:
        print("peers: neuralforecast not installed (pip install -e '.[peers]')", file=sys.stderr)
    else:
        for name, model in (("NHITS", NHITS), ("PatchTST", PatchTST)):
            if name not in names:
                continue
            peer = model(
                h=HORIZON,
                input_size=7 * HORIZON,
                max_steps=1000,
                scaler_type="robust",
                random_seed=seed,
                enable_progress_bar=False,
                logger=False,
            )
            started = time.perf_counter()
            forecaster = NeuralForecast(models=[peer], freq="h")
            forecaster.fit(frame)
            predicted = forecaster.predict().reset_index()
            seconds = time.perf_counter() - started
            yield (
                f"NeuralForecast {name} (defaults)",
                forecasts_from_frame(split, predicted, name),
                seconds,
            )
    if "MSTL" not in names:
        return
    try:
        from statsforecast import StatsForecast
        from statsforecast.models import MSTL
    except ImportError:
        print("peers: statsforecast not installed (pip install -e '.[peers]')", file=sys.stderr)
    else:
        started = time.perf_counter()
        sf = StatsForecast(models=[MSTL(season_length=[24, 168])], freq="h", n_jobs=-1)
        predicted = sf.forecast(df=frame, h=HORIZON).reset_index()
        seconds = time.perf_counter() - started
        yield (
            "statsforecast MSTL (24, 168)",
            forecasts_from_frame(split, predicted, "MSTL"),
            seconds,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True, help="M4 Hourly-train.csv")
    parser.add_argument("--test", type=Path, help="score on this file instead of a holdout")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one run per seed")
    parser.add_argument("--no-peers", action="store_true", help="skip NeuralForecast/MSTL")
    parser.add_argument(
        "--peers", nargs="+", choices=PEERS, default=list(PEERS), help="which peers to run"
    )
    parser.add_argument("--no-ours", action="store_true", help="run the baselines and peers only")
    parser.add_argument(
        "--short-and-gappy",
        action="store_true",
        help="cut a third of the histories short and make 5%% of the points missing",
    )
    parser.add_argument(
        "--gap-patterns",
        action="store_true",
        help="also score each fitted model on histories with outages at forecast time",
    )
    parser.add_argument(
        "--attention",
        action="store_true",
        help="also score each fitted model with each kind of attention made uniform",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    add_set_option(parser)
    args = parser.parse_args(argv)
    for name, path in (("--data", args.data), ("--test", args.test)):
        if path is not None and not path.is_file():
            print(f"error: {name} {path}: no such file", file=sys.stderr)
            return 2
    overrides = overrides_of(args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    split = make_split(args.data, args.test)
    mode = "test file" if args.test else f"holdout (last {HORIZON} points of each series)"
    if args.short_and_gappy:
        context_length = overrides["model"].get("context_length", ModelConfig().context_length)
        split = short_and_gappy(split, context_length)
        mode += ", a third of the histories cut short, 5% of points missing"
    rows: list[dict] = []

    def add(
        name: str, forecast: np.ndarray, seconds: float | None, scored: Split = split, **extra
    ) -> None:
        rows.append({"model": name, **score(scored, forecast), "seconds": seconds, **extra})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)

    if args.short_and_gappy:
        add("naive (same split)", naive(split), None)
    else:  # Naive2's decomposition needs complete histories of two seasons or more
        add("Naive2 (same split)", naive2(split), None)
    add("seasonal naive (same split)", seasonal_naive(split), None)
    damaged = {p: with_gaps(split, p) for p in GAP_PATTERNS} if args.gap_patterns else {}
    for seed in [] if args.no_ours else args.seeds:
        forecaster, forecast, info = run_ours(split, seed, overrides)
        if args.attention:
            info["attention"] = attention_summary(forecaster.attention(long_frame(split)))
        add(f"ours (seed {seed})", forecast, info["train_seconds"], seed=seed, **info)
        for part in PARTS if args.attention else ():
            with uniform_attention(forecaster.model, part):
                add(
                    f"ours (seed {seed}), uniform {LABELS[part]}",
                    predict_ours(forecaster, split),
                    None,
                )
        for pattern, gappy in damaged.items():
            add(f"ours (seed {seed}), {pattern}", predict_ours(forecaster, gappy), None, gappy)
    for pattern, gappy in damaged.items():
        add(f"seasonal naive, {pattern}", seasonal_naive(gappy), None, gappy)
    if not (args.no_peers or args.short_and_gappy):
        for name, forecast, seconds in run_peers(split, args.seeds[0], tuple(args.peers)):
            add(name, forecast, round(seconds, 1))

    print(f"M4 Hourly, {len(split.ids)} series, horizon {HORIZON}, scored on the {mode}")
    print("| model | sMAPE | MASE | OWA | fit + predict s |")
    print("|---|---|---|---|---|")
    for r in rows:
        seconds = "-" if r["seconds"] is None else f"{r['seconds']:.0f}"
        print(f"| {r['model']} | {r['smape']:.3f} | {r['mase']:.3f} | {r['owa']:.3f} | {seconds} |")
    for name, (s, m, owa) in ANCHORS.items():
        print(
            f"| {name}, test set | {s:.3f} | {m:.3f} | {'-' if owa is None else f'{owa:.3f}'} | - |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        machine = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
        args.json.write_text(
            json.dumps(
                {"mode": mode, "machine": machine, "overrides": overrides, "results": rows},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
