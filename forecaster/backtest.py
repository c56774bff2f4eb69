"""Rolling-origin backtest for anything with the `Forecaster` predict interface.

The last window's cutoff leaves exactly `horizon` points of each series after it; each earlier
window moves the cutoff back by `step`. Every window is one batched `model.predict` call over
all series, with the history up to the cutoff and, when the model uses known-future
covariates, their values after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pandas as pd

from forecaster.data import ID, TARGET, TIME
from forecaster.errors import EmptyDataError, InvalidConfigError, SeriesTooShortError
from forecaster.metrics import evaluate, mase_scales, metric_by_group
from forecaster.time_axis import is_integer_axis, season_length
from forecaster.validation import in_callers_types, validate_long_frame


class SupportsPredict(Protocol):
    """What `backtest` needs of a model (the Forecaster and the baselines have it)."""

    @property
    def max_horizon(self) -> int: ...

    def predict(
        self,
        df: pd.DataFrame,
        horizon: int | None = None,
        quantiles: Sequence[float] | None = None,
        future_df: pd.DataFrame | None = None,
    ) -> pd.DataFrame: ...


@dataclass(frozen=True)
class BacktestResult:
    """Forecasts of every window beside the truth, and the metrics over all windows."""

    # unique_id, ds, cutoff, y, mean, q... (window by window), ids and timestamps typed as
    # in the frame given (as `predict` gives them): an aware `ds` comes back in its zone.
    forecasts: pd.DataFrame
    metrics: dict[str, float]  # metrics.evaluate over all windows
    n_windows: int
    horizon: int
    history: pd.DataFrame  # the validated frame the windows were cut from (MASE's scale)
    season_length: int  # MASE's seasonal lag
    # The rows of `forecasts` as scored, beside `history`: ids as text, timestamps naive.
    scored: pd.DataFrame = field(repr=False)

    def by_series(self, metric: str) -> pd.Series:
        """`metric` of each series over all its windows (index: series id as str)."""
        return metric_by_group(self.scored, self.history, self.season_length, metric)

    def by_window(self, metric: str) -> pd.Series:
        """`metric` of each series in each window (index: series id as str, cutoff as read
        inside: naive, on the wall clock or in UTC as the model reads `ds`)."""
        return metric_by_group(
            self.scored, self.history, self.season_length, metric, by=(ID, "cutoff")
        )

    def mase_by_step(self) -> np.ndarray:
        """(horizon,) MASE at each step ahead: the scaled errors of that step, averaged per
        series over the windows, then over the series. Errors grow with the step, so accuracy
        later measured on the first steps alone is compared with these, not the mean."""
        history = self.history
        position = pd.DataFrame(
            {
                ID: history[ID].astype("str").to_numpy(),
                TIME: history[TIME].to_numpy(),
                "at": history.groupby(ID, sort=False).cumcount().to_numpy(),
            }
        )
        rows = self.scored[[ID, TIME, "cutoff"]]
        at = rows.merge(position, on=[ID, TIME], how="left")["at"].to_numpy()
        origin = rows.merge(
            position.rename(columns={TIME: "cutoff", "at": "origin"}), on=[ID, "cutoff"], how="left"
        )["origin"].to_numpy()
        scale = mase_scales(self.scored, history, self.season_length)
        error = np.abs(self.scored[TARGET] - self.scored["mean"]).to_numpy() / scale
        frame = pd.DataFrame({ID: rows[ID].to_numpy(), "step": at - origin, "error": error})
        per_series = frame.groupby(["step", ID])["error"].mean()
        by_step = per_series.groupby(level="step").mean()
        return by_step.reindex(np.arange(1, self.horizon + 1)).to_numpy(dtype=np.float64)


def backtest(
    model: SupportsPredict,
    df: pd.DataFrame,
    *,
    n_windows: int = 3,
    step: int | None = None,
    horizon: int | None = None,
    quantiles: Sequence[float] | None = None,
    covariates: Sequence[str] | None = None,
    context_length: int | None = None,
) -> BacktestResult:
    """Score `model` on `n_windows` rolling origins at the end of each series of `df`.

    Args:
        model: anything with `predict(df, horizon, quantiles, future_df)` and `max_horizon`;
            its `min_history` and `freq`, when present, set the history each window needs and
            the frequency `df` must have.
        df: long frame with the full series (history and the points to score).
        n_windows: number of forecast origins.
        step: points between consecutive origins; defaults to `horizon` (no overlap).
        horizon: points forecast per window; defaults to `model.max_horizon`.
        quantiles: passed to `predict`; None lets the model use its own.
        covariates: known-future covariate columns of `df` the model needs; their values after
            each cutoff are passed as `future_df`. None: the model's own `covariates`, when
            it has them (a fitted Forecaster does), else none.
        context_length: steps before each cutoff a series needs an observed value in to be
            scored in that window; None: the model's own `context_length` (a series the
            Forecaster cannot read there is left out of the window), else every series is
            scored. A baseline scored beside a Forecaster takes the Forecaster's, so that both
            are scored on the same windows.

    Raises:
        SeriesTooShortError: a series cannot hold every window after `model.min_history`
            points of history; and any error of `validate_long_frame` for bad data.
    """
    horizon = model.max_horizon if horizon is None else horizon
    step = horizon if step is None else step
    for name, value in (("horizon", horizon), ("step", step), ("n_windows", n_windows)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise InvalidConfigError(f"{name}: expected an int >= 1, got {value!r}", field=name)
    horizon, step = int(horizon), int(step)
    covariates = list(getattr(model, "covariates", ()) if covariates is None else covariates)
    min_history = int(getattr(model, "min_history", 1) or 1)
    required = min_history + horizon + (n_windows - 1) * step
    try:
        validated = validate_long_frame(
            df,
            covariates=covariates,
            min_length=required,
            freq=getattr(model, "freq", None),
            allow_missing=True,
            wall_clock=getattr(model, "wall_clock", None),
        )
    except SeriesTooShortError as exc:
        raise SeriesTooShortError(
            f"{exc.message}: {n_windows} backtest window(s) of horizon {horizon} every {step} "
            f"step(s) after the model's min_history of {min_history} points",
            series_id=exc.series_id,
            field=exc.field,
        ) from None

    frame = validated.frame
    if is_integer_axis(validated.freq):
        # Windows are predicted, and aligned on their truth, in the steps the model reads.
        frame = frame.assign(**{TIME: frame[TIME].to_numpy().view(np.int64)})
    ids = frame[ID].to_numpy()
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    lengths = np.diff(np.r_[starts, len(frame)])
    codes = np.repeat(np.arange(len(starts)), lengths)
    position = np.arange(len(frame)) - starts[codes]
    n = lengths[codes]
    timestamps = frame[TIME].to_numpy()

    # A series with no observed value in the context the model reads at a cut cannot be
    # forecast there (an outage longer than the context): it is left out of that window.
    reads = getattr(model, "context_length", None) if context_length is None else context_length
    observed = frame[TARGET].notna().to_numpy()
    windows = []
    for back in range(n_windows - 1, -1, -1):  # oldest origin first
        cut = n - horizon - back * step  # per row: points of history of its series
        blind = np.zeros(len(frame), dtype=bool)
        if reads is not None:
            read = observed & (position >= cut - reads) & (position < cut)
            blind = (np.bincount(codes, weights=read, minlength=len(starts)) == 0)[codes]
        history = frame[(position < cut) & ~blind].reset_index(drop=True)
        scored = (position >= cut) & (position < cut + horizon) & ~blind
        if not scored.any():
            continue
        future = frame.loc[scored, [ID, TIME, *covariates]].reset_index(drop=True)
        forecast = model.predict(
            history,
            horizon=horizon,
            quantiles=quantiles,
            future_df=future if covariates else None,
        )
        truth = frame.loc[scored, [ID, TIME, TARGET]].reset_index(drop=True)
        truth.insert(2, "cutoff", timestamps[(starts[codes] + cut - 1)[scored]])
        # Missing values are forecast but not scored.
        windows.append(_align(truth, forecast).dropna(subset=[TARGET]))
    forecasts = pd.concat(windows, ignore_index=True) if windows else pd.DataFrame()
    if forecasts.empty:
        raise EmptyDataError(
            f"backtest: no observed value to score in the last {n_windows} window(s) of "
            f"horizon {horizon}, or none the model could forecast (a context without an "
            "observed value)",
            field=TARGET,
        )
    lag = season_length(validated.freq)
    metrics = evaluate(
        forecasts.drop(columns="cutoff"), history=frame, season_length=lag, quantiles=quantiles
    )
    shown = in_callers_types(
        forecasts.copy(),
        df,
        bool(validated.wall_clock),
        time_columns=(TIME, "cutoff"),
        freq=validated.freq,
    )
    return BacktestResult(
        forecasts=shown,
        metrics=metrics,
        n_windows=n_windows,
        horizon=horizon,
        history=frame,
        season_length=lag,
        scored=forecasts,
    )


def _align(truth: pd.DataFrame, forecast: pd.DataFrame) -> pd.DataFrame:
    """Truth rows beside the model's forecast for the same series and timestamp."""
    forecast = forecast.copy()
    forecast[ID] = forecast[ID].astype("str")
    forecast[TIME] = forecast[TIME].to_numpy(dtype=truth[TIME].dtype)  # naive, or steps
    merged = truth.merge(forecast, on=[ID, TIME], how="left", validate="one_to_one")
    if merged["mean"].isna().any():
        i = int(np.argmax(merged["mean"].isna().to_numpy()))
        raise RuntimeError(
            f"model.predict returned no forecast for series {merged[ID].iat[i]!r} at "
            f"{merged[TIME].iat[i]}; expected one row per series and step after the cutoff"
        )
    return merged
