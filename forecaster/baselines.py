"""Baselines with the `Forecaster` interface: seasonal naive and a DLinear-style linear model.

Both take and return the product's long frames: `fit(df) -> self`,
`predict(df, horizon=None, quantiles=None, future_df=None)` returning `unique_id`, `ds`,
`mean` and one `q...` column per quantile, plus `min_history`, `max_horizon`, `freq` and
`quantiles`. Input is checked by `forecaster.validation`, never by hand here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from numpy.lib.stride_tricks import sliding_window_view

from forecaster.data import ID, TARGET, quantile_column
from forecaster.errors import (
    HorizonTooLongError,
    InvalidConfigError,
    UnknownQuantileError,
)
from forecaster.model import fill_gaps
from forecaster.time_axis import season_length as default_season_length
from forecaster.validation import (
    ValidatedFrame,
    future_grid,
    in_callers_types,
    validate_long_frame,
)

DEFAULT_QUANTILES = (0.1, 0.5, 0.9)
# Residual quantiles kept after fitting LinearBaseline; requested levels are interpolated.
_RESIDUAL_LEVELS = np.linspace(0.0, 1.0, 1001)
_MAX_RESIDUAL_WINDOWS = 50_000
# How far back (in seasons) seasonal naive looks for an observed value at a missing step's phase.
_FILL_SEASONS = 10
# Values per chunk of that look-back (bounds its memory whatever the number of series).
_FILL_CHUNK_VALUES = 1 << 22


def _check_quantiles(quantiles: Sequence[float]) -> tuple[float, ...]:
    levels = tuple(float(q) for q in quantiles)
    bad = [q for q in levels if not 0.0 < q < 1.0]
    if bad:
        raise UnknownQuantileError(
            f"quantiles: expected levels strictly between 0 and 1, got {bad}", field="quantiles"
        )
    return tuple(sorted(set(levels)))


def _last_seasons_filled(
    frame: pd.DataFrame, starts: np.ndarray, ends: np.ndarray, m: int
) -> np.ndarray:
    """(S, m): each series' last m steps, a missing step read as the model's linear start reads
    it (`fill_gaps`: the same phase one season earlier, else the last observed value).

    The rule looks back at most _FILL_SEASONS seasons; a step with no observation before it in
    that reach takes the series' next observed value. Series shorter than m are right-aligned
    (the columns before their start are not meaningful).
    """
    y = frame[TARGET].to_numpy(np.float64)
    series = frame[TARGET].groupby(frame[ID], sort=False)
    nearest = series.bfill().fillna(series.ffill()).to_numpy(np.float64)
    width = max(m, min(int((ends - starts).max()), _FILL_SEASONS * m))
    parts = []
    # In chunks of series: (S, W) at once would be 10 seasons of every series (GBs for
    # 10,000 minute-level series, whose season is 1,440 steps).
    rows = max(1, _FILL_CHUNK_VALUES // width)
    for first in range(0, len(starts), rows):
        chunk = slice(first, first + rows)
        index = ends[chunk, None] - width + np.arange(width)  # (S', W), right-aligned
        inside = index >= starts[chunk, None]
        values = y[np.maximum(index, 0)]
        observed = inside & ~np.isnan(values)
        filled = fill_gaps(
            torch.from_numpy(np.where(observed, values, 0.0)), torch.from_numpy(observed), m
        ).numpy()
        reached = np.maximum.accumulate(observed, axis=1)
        next_observed = nearest[np.maximum(index, 0)]
        parts.append(np.where(reached, filled, next_observed)[:, -m:])
    return np.concatenate(parts)


def _series_bounds(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive) row of each series of a validated frame."""
    ids = frame[ID].to_numpy()
    change = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    starts = np.r_[0, change]
    ends = np.r_[change, len(ids)]
    return starts, ends


def _output(
    df: pd.DataFrame,
    history: ValidatedFrame,
    horizon: int,
    mean: np.ndarray,
    quantiles: tuple[float, ...],
    q_values: np.ndarray | None,
) -> pd.DataFrame:
    """Long forecast frame from (S, H) means and (S, H, Q) quantiles, its ids and timestamps
    typed as in the caller's `df` (as a Forecaster's are, so either merges back on `df`)."""
    out = future_grid(history, horizon)
    out["mean"] = mean.reshape(-1)
    for j, q in enumerate(quantiles):
        out[quantile_column(q)] = q_values[:, :, j].reshape(-1)
    return in_callers_types(out, df, bool(history.wall_clock), freq=history.freq)


class SeasonalNaive:
    """Repeats each series' last season: y_hat(T + h) = y(T + h - m * ceil(h / m)).

    Quantiles: the empirical quantiles of the series' in-sample seasonal differences
    y(t) - y(t - m), widened by sqrt(k) for a step k seasons ahead (k = ceil(h / m)), as for a
    random walk over seasons. They come from the history given to `predict`.

    Args:
        season_length: m; None takes the seasonal period of the frequency inferred at `fit`
            (`forecaster.time_axis.season_length`: 24 for hourly data, 7 for daily, ...).
        horizon: the default horizon of `predict` (and `max_horizon`); None means one season.
            Any horizon can be asked of `predict`.
        quantiles: the levels `predict` returns when it is not given any.
    """

    def __init__(
        self,
        season_length: int | None = None,
        horizon: int | None = None,
        quantiles: Sequence[float] = DEFAULT_QUANTILES,
    ):
        if season_length is not None and season_length < 1:
            raise InvalidConfigError(
                f"season_length: expected >= 1, got {season_length}", field="season_length"
            )
        if horizon is not None and horizon < 1:
            raise InvalidConfigError(f"horizon: expected >= 1, got {horizon}", field="horizon")
        self.season_length = season_length
        self.horizon = horizon
        self.quantiles = _check_quantiles(quantiles)
        self.freq: str | None = None

    @property
    def _m(self) -> int:
        return self._season_for(self.freq)

    def _season_for(self, freq: str | None) -> int:
        if self.season_length is not None:
            return self.season_length
        if freq is None:
            raise InvalidConfigError(
                "season_length: not given and no frequency known yet; call fit() first",
                field="season_length",
            )
        return default_season_length(freq)

    @property
    def min_history(self) -> int:
        """Points a series needs: one (a series shorter than a season repeats what it has)."""
        return 1

    @property
    def max_horizon(self) -> int:
        return self.horizon if self.horizon is not None else self._m

    def fit(self, df: pd.DataFrame) -> SeasonalNaive:
        """Record the frequency (and the season length from it when not given)."""
        self.freq = validate_long_frame(df, allow_missing=True).freq
        return self

    def predict(
        self,
        df: pd.DataFrame,
        horizon: int | None = None,
        quantiles: Sequence[float] | None = None,
        future_df: pd.DataFrame | None = None,
    ) -> pd.DataFrame:
        """Forecast `horizon` steps after each series of `df`; `future_df` is not used."""
        freq = self.freq
        if freq is None:
            freq = validate_long_frame(df, allow_missing=True).freq
        m = self._season_for(freq)
        validated = validate_long_frame(df, min_length=1, freq=freq, allow_missing=True)
        if horizon is None:
            horizon = self.horizon if self.horizon is not None else m
        if horizon < 1:
            raise InvalidConfigError(f"horizon: expected >= 1, got {horizon}", field="horizon")
        levels = self.quantiles if quantiles is None else _check_quantiles(quantiles)

        frame = validated.frame
        starts, ends = _series_bounds(frame)
        last_season = _last_seasons_filled(frame, starts, ends, m)  # (S, m)
        steps = np.arange(horizon)
        # A series shorter than a season repeats what it has.
        back = np.minimum(m, ends - starts)[:, None]
        mean = np.take_along_axis(last_season, m - back + steps[None, :] % back, axis=1)  # (S, H)

        q_values = None
        if levels:
            y = frame[TARGET].to_numpy(np.float64)  # NaN where missing: those pairs are skipped
            codes = np.repeat(np.arange(len(starts)), ends - starts)
            position = np.arange(len(y)) - starts[codes]
            seasonal = position >= m
            residual = y[seasonal] - y[np.flatnonzero(seasonal) - m]
            per_series = (
                pd.Series(residual)
                .groupby(codes[seasonal])
                .quantile(list(levels))
                .unstack()
                .reindex(range(len(starts)))
                .fillna(0.0)
            )
            spread = per_series.to_numpy(np.float64)  # (S, Q); 0 without an observed pair
            seasons_ahead = np.sqrt(steps // m + 1.0)  # (H,)
            q_values = mean[:, :, None] + spread[:, None, :] * seasons_ahead[None, :, None]
        return _output(df, validated, horizon, mean, levels, q_values)


class LinearBaseline:
    """DLinear-style linear model on the context window, fit in closed form.

    Each window of `context_length` points is normalised (minus its last value, divided by its
    standard deviation), split into a moving-average trend and the seasonal remainder, and
    mapped to the next `prediction_length` points by one linear map per component plus a bias,
    shared across series. The maps come from ridge least squares over every stride-1 window of
    every series (accumulated in chunks, so memory does not grow with the data). Quantiles are
    the empirical quantiles of the normalised in-sample residuals per horizon step, rescaled to
    each window.

    Args:
        context_length: L, points of history each forecast reads.
        prediction_length: H, the longest horizon.
        kernel_size: width of the moving average (DLinear uses 25), capped at L.
        ridge: L2 penalty relative to the mean feature variance.
        quantiles: the levels `predict` returns when it is not given any.
    """

    def __init__(
        self,
        context_length: int,
        prediction_length: int,
        *,
        kernel_size: int = 25,
        ridge: float = 1e-4,
        quantiles: Sequence[float] = DEFAULT_QUANTILES,
    ):
        for name, value in (
            ("context_length", context_length),
            ("prediction_length", prediction_length),
            ("kernel_size", kernel_size),
        ):
            if not isinstance(value, int | np.integer) or value < 1:
                raise InvalidConfigError(f"{name}: expected an int >= 1, got {value!r}", field=name)
        if ridge < 0:
            raise InvalidConfigError(f"ridge: expected >= 0, got {ridge}", field="ridge")
        self.context_length = int(context_length)
        self.prediction_length = int(prediction_length)
        self.kernel_size = min(int(kernel_size), self.context_length)
        self.ridge = float(ridge)
        self.quantiles = _check_quantiles(quantiles)
        self.freq: str | None = None
        self.weights: np.ndarray | None = None  # (2L + 1, H)
        self.residual_quantiles: np.ndarray | None = None  # (len(_RESIDUAL_LEVELS), H)

    @property
    def min_history(self) -> int:
        return self.context_length

    @property
    def max_horizon(self) -> int:
        return self.prediction_length

    def fit(self, df: pd.DataFrame) -> LinearBaseline:
        """Fit on every window of `df`; each series needs context_length + prediction_length."""
        window = self.context_length + self.prediction_length
        validated = validate_long_frame(df, min_length=window)
        self.freq = validated.freq
        y = validated.frame[TARGET].to_numpy(np.float64)
        starts, ends = _series_bounds(validated.frame)
        window_starts = _window_starts(starts, ends, window)

        n_features = 2 * self.context_length + 1
        gram = np.zeros((n_features, n_features))
        cross = np.zeros((n_features, self.prediction_length))
        for chunk in _chunks(window_starts):
            x, target = self._design(y, chunk)
            gram += x.T @ x
            cross += x.T @ target
        penalty = self.ridge * np.trace(gram) / n_features
        regulariser = np.eye(n_features) * penalty
        regulariser[-1, -1] = 0.0  # the bias is not shrunk
        self.weights = np.linalg.solve(gram + regulariser, cross)

        # Residual quantiles from at most _MAX_RESIDUAL_WINDOWS evenly spread windows.
        keep = np.linspace(
            0, len(window_starts) - 1, min(len(window_starts), _MAX_RESIDUAL_WINDOWS)
        )
        residuals = []
        for chunk in _chunks(window_starts[keep.round().astype(np.int64)]):
            x, target = self._design(y, chunk)
            residuals.append(target - x @ self.weights)
        residuals = np.concatenate(residuals)
        self.residual_quantiles = np.quantile(residuals, _RESIDUAL_LEVELS, axis=0)
        return self

    def predict(
        self,
        df: pd.DataFrame,
        horizon: int | None = None,
        quantiles: Sequence[float] | None = None,
        future_df: pd.DataFrame | None = None,
    ) -> pd.DataFrame:
        """Forecast from the last `context_length` points of each series; `future_df` unused."""
        if self.weights is None:
            raise InvalidConfigError("LinearBaseline: call fit() before predict()", field="model")
        horizon = self.prediction_length if horizon is None else horizon
        if not 1 <= horizon <= self.prediction_length:
            raise HorizonTooLongError(
                f"horizon: expected 1..{self.prediction_length} (the prediction_length this "
                f"model was fit for), got {horizon}",
                field="horizon",
            )
        levels = self.quantiles if quantiles is None else _check_quantiles(quantiles)
        validated = validate_long_frame(df, min_length=self.context_length, freq=self.freq)
        y = validated.frame[TARGET].to_numpy(np.float64)
        _, ends = _series_bounds(validated.frame)
        context = y[ends[:, None] - self.context_length + np.arange(self.context_length)]
        features, last, scale = self._features(context)
        mean = last + scale * (features @ self.weights)  # (S, H)
        q_values = None
        if levels:
            residual = np.stack(
                [
                    np.interp(levels, _RESIDUAL_LEVELS, self.residual_quantiles[:, h])
                    for h in range(self.prediction_length)
                ]
            )  # (H, Q)
            q_values = mean[:, :, None] + scale[:, :, None] * residual[None, :, :]
            q_values = q_values[:, :horizon]
        return _output(df, validated, horizon, mean[:, :horizon], levels, q_values)

    # ----------------------------------------------------------------------------------------

    def _design(self, y: np.ndarray, window_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Features and normalised targets of the windows starting at `window_starts`."""
        length = self.context_length + self.prediction_length
        windows = y[window_starts[:, None] + np.arange(length)]
        features, last, scale = self._features(windows[:, : self.context_length])
        target = (windows[:, self.context_length :] - last) / scale
        return features, target

    def _features(self, context: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """[seasonal, trend, 1] of normalised windows, with each window's last value and scale."""
        last = context[:, -1:]
        scale = context.std(axis=1, keepdims=True)
        scale = np.where(scale > 1e-8, scale, 1.0)
        x = (context - last) / scale
        trend = _moving_average(x, self.kernel_size)
        ones = np.ones((len(x), 1))
        return np.concatenate([x - trend, trend, ones], axis=1), last, scale


def _moving_average(x: np.ndarray, kernel_size: int) -> np.ndarray:
    """Centred moving average along axis 1 with edge replication, as DLinear's decomposition."""
    left = (kernel_size - 1) // 2
    right = kernel_size - 1 - left
    padded = np.concatenate(
        [np.repeat(x[:, :1], left, axis=1), x, np.repeat(x[:, -1:], right, axis=1)], axis=1
    )
    return sliding_window_view(padded, kernel_size, axis=1).mean(axis=2)


def _window_starts(starts: np.ndarray, ends: np.ndarray, window: int) -> np.ndarray:
    """Row offsets of every stride-1 window of `window` points inside one series."""
    counts = np.maximum(ends - starts - window + 1, 0)
    first = np.repeat(starts, counts)
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    return first + within


def _chunks(values: np.ndarray, size: int = 4096):
    for i in range(0, len(values), size):
        yield values[i : i + size]


__all__ = ["DEFAULT_QUANTILES", "LinearBaseline", "SeasonalNaive"]
