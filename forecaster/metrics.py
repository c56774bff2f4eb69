"""Forecast accuracy metrics (numpy) and `evaluate`, which computes all of them on a frame.

Point metrics average over every element given, a missing value (NaN, in the truth or the
forecast) left out: NaN only when nothing is left. sMAPE is the M4 definition in percent
(0..200). MASE divides by the in-sample MAE of the seasonal-naive forecast, over the
differences both of whose points are observed; a series whose in-sample data is constant has
no scale, gets NaN and is left out of the average in `evaluate`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from forecaster.config import HISTORY_BANDS, HISTORY_EDGES
from forecaster.data import ID, TARGET, TIME, quantile_column
from forecaster.errors import EmptyDataError, InvalidConfigError, MissingColumnsError


def _pair(y: np.ndarray, y_hat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y, dtype=np.float64)
    y_hat = np.asarray(y_hat, dtype=np.float64)
    if y.shape != y_hat.shape:
        raise InvalidConfigError(
            f"y_hat: expected the shape of y {y.shape}, got {y_hat.shape}", field="y_hat"
        )
    return y, y_hat


def _mean(values: np.ndarray) -> float:
    """The mean of the non-NaN `values`; NaN when there is none (without numpy's warning)."""
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else float("nan")


def mae(y: np.ndarray, y_hat: np.ndarray) -> float:
    """Mean absolute error."""
    y, y_hat = _pair(y, y_hat)
    return _mean(np.abs(y - y_hat))


def mse(y: np.ndarray, y_hat: np.ndarray) -> float:
    """Mean squared error."""
    y, y_hat = _pair(y, y_hat)
    return _mean((y - y_hat) ** 2)


def rmse(y: np.ndarray, y_hat: np.ndarray) -> float:
    """Root mean squared error."""
    return float(np.sqrt(mse(y, y_hat)))


def smape(y: np.ndarray, y_hat: np.ndarray) -> float:
    """Symmetric MAPE in percent, 200 * mean(|y - y_hat| / (|y| + |y_hat|)); 0/0 counts as 0."""
    y, y_hat = _pair(y, y_hat)
    return _mean(_smape_terms(y, y_hat))


def _smape_terms(y: np.ndarray, y_hat: np.ndarray) -> np.ndarray:
    """200 |y - y_hat| / (|y| + |y_hat|) per point: 0 for 0/0, NaN where either is missing."""
    denominator = np.abs(y) + np.abs(y_hat)
    ratio = np.divide(
        np.abs(y - y_hat), denominator, out=np.zeros_like(denominator), where=denominator > 0
    )
    return np.where(np.isnan(denominator), np.nan, 200.0 * ratio)


def mase_scale(y_insample: np.ndarray, season_length: int) -> float:
    """In-sample MAE of the seasonal-naive forecast of one series (`panel_mase_scales`).

    NaN when there is no scale: fewer than two points, or a history that repeats itself.
    """
    y_insample = np.asarray(y_insample, dtype=np.float64).reshape(-1)
    return float(panel_mase_scales(y_insample, np.array([0, y_insample.size]), season_length)[0])


def panel_mase_scales(
    values: np.ndarray, offsets: np.ndarray, season_length: int, seasonal_only: bool = False
) -> np.ndarray:
    """(n_series,) MASE's scale of each series of a panel laid end to end: the mean absolute
    difference between observed values `season_length` steps apart.

    `values` is (T,) float64 with NaN where a step is not observed, and `offsets` (n_series + 1,)
    the start of each series in it; a step is a row, so the differences follow time only when
    each series is in time order on its grid. A series of `season_length` points or fewer is
    scaled by its one-step differences, or has no scale with `seasonal_only`. NaN where there
    is no scale: no difference between two observed values, or differences that are rounding
    of the series' level (a history that repeats itself, `_with_scale`). The one definition
    behind the metric (`mase_scale`, `mase_scales`) and the training loss unit
    (`forecaster.windows.series_scales`).
    """
    values = np.asarray(values, dtype=np.float64)
    n_series = len(offsets) - 1
    lengths = np.diff(offsets)
    codes = np.repeat(np.arange(n_series), lengths)  # (T,) the series of each step
    seasonal = lengths > season_length
    lag = np.where(seasonal, season_length, 1)[codes]  # (T,) its series' lag
    steps = np.arange(len(values))
    has_earlier = steps - offsets[codes] >= lag
    earlier = np.where(has_earlier, steps - lag, 0)
    change = np.abs(values - values[earlier])
    valid = has_earlier & ~np.isnan(change)
    if seasonal_only:
        valid &= seasonal[codes]
    count = np.bincount(codes, weights=valid, minlength=n_series)
    total = np.bincount(codes, weights=np.where(valid, change, 0.0), minlength=n_series)
    observed = ~np.isnan(values)
    level = np.bincount(
        codes, weights=np.where(observed, np.abs(values), 0.0), minlength=n_series
    ) / np.maximum(np.bincount(codes, weights=observed, minlength=n_series), 1)
    scale = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return _with_scale(scale, level)


# A seasonal-naive error below this share of the level is float rounding of a history that
# repeats itself exactly (4.7e-10 on a level of 1e6), not a scale: dividing by it gave MASE 2e9.
_ROUNDING = 1e-12


def _with_scale(scale: np.ndarray, level: np.ndarray) -> np.ndarray:
    """`scale` where it is one, NaN where it is 0, NaN or rounding of `level`."""
    return np.where(scale > _ROUNDING * level, scale, np.nan)


def mase(y: np.ndarray, y_hat: np.ndarray, y_insample: np.ndarray, season_length: int) -> float:
    """Mean absolute scaled error of one series: MAE / in-sample seasonal-naive MAE.

    NaN when the scale is zero or undefined (see `mase_scale`) rather than a division by zero.
    """
    if season_length < 1:
        raise InvalidConfigError(
            f"season_length: expected >= 1, got {season_length}", field="season_length"
        )
    scale = mase_scale(y_insample, season_length)
    if np.isnan(scale):
        return float("nan")
    return mae(y, y_hat) / scale


def pinball_loss(y: np.ndarray, q_pred: np.ndarray, quantiles: Sequence[float]) -> float:
    """Mean quantile (pinball) loss over points and quantiles; `q_pred`'s last axis is quantile."""
    y = np.asarray(y, dtype=np.float64)
    q_pred = np.asarray(q_pred, dtype=np.float64)
    levels = np.asarray(quantiles, dtype=np.float64)
    if q_pred.shape != (*y.shape, levels.size):
        raise InvalidConfigError(
            f"q_pred: expected shape {(*y.shape, levels.size)}, got {q_pred.shape}",
            field="q_pred",
        )
    diff = y[..., None] - q_pred
    return _mean(np.maximum(levels * diff, (levels - 1.0) * diff))


def coverage(y: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> float:
    """Share of observed points inside [lower, upper]."""
    y, lower = _pair(y, lower)
    _, upper = _pair(y, upper)
    inside = ((y >= lower) & (y <= upper)).astype(np.float64)
    return _mean(np.where(np.isnan(y), np.nan, inside))


def coverage_by_history(
    y: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    history: np.ndarray,
    context_length: int,
) -> dict[str, dict[str, float]]:
    """Share of points inside [lower, upper] per band of history (`HISTORY_BANDS`, what the
    intervals are calibrated by): y, lower and upper (S, H), history (S,) each series' points
    before its forecast. Bands no series falls in are left out."""
    seen = np.minimum(np.asarray(history), context_length)
    band = np.searchsorted(np.array(HISTORY_EDGES) * context_length, seen, side="left")  # (S,)
    return {
        name: {
            "series": int((band == b).sum()),
            "coverage": coverage(y[band == b], lower[band == b], upper[band == b]),
        }
        for b, name in enumerate(HISTORY_BANDS)
        if (band == b).any()
    }


def quantiles_in(frame: pd.DataFrame) -> list[float]:
    """Quantile levels of the `q...` columns of a forecast frame, in increasing order."""
    levels = []
    for column in map(str, frame.columns):
        if column.startswith("q"):
            try:
                level = float(column[1:])
            except ValueError:
                continue
            if 0 < level < 1 and quantile_column(level) == column:
                levels.append(level)
    return sorted(levels)


def evaluate(
    forecasts: pd.DataFrame,
    history: pd.DataFrame,
    season_length: int,
    quantiles: Sequence[float] | None = None,
) -> dict[str, float]:
    """All metrics of a forecast frame (`unique_id`, `ds`, `y`, `mean`, quantile columns).

    MASE is computed per series, scaled by the seasonal-naive MAE of that series' `history`
    before its first forecast timestamp, then averaged over series with a defined scale.
    Pinball loss averages over the quantile columns; coverage uses the outermost quantile pair,
    e.g. q0.1 and q0.9 give "coverage_80". `quantiles=None` takes every `q...` column.
    """
    needed = [ID, TIME, TARGET, "mean"]
    levels = quantiles_in(forecasts) if quantiles is None else sorted(map(float, quantiles))
    q_columns = [quantile_column(q) for q in levels]
    missing = [c for c in needed + q_columns if c not in forecasts.columns]
    if missing:
        raise MissingColumnsError(
            f"forecasts: missing columns {missing}; present: {list(map(str, forecasts.columns))}",
            field=missing[0],
        )
    if len(forecasts) == 0:
        raise EmptyDataError("forecasts: no rows to evaluate")
    y = forecasts[TARGET].to_numpy(dtype=np.float64)
    y_hat = forecasts["mean"].to_numpy(dtype=np.float64)
    result = {
        "mae": mae(y, y_hat),
        "mse": mse(y, y_hat),
        "rmse": rmse(y, y_hat),
        "smape": smape(y, y_hat),
        "mase": _mean_mase(forecasts, history, season_length),
    }
    if levels:
        q_pred = forecasts[q_columns].to_numpy(dtype=np.float64)
        result["pinball"] = pinball_loss(y, q_pred, levels)
    if len(levels) >= 2:
        level = round((levels[-1] - levels[0]) * 100, 6)
        result[f"coverage_{level:g}"] = coverage(y, q_pred[:, 0], q_pred[:, -1])
    return result


def _mean_mase(forecasts: pd.DataFrame, history: pd.DataFrame, season_length: int) -> float:
    values = metric_by_group(forecasts, history, season_length, "mase").to_numpy()
    return float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")


def mase_scales(
    forecasts: pd.DataFrame,
    history: pd.DataFrame,
    season_length: int,
    seasonal_only: bool = False,
) -> np.ndarray:
    """Per forecast row: the in-sample seasonal-naive MAE of its series (NaN: no scale).

    The in-sample part of a series is its `history` before its first forecast timestamp. A
    series too short for a seasonal difference is scaled by its lag-1 differences, as in
    `mase_scale`, or has no scale with `seasonal_only` (a figure compared with seasonal ones).
    """
    missing = [c for c in (ID, TIME, TARGET) if c not in history.columns]
    if missing:
        raise MissingColumnsError(
            f"history: missing columns {missing}; present: {list(map(str, history.columns))}",
            field=missing[0],
        )
    # Series as integer codes (ids compared as text, as everywhere): hashing and sorting
    # Python strings cost most of a monitoring run over tens of millions of logged rows.
    hist_codes, series = pd.factorize(history[ID].astype("str"))
    hist_times = history[TIME].to_numpy(dtype="datetime64[ns]")
    # Lags are rows: each series in time order (a missing timestamp is a NaN row in
    # validated frames, so a row is a step).
    order = np.lexsort((hist_times, hist_codes))
    return coded_mase_scales(
        series.get_indexer(forecasts[ID].astype("str")),
        forecasts[TIME].to_numpy(dtype="datetime64[ns]"),
        hist_codes[order],
        hist_times[order],
        history[TARGET].to_numpy(np.float64)[order],
        len(series),
        season_length,
        seasonal_only,
    )


def coded_mase_scales(
    codes: np.ndarray,
    times: np.ndarray,
    hist_codes: np.ndarray,
    hist_times: np.ndarray,
    hist_values: np.ndarray,
    n_series: int,
    season_length: int,
    seasonal_only: bool = False,
) -> np.ndarray:
    """`mase_scales` with the series as integer codes in [0, n_series) (-1: none), for a
    caller that scales several sets of forecasts against one history.

    `codes` and `times` (datetime64[ns]) are the forecast rows'; `hist_codes`, `hist_times`
    and `hist_values` the history's rows, sorted by series and, within each, by time.
    """
    nat = np.iinfo(np.int64).min
    first = np.full(n_series + 1, np.iinfo(np.int64).max)  # the last slot takes the -1s
    np.minimum.at(first, codes, times.view(np.int64))
    first[first == np.iinfo(np.int64).max] = nat  # never forecast: no history time precedes it
    hist_times = hist_times.view(np.int64)
    # A series never forecast keeps nothing; neither do missing ids and times (NaT).
    keep = (hist_times < first[hist_codes]) & (hist_codes >= 0) & (hist_times != nat)
    kept_codes = hist_codes[keep]
    if not len(kept_codes):
        return np.full(len(codes), np.nan)
    starts = np.flatnonzero(np.r_[True, kept_codes[1:] != kept_codes[:-1]])
    offsets = np.append(starts, len(kept_codes))
    scales = panel_mase_scales(hist_values[keep], offsets, season_length, seasonal_only)
    by_code = np.full(n_series + 1, np.nan)
    by_code[kept_codes[starts]] = scales
    return by_code[codes]


def metric_by_group(
    forecasts: pd.DataFrame,
    history: pd.DataFrame,
    season_length: int,
    metric: str,
    by: Sequence[str] = (ID,),
) -> pd.Series:
    """One metric per group of forecast rows: per series by default, or per (series, cutoff).

    The values behind `evaluate`'s averages, for paired comparisons of two models on the same
    windows (pipelines.promote). MASE scales every row by its series' in-sample scale.
    """
    y = forecasts[TARGET].to_numpy(np.float64)
    error = y - forecasts["mean"].to_numpy(np.float64)
    if metric in ("mae", "mase"):
        values = np.abs(error)
        if metric == "mase":
            values = values / mase_scales(forecasts, history, season_length)
    elif metric in ("mse", "rmse"):
        values = error**2
    elif metric == "smape":
        values = _smape_terms(y, forecasts["mean"].to_numpy(np.float64))
    elif metric == "pinball":
        levels = quantiles_in(forecasts)
        if not levels:
            raise MissingColumnsError("forecasts: no quantile columns for pinball", field="q")
        diff = y[:, None] - forecasts[[quantile_column(q) for q in levels]].to_numpy(np.float64)
        tau = np.asarray(levels)[None, :]
        values = np.maximum(tau * diff, (tau - 1) * diff).mean(axis=1)
    else:
        raise InvalidConfigError(
            f"metric: expected one of mae, mse, rmse, smape, mase, pinball; got {metric!r}",
            field="metric",
        )
    keys = [
        forecasts[column].astype("str").to_numpy() if column == ID else forecasts[column].to_numpy()
        for column in by
    ]
    grouped = pd.Series(values).groupby(keys, sort=False).mean()
    return (np.sqrt(grouped) if metric == "rmse" else grouped).rename(metric)
