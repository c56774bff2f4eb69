"""`Forecaster`: the high-level API over the patch Transformer.

model = Forecaster(ModelConfig(context_length=336, prediction_length=96))
model.fit(train_df)                       # long frame: unique_id, ds, y (+ covariates)
forecast = model.predict(history_df)      # unique_id, ds, mean, q0.1, q0.5, q0.9
model.save("model/"); Forecaster.load("model/")
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file, save_file

from forecaster.config import ModelConfig, TrainConfig, config_from_dict, config_to_dict
from forecaster.data import quantile_column
from forecaster.errors import HorizonTooLongError, UnknownQuantileError
from forecaster.model import PatchTransformer
from forecaster.outputs import AttentionMaps, ModelOutput
from forecaster.scaling import SeriesScaler
from forecaster.training import (
    EpochLog,
    TrainResult,
    evenly_spaced,
    resolve_device,
    seed_everything,
    train_model,
)
from forecaster.validation import ValidatedFrame, validate_future_frame, validate_long_frame
from forecaster.windows import SeriesPanel, covariate_matrix, gather_windows

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
CONFIG_FILE, WEIGHTS_FILE, SCALER_FILE = "config.json", "model.safetensors", "scaler.json"
# Share of each series held out for early stopping when fit() gets no validation frame.
AUTO_VALIDATION_FRACTION = 0.15


@dataclass(frozen=True)
class WindowForecasts:
    """Forecasts for every stride-1 window of a frame (W windows, H horizon, Q quantiles)."""

    series_ids: np.ndarray  # (W,) the series each window belongs to
    target: np.ndarray  # (W, H) actual values
    mean: np.ndarray  # (W, H)
    quantiles: np.ndarray | None  # (W, H, Q)


@dataclass
class _Prepared:
    """Model inputs for the last context window of each series of a validated frame."""

    series_ids: list[str]
    last_timestamps: pd.Series  # per series
    past_values: torch.Tensor  # (S, L) scaled
    past_covariates: torch.Tensor | None  # (S, L, F)
    future_covariates: torch.Tensor | None  # (S, H, F)
    means: np.ndarray  # (S,) scaler mean per series
    stds: np.ndarray  # (S,)
    context_starts: pd.Series  # per series, first timestamp of the context window
    future_timestamps: np.ndarray  # (S, H) datetime64, the steps after each series' end


class Forecaster:
    """Fit, predict, backtest, explain, save and load the patch Transformer."""

    def __init__(
        self, model_config: ModelConfig | None = None, train_config: TrainConfig | None = None
    ):
        self.model_config = model_config or ModelConfig()
        self.train_config = train_config or TrainConfig()
        self.device = resolve_device(self.train_config.device)
        self.model: PatchTransformer | None = None
        self.scaler: SeriesScaler | None = None
        self.freq: str | None = None
        self.train_result: TrainResult | None = None

    # -- properties the pipelines and the service rely on -------------------------------
    @property
    def quantiles(self) -> tuple[float, ...]:
        return self.model_config.quantiles

    @property
    def min_history(self) -> int:
        """Points of history a series needs for a forecast."""
        return self.model_config.context_length

    @property
    def max_horizon(self) -> int:
        return self.model_config.prediction_length

    @property
    def is_fitted(self) -> bool:
        return self.model is not None

    # -- training -------------------------------------------------------------------------
    def fit(
        self,
        df: pd.DataFrame,
        val_df: pd.DataFrame | None = None,
        callbacks: Sequence[Callable[[EpochLog], None]] = (),
    ) -> Forecaster:
        """Train on every window of `df`; early-stop on `val_df` (else on a held-out tail).

        `val_df` holds each series' validation points preceded by at least context_length
        points of history, as `forecaster.data.time_split` produces.
        """
        mc = self.model_config
        window = mc.context_length + mc.prediction_length
        train = validate_long_frame(df, covariates=mc.covariates, min_length=window)
        self.freq = train.freq
        train_frame = train.frame
        if val_df is not None:
            val_frame = validate_long_frame(
                val_df, covariates=mc.covariates, min_length=window, freq=self.freq
            ).frame
        else:
            train_frame, val_frame = _hold_out_tail(train_frame, window, mc.prediction_length)

        self.scaler = SeriesScaler.fit(
            train_frame["unique_id"].to_numpy(), train_frame["y"].to_numpy()
        )
        train_panel = SeriesPanel.from_frame(train_frame, mc, self.scaler)
        val_panel = (
            SeriesPanel.from_frame(val_frame, mc, self.scaler) if val_frame is not None else None
        )
        seed_everything(self.train_config.seed)
        self.model = PatchTransformer(mc)
        self.train_result = train_model(
            self.model, train_panel, val_panel, self.train_config, callbacks
        )
        self.device = next(self.model.parameters()).device
        return self

    # -- inference ------------------------------------------------------------------------
    def predict(
        self,
        df: pd.DataFrame,
        horizon: int | None = None,
        quantiles: Sequence[float] | None = None,
        future_df: pd.DataFrame | None = None,
    ) -> pd.DataFrame:
        """Forecast the next `horizon` steps after the end of each series in `df`.

        Returns a long frame `unique_id, ds, mean` plus one column per quantile (`q0.1`, ...).
        One forward pass per `predict_batch_size` series, under `torch.inference_mode`.
        """
        horizon = self._check_horizon(horizon)
        quantiles = self._check_quantiles(quantiles)
        prepared = self._prepare(df, future_df, horizon)
        mean, q = self._forward_batches(prepared)
        return self._to_frame(
            prepared, mean[:, :horizon], None if q is None else q[:, :horizon], quantiles, horizon
        )

    def attention(self, df: pd.DataFrame, future_df: pd.DataFrame | None = None) -> AttentionMaps:
        """Attention weights behind the forecast of each series of `df` (see AttentionMaps)."""
        model = self._require_model()
        prepared = self._prepare(df, future_df, self.max_horizon)
        with torch.inference_mode():
            _, attention = model(
                prepared.past_values.to(self.device),
                _to(prepared.past_covariates, self.device),
                _to(prepared.future_covariates, self.device),
                return_attention=True,
            )

        def arrays(layers: list[torch.Tensor]) -> list[np.ndarray]:
            return [w.float().cpu().numpy() for w in layers]

        return AttentionMaps(
            series_ids=prepared.series_ids,
            encoder=arrays(attention.encoder),
            decoder_self=arrays(attention.decoder_self),
            cross=arrays(attention.cross),
            context_starts=[ts.isoformat() for ts in prepared.context_starts],
            patch_length=self.model_config.patch_length,
            patch_stride=self.model_config.patch_stride,
        )

    def backtest(
        self,
        df: pd.DataFrame,
        n_windows: int = 3,
        step: int | None = None,
        horizon: int | None = None,
    ):
        """Rolling-origin backtest; see `forecaster.backtest.backtest`."""
        from forecaster.backtest import backtest

        return backtest(
            self,
            df,
            n_windows=n_windows,
            step=step,
            horizon=horizon,
            covariates=self.model_config.covariates,
        )

    def forecast_windows(self, df: pd.DataFrame, max_windows: int = 0) -> WindowForecasts:
        """Forecast every stride-1 window (context + full horizon) inside each series of `df`.

        This is how the long-term forecasting benchmarks score a test split: no window dropped.
        `max_windows` > 0 keeps that many evenly spaced windows instead.
        """
        self._require_model()
        mc = self.model_config
        frame = validate_long_frame(
            df,
            covariates=mc.covariates,
            min_length=mc.context_length + mc.prediction_length,
            freq=self.freq,
        ).frame
        panel = SeriesPanel.from_frame(frame, mc, self.scaler)
        starts = panel.window_starts(mc.context_length + mc.prediction_length)
        starts = evenly_spaced(starts, max_windows)
        series_of_window = np.searchsorted(panel.offsets, starts, side="right") - 1
        ids = np.asarray(panel.series_ids)[series_of_window]
        means, stds = self._series_stats(panel.series_ids, frame)
        scale = stds[series_of_window][:, None]
        shift = means[series_of_window][:, None]
        targets, mean_parts, q_parts = [], [], []
        with torch.inference_mode():
            for begin in range(0, len(starts), self.train_config.predict_batch_size):
                chunk = starts[begin : begin + self.train_config.predict_batch_size]
                batch = gather_windows(panel, chunk, mc.context_length, mc.prediction_length)
                output = self._forward(
                    batch.past_values, batch.past_covariates, batch.future_covariates
                )
                targets.append(batch.future_values.numpy())
                mean_parts.append(output.mean.float().cpu().numpy())
                if output.quantiles is not None:
                    q_parts.append(output.quantiles.float().cpu().numpy())
        target = np.concatenate(targets) * scale + shift
        mean = np.concatenate(mean_parts) * scale + shift
        quantiles = (
            np.concatenate(q_parts) * scale[..., None] + shift[..., None] if q_parts else None
        )
        return WindowForecasts(ids, target, mean, quantiles)

    # -- persistence ----------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write config.json, scaler.json and model.safetensors into directory `path`."""
        model = self._require_model()
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(state, path / WEIGHTS_FILE)
        (path / SCALER_FILE).write_text(json.dumps(self.scaler.to_dict()))
        training = None
        if self.train_result is not None:
            r = self.train_result
            training = {
                "best_epoch": r.best_epoch,
                "best_val_loss": r.best_val_loss,
                "seconds": r.seconds,
                "device": r.device,
                "epochs": len(r.epochs),
            }
        meta = {
            "format_version": FORMAT_VERSION,
            "model_config": config_to_dict(self.model_config),
            "train_config": config_to_dict(self.train_config),
            "freq": self.freq,
            "training": training,
            "torch_version": torch.__version__,
        }
        (path / CONFIG_FILE).write_text(json.dumps(meta, indent=2))
        return path

    @classmethod
    def load(cls, path: str | Path, device: str | None = None) -> Forecaster:
        """Load a saved model. Reads JSON and safetensors only: nothing is unpickled."""
        path = Path(path)
        meta = json.loads((path / CONFIG_FILE).read_text())
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{path / CONFIG_FILE}: expected format_version {FORMAT_VERSION}, got {meta.get('format_version')!r}"
            )
        train_values = dict(meta["train_config"])
        if device is not None:
            train_values["device"] = device
        forecaster = cls(
            config_from_dict(ModelConfig, meta["model_config"]),
            config_from_dict(TrainConfig, train_values),
        )
        forecaster.freq = meta["freq"]
        forecaster.scaler = SeriesScaler.from_dict(json.loads((path / SCALER_FILE).read_text()))
        model = PatchTransformer(forecaster.model_config)
        model.load_state_dict(load_file(path / WEIGHTS_FILE))
        forecaster.model = model.to(forecaster.device).eval()
        return forecaster

    # -- internals ------------------------------------------------------------------------
    def _require_model(self) -> PatchTransformer:
        if self.model is None:
            raise RuntimeError(
                "the Forecaster is not fitted: call fit() or Forecaster.load() first"
            )
        return self.model

    def _check_horizon(self, horizon: int | None) -> int:
        if horizon is None:
            return self.max_horizon
        if not isinstance(horizon, int | np.integer) or not 1 <= horizon <= self.max_horizon:
            raise HorizonTooLongError(
                f"horizon: expected an integer between 1 and {self.max_horizon} (the model's "
                f"prediction_length), got {horizon!r}",
                field="horizon",
            )
        return int(horizon)

    def _check_quantiles(self, quantiles: Sequence[float] | None) -> tuple[float, ...]:
        if quantiles is None:
            return self.quantiles
        # Each requested level mapped to the trained one it equals (up to float noise).
        matched = [
            next((k for k in self.quantiles if abs(float(q) - k) < 1e-9), None) for q in quantiles
        ]
        unknown = [q for q, k in zip(quantiles, matched, strict=True) if k is None]
        if unknown:
            raise UnknownQuantileError(
                f"quantiles: expected a subset of {list(self.quantiles)}, got unknown {unknown}",
                field="quantiles",
            )
        return tuple(matched)

    def _series_stats(
        self, series_ids: Sequence[str], frame: pd.DataFrame
    ) -> tuple[np.ndarray, np.ndarray]:
        values = frame["y"].to_numpy(dtype=np.float64)
        ids = frame["unique_id"].to_numpy()
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        ends = np.r_[starts[1:], len(ids)]
        stats = [
            self.scaler.stats_for(sid, values[s:e])
            for sid, s, e in zip(series_ids, starts, ends, strict=True)
        ]
        return np.array([m for m, _ in stats]), np.array([s for _, s in stats])

    def _prepare(self, df: pd.DataFrame, future_df: pd.DataFrame | None, horizon: int) -> _Prepared:
        self._require_model()
        mc = self.model_config
        validated: ValidatedFrame = validate_long_frame(
            df, covariates=mc.covariates, min_length=mc.context_length, freq=self.freq
        )
        frame = validated.frame
        ids = frame["unique_id"].to_numpy()
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        ends = np.r_[starts[1:], len(ids)]
        series_ids = [str(ids[s]) for s in starts]
        means, stds = self._series_stats(series_ids, frame)
        context_index = ends[:, None] - mc.context_length + np.arange(mc.context_length)  # (S, L)
        y = frame["y"].to_numpy(dtype=np.float64)
        past_values = (y[context_index] - means[:, None]) / stds[:, None]
        timestamps = frame["ds"]
        last_timestamps = timestamps.iloc[ends - 1].reset_index(drop=True)
        future_ds = _future_timestamps(last_timestamps, self.freq, mc.prediction_length)  # (S, H)

        past_cov = future_cov = None
        if mc.n_covariates:
            past_cov = torch.from_numpy(covariate_matrix(frame, mc)[context_index])
            future_frame = pd.DataFrame(
                {"unique_id": np.repeat(series_ids, mc.prediction_length), "ds": future_ds.ravel()}
            )
            if mc.covariates:
                given = validate_future_frame(
                    future_df, history=validated, horizon=horizon, covariates=mc.covariates
                )
                future_frame = future_frame.merge(given, on=["unique_id", "ds"], how="left")
                # Beyond the requested horizon the model still reads H steps: hold the last value.
                future_frame[list(mc.covariates)] = future_frame.groupby("unique_id")[
                    list(mc.covariates)
                ].ffill()
            cov = covariate_matrix(future_frame, mc)
            future_cov = torch.from_numpy(cov.reshape(len(series_ids), mc.prediction_length, -1))
        return _Prepared(
            series_ids=series_ids,
            last_timestamps=last_timestamps,
            past_values=torch.from_numpy(past_values.astype(np.float32)),
            past_covariates=past_cov,
            future_covariates=future_cov,
            means=means,
            stds=stds,
            context_starts=timestamps.iloc[ends - mc.context_length].reset_index(drop=True),
            future_timestamps=future_ds,
        )

    def _forward(
        self,
        past_values: torch.Tensor,
        past_cov: torch.Tensor | None,
        future_cov: torch.Tensor | None,
    ) -> ModelOutput:
        model = self._require_model()
        model.eval()
        autocast = self.device.type == "cuda" and self.train_config.bf16
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            output, _ = model(
                past_values.to(self.device),
                _to(past_cov, self.device),
                _to(future_cov, self.device),
            )
        return output

    def _forward_batches(self, prepared: _Prepared) -> tuple[np.ndarray, np.ndarray | None]:
        """One forward pass per batch of series; returns unscaled mean (S, H) and quantiles (S, H, Q)."""
        batch_size = self.train_config.predict_batch_size
        n = len(prepared.series_ids)
        means, quantiles = [], []
        with torch.inference_mode():
            for begin in range(0, n, batch_size):
                sl = slice(begin, begin + batch_size)
                output = self._forward(
                    prepared.past_values[sl],
                    None if prepared.past_covariates is None else prepared.past_covariates[sl],
                    None if prepared.future_covariates is None else prepared.future_covariates[sl],
                )
                means.append(output.mean.float().cpu().numpy())
                if output.quantiles is not None:
                    quantiles.append(output.quantiles.float().cpu().numpy())
        scale, shift = prepared.stds[:, None], prepared.means[:, None]
        mean = np.concatenate(means) * scale + shift
        q = np.concatenate(quantiles) * scale[..., None] + shift[..., None] if quantiles else None
        return mean, q

    def _to_frame(
        self,
        prepared: _Prepared,
        mean: np.ndarray,
        q: np.ndarray | None,
        quantiles: tuple[float, ...],
        horizon: int,
    ) -> pd.DataFrame:
        n = len(prepared.series_ids)
        ds = prepared.future_timestamps[:, :horizon]
        out = {
            "unique_id": np.repeat(np.asarray(prepared.series_ids, dtype=object), horizon),
            "ds": ds.ravel(),
            "mean": mean.reshape(n * horizon),
        }
        for quantile in quantiles:
            column = q[..., self.quantiles.index(quantile)]
            out[quantile_column(quantile)] = column.reshape(n * horizon)
        frame = pd.DataFrame(out)
        frame["unique_id"] = frame["unique_id"].astype("string")
        return frame


def _to(tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(device)


def _future_timestamps(last: pd.Series, freq: str, horizon: int) -> np.ndarray:
    """(S, horizon) datetime64 array of the steps after each series' last timestamp."""
    offset = pd.tseries.frequencies.to_offset(freq)
    last_values = pd.DatetimeIndex(last)
    if isinstance(offset, pd.Timedelta | pd.tseries.offsets.Tick):
        step = pd.Timedelta(offset).to_timedelta64()
        return last_values.values[:, None] + step * np.arange(1, horizon + 1)
    # Calendar frequencies (month starts, business days) are not fixed durations.
    return np.stack(
        [pd.date_range(t, periods=horizon + 1, freq=offset)[1:].values for t in last_values]
    )


def _hold_out_tail(
    frame: pd.DataFrame, window: int, prediction_length: int
) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """Split each series' last AUTO_VALIDATION_FRACTION (at least one horizon) for validation.

    The validation part keeps `window - prediction_length` points of history before it. Series
    too short to give both a training and a validation window stay whole in training; with no
    validation windows at all, training runs without early stopping.
    """
    lengths = frame.groupby("unique_id", sort=False).size()
    val_points = np.maximum(prediction_length, (lengths * AUTO_VALIDATION_FRACTION).astype(int))
    train_points = lengths - val_points
    can_split = train_points >= window
    if not can_split.any():
        logger.warning("series too short for a validation split: training without early stopping")
        return frame, None
    position = frame.groupby("unique_id", sort=False).cumcount().to_numpy()
    per_row_train = frame["unique_id"].map(train_points.where(can_split, lengths)).to_numpy()
    context = window - prediction_length
    train = frame[position < per_row_train]
    val_rows = frame["unique_id"].map(can_split).to_numpy() & (position >= per_row_train - context)
    return train.reset_index(drop=True), frame[val_rows].reset_index(drop=True)
