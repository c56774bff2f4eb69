"""Evaluate: rolling-origin backtest of the model beside seasonal naive, logged to MLflow.

Logged to the run: ``backtest_<metric>`` and ``baseline_<metric>`` for MAE, MSE, RMSE, MASE,
sMAPE, pinball loss and interval coverage; ``attention_earned_<kind>`` for the encoder's
self-attention, the decoder's self-attention and the cross-attention, the relative rise of
the backtest MASE when that attention is made uniform (``forecaster.explain``: about 0 means
the model's attention earns nothing on this data); ``evaluation/metrics.csv`` (and the same
table for the UI's artifact viewer as JSON); ``plots/forecast.png`` (the last backtest window:
history, actuals, the forecast and its quantile band for a few series) and
``plots/attention.png`` (the attention maps behind one of those forecasts).
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from forecaster import Forecaster
from forecaster.backtest import BacktestResult, backtest
from forecaster.baselines import SeasonalNaive
from forecaster.explain import attention_earned
from forecaster.plotting import plot_attention, plot_forecast

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation:
    """Backtest metrics of the model and of seasonal naive over the same windows."""

    model: dict[str, float]
    baseline: dict[str, float]
    n_windows: int
    horizon: int
    forecasts: pd.DataFrame  # the model's backtest forecasts beside the truth
    # Per kind of attention, the relative rise of the MASE with it made uniform.
    attention_earned: dict[str, float] = field(default_factory=dict)
    # The model's MASE at each step ahead (monitoring compares like steps with like).
    mase_by_step: tuple[float, ...] = ()

    def table(self) -> pd.DataFrame:
        """One row per metric: model, seasonal naive, and model / naive."""
        rows = []
        for name in self.model:
            ours, naive = self.model[name], self.baseline.get(name, math.nan)
            ratio = ours / naive if naive and math.isfinite(naive) else math.nan
            rows.append({"metric": name, "model": ours, "seasonal_naive": naive, "ratio": ratio})
        return pd.DataFrame(rows)


def evaluate(
    forecaster: Forecaster,
    frame: pd.DataFrame,
    *,
    n_windows: int,
    client: MlflowClient | None = None,
    run_id: str | None = None,
    plot_series: int = 4,
) -> Evaluation:
    """Backtest ``forecaster`` and seasonal naive on the last ``n_windows`` horizons of ``frame``.

    With ``client`` and ``run_id`` the metrics, the table and the plots are logged to that run.
    """
    horizon = forecaster.max_horizon
    started = time.perf_counter()
    model_bt = forecaster.backtest(frame, n_windows=n_windows, horizon=horizon)
    naive = SeasonalNaive(
        season_length=forecaster.season_length, horizon=horizon, quantiles=forecaster.quantiles
    )
    naive.fit(frame)
    naive_bt = backtest(  # on the windows the model is scored on
        naive, frame, n_windows=n_windows, horizon=horizon, context_length=forecaster.context_length
    )
    evaluation = Evaluation(
        model=model_bt.metrics,
        baseline=naive_bt.metrics,
        n_windows=n_windows,
        horizon=horizon,
        forecasts=model_bt.forecasts,
        mase_by_step=tuple(model_bt.mase_by_step().tolist()),
        attention_earned=attention_earned(
            forecaster,
            frame,
            n_windows=n_windows,
            horizon=horizon,
            learned_mase=model_bt.metrics["mase"],
        ),
    )
    earned = ", ".join(f"{k} {v:+.1%}" for k, v in evaluation.attention_earned.items())
    logger.info(
        "backtest over %d window(s) of %d steps in %.1fs:\n%s\nMASE with each attention made "
        "uniform (what it earns): %s",
        n_windows,
        horizon,
        time.perf_counter() - started,
        evaluation.table().to_string(index=False, float_format="%.4f"),
        earned,
    )
    if client is not None and run_id is not None:
        _log(evaluation, forecaster, frame, model_bt, client, run_id, plot_series)
    return evaluation


def _log(
    evaluation: Evaluation,
    forecaster: Forecaster,
    frame: pd.DataFrame,
    model_bt: BacktestResult,
    client: MlflowClient,
    run_id: str,
    plot_series: int,
) -> None:
    now = int(time.time() * 1000)
    metrics = [
        Metric(f"{prefix}_{name}", float(value), now, 0)
        for prefix, values in (
            ("backtest", evaluation.model),
            ("baseline", evaluation.baseline),
            ("attention_earned", evaluation.attention_earned),
        )
        for name, value in values.items()
        if math.isfinite(value)
    ]
    client.log_batch(run_id, metrics=metrics)
    table = evaluation.table()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        table.to_csv(tmp / "metrics.csv", index=False)
        client.log_artifact(run_id, str(tmp / "metrics.csv"), "evaluation")
        client.log_table(run_id, table, "evaluation/metrics.json")

        forecasts = model_bt.forecasts
        last_cutoff = forecasts.groupby("unique_id")["cutoff"].transform("max")
        last_window = forecasts[forecasts["cutoff"] == last_cutoff]
        cutoff_of = last_window.groupby("unique_id")["cutoff"].first()
        ids = frame["unique_id"].astype("str")
        keep = (frame["ds"] <= ids.map(cutoff_of)).to_numpy()
        history = frame[keep].reset_index(drop=True)
        shown = list(pd.unique(last_window["unique_id"].astype("str")))[:plot_series]
        plot_forecast(
            history,
            last_window.drop(columns=["y", "cutoff"]),
            tmp / "forecast.png",
            series_ids=shown,
            max_series=plot_series,
            actuals=last_window[["unique_id", "ds", "y"]],
        )
        client.log_artifact(run_id, str(tmp / "forecast.png"), "plots")
        in_first = ids == shown[0]
        one = frame[in_first & keep].reset_index(drop=True)
        # A model with known-future covariates reads them after the cutoff too.
        future = frame[in_first & ~keep] if forecaster.model_config.covariates else None
        plot_attention(forecaster.attention(one, future_df=future), tmp / "attention.png")
        client.log_artifact(run_id, str(tmp / "attention.png"), "plots")
