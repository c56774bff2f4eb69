"""Forecast, attention and metric-over-time plots written to PNG.

Figures are built with matplotlib's object API (`Figure`, rendered by the Agg canvas), never
pyplot: no display is needed and the caller's pyplot backend and state are left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from forecaster.data import ID, TARGET, TIME, quantile_column
from forecaster.errors import (
    EmptyDataError,
    InvalidConfigError,
    MissingColumnsError,
    UnknownQuantileError,
)
from forecaster.metrics import quantiles_in
from forecaster.outputs import AttentionMaps

# History drawn before the forecast, in multiples of the horizon (at least _MIN_HISTORY points).
_HISTORY_HORIZONS = 4
_MIN_HISTORY = 48


def plot_forecast(
    history: pd.DataFrame,
    forecast: pd.DataFrame,
    path: str | Path,
    *,
    series_ids: Sequence[str] | None = None,
    max_series: int = 4,
    quantiles: Sequence[float] | None = None,
    actuals: pd.DataFrame | None = None,
) -> Path:
    """One panel per series: recent history, the mean forecast, the band between the outermost
    quantiles and, if given, the actual values over the horizon.

    Args:
        history: long frame (`unique_id`, `ds`, `y`); the last few horizons of it are drawn.
        forecast: `predict` output (`unique_id`, `ds`, `mean`, `q...`).
        path: PNG file to write; parent folders are created.
        series_ids: series to draw; defaults to the first `max_series` of `forecast`.
        quantiles: the band's levels; defaults to every quantile column of `forecast`.
        actuals: long frame with the true values over the horizon.
    """
    _require(forecast, [ID, TIME, "mean"], "forecast")
    _require(history, [ID, TIME, TARGET], "history")
    if actuals is not None:
        _require(actuals, [ID, TIME, TARGET], "actuals")
    if max_series < 1:
        raise InvalidConfigError(f"max_series: expected >= 1, got {max_series}", field="max_series")
    available = list(pd.unique(forecast[ID].astype("str")))
    if series_ids is None:
        chosen = available[:max_series]
    else:
        chosen = [str(s) for s in series_ids]
        unknown = [s for s in chosen if s not in available]
        if unknown:
            raise InvalidConfigError(
                f"series_ids: {unknown} have no forecast; forecast series: {available[:10]}",
                field="series_ids",
            )
    if not chosen:
        raise EmptyDataError("forecast has no rows to plot")
    levels = quantiles_in(forecast) if quantiles is None else sorted(map(float, quantiles))
    band = None
    if len(levels) >= 2:
        band = (quantile_column(levels[0]), quantile_column(levels[-1]))
        absent = [c for c in band if c not in forecast.columns]
        if absent:
            raise UnknownQuantileError(
                f"quantiles: forecast has no columns {absent}; it has "
                f"{[quantile_column(q) for q in quantiles_in(forecast)]}",
                field="quantiles",
            )

    fig = Figure(figsize=(10, 2.8 * len(chosen)))
    axes = fig.subplots(len(chosen), 1, squeeze=False)
    hist_ids = history[ID].astype("str")
    fc_ids = forecast[ID].astype("str")
    for ax, sid in zip(axes[:, 0], chosen, strict=True):
        fc = forecast[fc_ids == sid].sort_values(TIME)
        keep = max(_HISTORY_HORIZONS * len(fc), _MIN_HISTORY)
        hist = history[hist_ids == sid].sort_values(TIME).tail(keep)
        ax.plot(hist[TIME], hist[TARGET], color="black", linewidth=1.0, label="history")
        if band is not None:
            coverage = round((levels[-1] - levels[0]) * 100)
            ax.fill_between(
                fc[TIME].to_numpy(),
                fc[band[0]].to_numpy(np.float64),
                fc[band[1]].to_numpy(np.float64),
                color="tab:blue",
                alpha=0.25,
                label=f"{coverage:g}% interval ({band[0]}..{band[1]})",
            )
        ax.plot(fc[TIME], fc["mean"], color="tab:blue", linewidth=1.5, label="forecast (mean)")
        if actuals is not None:
            act = actuals[actuals[ID].astype("str") == sid].sort_values(TIME)
            act = act[act[TIME].isin(fc[TIME])]
            ax.plot(act[TIME], act[TARGET], color="tab:red", linewidth=1.0, label="actual")
        ax.set_title(f"series {sid}")
        ax.set_ylabel(TARGET)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    axes[-1, 0].set_xlabel(TIME)
    fig.autofmt_xdate()
    fig.tight_layout()
    return _save(fig, path)


def plot_attention(
    maps: AttentionMaps, path: str | Path, *, series_index: int = 0, layer: int = -1
) -> Path:
    """Three heatmaps for one series, each averaged over heads: encoder self-attention over
    the context patches, the decoder's causal self-attention over the horizon tokens, and the
    decoder-to-encoder cross-attention. `layer` indexes the layers of each stack (-1: last).
    """
    n_series = len(maps.series_ids)
    if not -n_series <= series_index < n_series:
        raise InvalidConfigError(
            f"series_index: expected -{n_series}..{n_series - 1}, got {series_index}",
            field="series_index",
        )
    panels = []
    for name, layers, query, key in (
        ("encoder self-attention", maps.encoder, "context patch (query)", "context patch (key)"),
        (
            "decoder causal self-attention",
            maps.decoder_self,
            "horizon token (query)",
            "horizon token (key)",
        ),
        ("cross-attention", maps.cross, "horizon token (query)", "context patch (key)"),
    ):
        if not layers:
            continue
        if not -len(layers) <= layer < len(layers):
            raise InvalidConfigError(
                f"layer: expected -{len(layers)}..{len(layers) - 1} for the {name}, got {layer}",
                field="layer",
            )
        weights = np.asarray(layers[layer][series_index], dtype=np.float64).mean(axis=0)
        panels.append((name, weights, query, key))
    if not panels:
        raise EmptyDataError("attention maps hold no layers to plot")

    sid = maps.series_ids[series_index]
    fig = Figure(figsize=(5.2 * len(panels), 4.6))
    axes = fig.subplots(1, len(panels), squeeze=False)
    for ax, (name, weights, query, key) in zip(axes[0], panels, strict=True):
        image = ax.imshow(weights, cmap="viridis", aspect="auto", interpolation="nearest", vmin=0)
        ax.set_title(name)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(f"{key} index")
        ax.set_ylabel(f"{query} index")
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="weight (mean over heads)")
    layer_label = "last layer" if layer == -1 else f"layer {layer}"
    start = maps.context_starts[series_index] if maps.context_starts else ""
    if start is None:  # the padded context reaches before the range timestamps have
        start = "before 1677-09-21"
    fig.suptitle(
        f"series {sid}: attention, {layer_label}; context from {start}, "
        f"patch length {maps.patch_length}, stride {maps.patch_stride}"
    )
    fig.tight_layout()
    return _save(fig, path)


def plot_metric_over_time(
    values: pd.DataFrame, path: str | Path, *, title: str, ylabel: str
) -> Path:
    """One line per group of a metric over time (`group`, `time`, `value` columns), e.g. the
    realised accuracy of each deployed model version by forecast origin."""
    _require(values, ["group", "time", "value"], "values")
    if not len(values):
        raise EmptyDataError("values: no rows to plot")
    fig = Figure(figsize=(10, 4))
    ax = fig.subplots()
    for group, rows in values.groupby("group", sort=True):
        rows = rows.sort_values("time")
        ax.plot(rows["time"], rows["value"], marker="o", markersize=3, label=str(group))
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.set_xlabel("time")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.autofmt_xdate()
    fig.tight_layout()
    return _save(fig, path)


def _require(frame: pd.DataFrame, columns: list[str], name: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise MissingColumnsError(
            f"{name}: missing columns {missing}; present: {list(map(str, frame.columns))}",
            field=missing[0],
        )


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
