"""`Forecaster`: the high-level API over the patch Transformer.

model = Forecaster(ModelConfig(prediction_length=96))
model.fit(train_df)                       # long frame: unique_id, ds, y (+ covariates)
forecast = model.predict(history_df)      # unique_id, ds, mean, q0.1, q0.5, q0.9
model.save("model/"); Forecaster.load("model/")

Histories may be short (down to one observed value) and may have NaNs or missing timestamps:
the model reads them through its observed-value mask.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import safetensors.torch
import torch
from safetensors import SafetensorError

from forecaster.columns import ID, TARGET, TIME
from forecaster.config import (
    N_HISTORY_BANDS,
    ModelConfig,
    TrainConfig,
    config_from_dict,
    config_to_dict,
)
from forecaster.errors import (
    ForecasterInputError,
    FrequencyInferenceError,
    HorizonTooLongError,
    InvalidConfigError,
    InvalidTimestampsError,
    MissingValuesError,
    ModelCodeMismatchError,
    ModelFileError,
    SeriesTooShortError,
    TrainingDivergedError,
    UnknownQuantileError,
)
from forecaster.glitches import mask_glitches, series_glitches
from forecaster.model import PatchTransformer
from forecaster.outputs import AttentionMaps, ForecastArrays, ModelOutput, no_glitches
from forecaster.time_axis import (
    is_integer_axis,
    parse_freq,
    same_clock,
    shift,
    steps_after,
    synthetic_range,
    time_text,
    wall_clock_for,
)
from forecaster.training import (
    EpochLog,
    TrainResult,
    WindowSet,
    bf16_autocast,
    distributed_rank,
    evenly_spaced,
    resolve_device,
    seed_everything,
    train_model,
)
from forecaster.validation import (
    ValidatedFrame,
    in_callers_types,
    later_covariates,
    validate_future_frame,
    validate_long_frame,
)
from forecaster.windows import SeriesPanel, WindowBatch, covariate_matrix, gather_windows

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
# A forecast the model made when it was saved, replayed at load: code that forecasts
# differently (a changed layer, scaler or time axis) is caught before it serves.
REFERENCE_FILE = "reference.json"
REFERENCE_TOLERANCE = 1e-3  # relative to the reference forecast's magnitude
# Where the reference histories start, or the early start when their context and horizon
# would run past pandas' last timestamp (2262) from the first.
REFERENCE_START = "2020-01-06"
EARLY_REFERENCE_START = "1700-01-04"
# Share of each series held out for validation when fit() gets no validation frame.
AUTO_VALIDATION_FRACTION = 0.15


@dataclass(frozen=True)
class WindowForecasts:
    """Forecasts for every stride-1 window of a frame (W windows, H horizon, Q quantiles)."""

    series_ids: np.ndarray  # (W,) the series each window belongs to
    target: np.ndarray  # (W, H) actual values (NaN where missing)
    mean: np.ndarray  # (W, H)
    quantiles: np.ndarray | None  # (W, H, Q)


@dataclass(frozen=True)
class ModelInputs:
    """Validated model inputs for the forecast after the end of each of S series.

    What `Forecaster.prepare` returns; inputs of several requests concatenate (`concat`) into
    one forward pass, so each request is validated alone and only tensors are merged.
    Shapes use S series, L context length, H the model's horizon, F covariates.
    """

    series_ids: np.ndarray  # (S,) object, the ids as validated (text)
    past_values: torch.Tensor  # (S, L) float64, 0 where unobserved
    past_observed_mask: torch.Tensor  # (S, L) bool
    past_covariates: torch.Tensor | None  # (S, L, F)
    future_covariates: torch.Tensor | None  # (S, H, F)
    last_timestamps: np.ndarray  # (S,) datetime64[ns]
    future_timestamps: np.ndarray  # (S, H) datetime64[ns], the steps after each series' end
    # (S,) object: each series' readings read as glitches (TrainConfig.glitch_threshold), as
    # a datetime64[ns] array, mostly empty.
    glitch_timestamps: np.ndarray

    def __len__(self) -> int:
        return len(self.series_ids)

    @staticmethod
    def concat(parts: Sequence[ModelInputs]) -> ModelInputs:
        """The series of every part, in order (parts prepared by the same model)."""
        if len(parts) == 1:
            return parts[0]

        def cat(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
            return None if tensors[0] is None else torch.cat(tensors)

        return ModelInputs(
            series_ids=np.concatenate([p.series_ids for p in parts]),
            past_values=torch.cat([p.past_values for p in parts]),
            past_observed_mask=torch.cat([p.past_observed_mask for p in parts]),
            past_covariates=cat([p.past_covariates for p in parts]),
            future_covariates=cat([p.future_covariates for p in parts]),
            last_timestamps=np.concatenate([p.last_timestamps for p in parts]),
            future_timestamps=np.concatenate([p.future_timestamps for p in parts]),
            glitch_timestamps=np.concatenate([p.glitch_timestamps for p in parts]),
        )


class Forecaster:
    """Fit, predict, backtest, explain, save and load the patch Transformer."""

    def __init__(
        self, model_config: ModelConfig | None = None, train_config: TrainConfig | None = None
    ):
        for name, given, kind in (
            ("model_config", model_config, ModelConfig),
            ("train_config", train_config, TrainConfig),
        ):
            if given is not None and not isinstance(given, kind):
                raise InvalidConfigError(
                    f"{name}: expected a {kind.__name__} (or None for the defaults), got "
                    f"{type(given).__name__}; e.g. {kind.__name__}(**values) for a dict",
                    field=name,
                )
        self.model_config = model_config or ModelConfig()
        # As given: each fit resolves what it leaves None (context, patch, season) from its own
        # data (`ModelConfig.for_frequency`).
        self._given_model_config = self.model_config
        self.train_config = train_config or TrainConfig()
        self.device = resolve_device(self.train_config.device)
        self.model: PatchTransformer | None = None
        # (model, torch.compile(model)) when TrainConfig.compile: compiled once, for predict.
        self._compiled: tuple[PatchTransformer, torch.nn.Module] | None = None
        self.freq: str | None = None
        # How fit read its aware `ds` (True: on the wall clock, False: in UTC); None after a
        # fit on naive `ds`, for which the frequency decides (`wall_clock`).
        self._fitted_wall_clock: bool | None = None
        self.train_result: TrainResult | None = None
        # What config.json says of the training of a loaded model (its `train_result` stays
        # None: the path and the epochs are not saved), so that saving it again keeps it.
        self._saved_training: dict[str, Any] | None = None
        # The readings of fit's `df` that the glitch rule finds (`unique_id`, `ds`), left out
        # of training with TrainConfig.mask_training_glitches; None until fit, and after load.
        self.training_glitches: pd.DataFrame | None = None

    # -- properties the pipelines and the service rely on -------------------------------
    @property
    def quantiles(self) -> tuple[float, ...]:
        return self.model_config.quantiles

    @property
    def min_history(self) -> int:
        """Observed points of history a series needs for a forecast."""
        return 1

    @property
    def context_length(self) -> int:
        """Points of history the model reads; more are ignored, fewer are padded. Set by fit
        when the configuration leaves it to the data."""
        assert self.model_config.context_length is not None, "set by fit"
        return self.model_config.context_length

    @property
    def max_horizon(self) -> int:
        return self.model_config.prediction_length

    @property
    def season_length(self) -> int:
        """Steps per seasonal cycle the model reads: the configuration's, else the
        frequency's; the pipelines' seasonal naive repeats it. (MASE is scaled by the data's
        frequency's season, so that models of other configurations compare.)"""
        assert self.model_config.season_length is not None, "set by fit"
        return self.model_config.season_length

    @property
    def covariates(self) -> tuple[str, ...]:
        """Known-future covariate columns every forecast needs, history and future alike."""
        return self.model_config.covariates

    @property
    def wall_clock(self) -> bool:
        """Whether aware timestamps are read on their wall clock (local dates) rather than in
        UTC: as fit read its aware data, so that daily data stamped at UTC midnight in a local
        zone (01:00 in Berlin, 02:00 in summer) is forecast as it was fitted; after a fit on
        naive data, as the frequency says (`time_axis.wall_clock_for`)."""
        if self._fitted_wall_clock is not None:
            return self._fitted_wall_clock
        return bool(wall_clock_for(self.freq))

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
        """Train on every window of `df`; judge epochs on `val_df` (else on a held-out tail).

        With a held-out tail, the kept weights then train `TrainConfig.tail_epochs` more epochs
        on every window of `df`, the tail's included (not reported to `callbacks`, which see
        the judged epochs).

        `val_df` holds each series' validation points preceded by up to context_length points
        of history, as `forecaster.data.time_split` produces. Every series with at least 2
        points gives training windows (`SeriesPanel.training_origins`): a window's targets past
        its series' end are unobserved; a series of 1 point is skipped.
        With `TrainConfig.replay_lr_factors` (a refit), every window of `df` trains and
        `val_df` is not used.
        """
        mc = self._given_model_config
        train = validate_long_frame(df, covariates=mc.covariates, allow_missing=True).in_id_order()
        freq = train.freq
        mc = mc.for_frequency(freq)
        glitches = self._glitches(train, mc)
        masked = self.train_config.mask_training_glitches
        panel = SeriesPanel.from_validated(train, mc, glitches if masked else None)
        h = mc.prediction_length
        tail_set = None  # the tail epochs' windows, when fit holds out each series' tail
        if self.train_config.replay_lr_factors is not None:
            train_set, val = WindowSet(panel, panel.training_origins(h)), None
        elif val_df is not None:
            try:
                given = val_df if not isinstance(val_df, Mapping) else _frame(val_df)
                validated_val = validate_long_frame(
                    _observed_series(given) if isinstance(given, pd.DataFrame) else given,
                    covariates=mc.covariates,
                    freq=freq,
                    allow_missing=True,
                    wall_clock=train.wall_clock,
                ).in_id_order()
            except ForecasterInputError as exc:  # the training frame may hold the same ids
                raise type(exc)(
                    f"val_df: {exc.message}", series_id=exc.series_id, field=exc.field
                ) from None
            val_panel = SeriesPanel.from_validated(
                validated_val, mc, self._glitches(validated_val, mc) if masked else None
            )
            # Windows whose context is the given history and whose targets are the val points.
            history = np.minimum(mc.context_length, np.maximum(np.diff(val_panel.offsets) - h, 1))
            val = WindowSet(val_panel, val_panel.window_origins(h, min_context=history))
            if len(val.origins) == 0:
                longest = int(np.diff(val_panel.offsets).max())
                raise SeriesTooShortError(
                    f"val_df gives no validation window: expected a series with at least "
                    f"prediction_length + 1 = {h + 1} points (history, then the validation "
                    f"points, as forecaster.data.time_split makes them), the longest has {longest}",
                    field="val_df",
                )
            train_set = WindowSet(panel, panel.training_origins(h))
        else:
            train_set, val, tail_set = _hold_out_tail(panel, h)
        # The frequency is read from a series of two points at least, which gives a window.
        assert len(train_set.origins) > 0, "no training window"
        seed_everything(self.train_config.seed)
        model = PatchTransformer(mc)
        result = train_model(model, train_set, val, self.train_config, callbacks)
        tail_epochs = self.train_config.tail_epochs and result.kept_lr_factors
        if tail_set is not None and val is not None and tail_epochs:
            result = self._train_on_tail(model, tail_set, result)
        # Only a fit that ends replaces what the forecaster holds: an interrupted or failed one
        # leaves the model fitted before, or none, as it was.
        self.model_config, self.freq, self.model, self._compiled = mc, freq, model, None
        self._fitted_wall_clock = train.wall_clock
        self.train_result = dataclasses.replace(result, n_glitches=int(glitches.sum()))
        self._saved_training = None
        # In the caller's types, so that they merge back onto `df` (integer ids, a zone).
        self.training_glitches = in_callers_types(
            _rows_frame(train, glitches), _frame(df), bool(train.wall_clock), freq=freq
        )
        self.device = next(self.model.parameters()).device
        return self

    def refit_config(self) -> TrainConfig:
        """The TrainConfig that retrains this fitted model's configuration on all the data along
        the path validation kept (`replay_lr_factors`), with its interval factors, its
        reading of the left padding and its blend with drift; with no kept epoch, the linear
        start alone.

        Only the Forecaster that trained knows its path: a loaded (or unfitted) one raises,
        where it returned a configuration that trained the linear start alone, uncalibrated.
        """
        result = self.train_result
        if result is None:
            raise RuntimeError(
                "refit_config needs the path this Forecaster trained along, which only the "
                "Forecaster that ran fit() has (a loaded model keeps its weights, not its "
                "training): refit from that one, or fit this configuration anew"
            )
        return dataclasses.replace(
            self.train_config,
            replay_lr_factors=result.kept_lr_factors,
            replay_restarts=result.kept_restarts,
            max_epochs=0,
            interval_scale=result.interval_scale,
            impute_padding=result.impute_padding,
            drift_weight=result.drift_weight,
        )

    def _train_on_tail(
        self, model: PatchTransformer, windows: WindowSet, judged: TrainResult
    ) -> TrainResult:
        """Train the kept weights `tail_epochs` more epochs on `windows` (the training windows
        and the held-out tail's, `_hold_out_tail`), at the last learning rate of their path
        (the linear start too, at its own rate, as in every epoch); the quantile head and the
        interval factors stay as validation chose them. Returns
        `judged` with the tail epochs' own result in `.tail`."""
        config = self.train_config
        more = dataclasses.replace(
            config,
            replay_lr_factors=(judged.kept_lr_factors[-1],) * config.tail_epochs,
            replay_restarts=(),
            max_epochs=0,
            interval_scale=judged.interval_scale,
            impute_padding=judged.impute_padding,
            drift_weight=judged.drift_weight,
        )
        logger.info(
            "%d more epoch(s) on all %d windows, the validation tail's included",
            config.tail_epochs,
            len(windows.origins),
        )
        # The factors were calibrated for this quantile head on windows the tail epochs now
        # train on. Trained on, the head would learn the smaller in-sample errors and narrow
        # the bands below what validation measured (0.1-0.9 band on the M4 Hourly holdout:
        # 77.8 % trained, 80.3 % kept; aim 80 %).
        judged_state = {k: v.clone() for k, v in model.state_dict().items()}
        try:
            tail = train_model(
                model, windows, None, more, warm_start=True, frozen=model.quantile_head
            )
        except TrainingDivergedError as exc:
            logger.warning("%s: the weights validation judged are kept, without the tail", exc)
            model.load_state_dict(judged_state)
            return judged
        return dataclasses.replace(judged, tail=tail)

    # -- inference ------------------------------------------------------------------------
    def predict(
        self,
        df: pd.DataFrame,
        horizon: int | None = None,
        quantiles: Sequence[float] | None = None,
        future_df: pd.DataFrame | None = None,
    ) -> pd.DataFrame:
        """Forecast the next `horizon` steps after the end of each series in `df`.

        Returns a long frame `unique_id, ds, mean` plus one column per quantile (`q0.1`, ...),
        with the ids' dtype and the time zone of `df`, so it merges with the caller's data.
        One forward pass per `predict_batch_size` series, under `torch.inference_mode`.
        """
        horizon = self.check_horizon(horizon)
        levels = self.check_quantiles(quantiles)
        inputs = self.prepare(df, future_df, horizon)
        forecast = self.forecast(inputs).select(horizon, levels).to_frame()
        return in_callers_types(forecast, df, self.wall_clock, freq=self.freq)

    def prepare(
        self,
        df: pd.DataFrame | Mapping[str, np.ndarray],
        future_df: pd.DataFrame | Mapping[str, np.ndarray] | None = None,
        horizon: int | None = None,
    ) -> ModelInputs:
        """Validate a history (a long frame, or its columns as arrays) into model inputs.

        Every validation rule runs here, on this history alone; `future_df` holds the
        known-future covariates of the next `horizon` steps (models with covariates only).
        """
        self._require_model()
        horizon = self.check_horizon(horizon)
        mc = self.model_config
        validated: ValidatedFrame = validate_long_frame(
            df,
            covariates=mc.covariates,
            freq=self.freq,
            allow_missing=True,
            wall_clock=self.wall_clock,
        )
        panel = SeriesPanel.from_validated(validated, mc)
        gathered = gather_windows(panel, panel.last_origins(), mc.context_length, 0)
        batch = self._without_glitches(gathered)
        timestamps = validated.columns["ds"]
        last_timestamps = timestamps[panel.offsets[1:] - 1]
        glitches = gathered.past_observed_mask & ~batch.past_observed_mask  # (S, L)
        blind = ~batch.past_observed_mask.any(dim=1)  # (S,)
        if blind.any():
            k = int(torch.argmax(blind.to(torch.int8)))
            raise _blind_context_error(validated, k, bool(glitches[k].any()), mc.context_length)
        future_ds = steps_after(  # (S, H)
            last_timestamps, self.freq, mc.prediction_length, panel.series_ids
        )

        future_cov = None
        if mc.n_covariates:
            s = len(panel.series_ids)
            future_frame = pd.DataFrame(
                {
                    "unique_id": np.repeat(panel.series_ids, mc.prediction_length),
                    "ds": future_ds.ravel(),
                }
            )
            if mc.covariates:
                frame = None if future_df is None else _frame(future_df)
                if frame is not None and TIME in frame.columns:
                    # The column alone, of a frame or a mapping.
                    frame = frame.assign(**{TIME: same_clock(df[TIME], frame[TIME])})
                # The `horizon` steps asked for are required; the model reads H, and each
                # series' later rows, where given, beat holding its last value. Per series, so
                # that a forecast depends on no other series' rows.
                given = validate_future_frame(
                    frame, history=validated, horizon=horizon, covariates=mc.covariates
                )
                if horizon < mc.prediction_length:
                    later = later_covariates(
                        frame,
                        history=validated,
                        horizon=horizon,
                        steps=mc.prediction_length,
                        covariates=mc.covariates,
                    )
                    given = pd.concat([given, later], ignore_index=True)
                future_frame = future_frame.merge(given, on=["unique_id", "ds"], how="left")
                # Past the steps given, hold the last value.
                future_frame[list(mc.covariates)] = future_frame.groupby("unique_id")[
                    list(mc.covariates)
                ].ffill()
            cov = covariate_matrix(future_frame, mc)
            future_cov = torch.from_numpy(cov.reshape(s, mc.prediction_length, -1))
        return ModelInputs(
            series_ids=np.asarray(panel.series_ids, dtype=object),
            past_values=batch.past_values,
            past_observed_mask=batch.past_observed_mask,
            past_covariates=batch.past_covariates,
            future_covariates=future_cov,
            last_timestamps=last_timestamps,
            future_timestamps=future_ds,
            glitch_timestamps=_context_timestamps(glitches.numpy(), last_timestamps, self.freq),
        )

    def forecast(self, inputs: ModelInputs) -> ForecastArrays:
        """The model's full horizon and every quantile for prepared inputs.

        One forward pass per `predict_batch_size` series, under `torch.inference_mode`;
        `ForecastArrays.select` cuts a shorter horizon or fewer quantiles.
        """
        batch_size = self.train_config.predict_batch_size
        means, quantiles = [], []
        for begin in range(0, len(inputs), batch_size):
            sl = slice(begin, begin + batch_size)
            output = self._forward(
                inputs.past_values[sl],
                inputs.past_observed_mask[sl],
                None if inputs.past_covariates is None else inputs.past_covariates[sl],
                None if inputs.future_covariates is None else inputs.future_covariates[sl],
            )
            means.append(output.mean.numpy())
            if output.quantiles is not None:
                quantiles.append(output.quantiles.numpy())
        s, h = len(inputs), self.max_horizon
        mean = np.concatenate(means) if means else np.zeros((0, h))
        levels = self.quantiles if quantiles else ()
        q = np.concatenate(quantiles) if quantiles else np.zeros((s, h, 0))
        if not means:
            q = np.zeros((0, h, len(levels)))
        return ForecastArrays(
            inputs.series_ids,
            inputs.last_timestamps,
            inputs.future_timestamps,
            mean,
            q,
            levels,
            inputs.glitch_timestamps,
        )

    def attention(
        self,
        df: pd.DataFrame | Mapping[str, np.ndarray],
        future_df: pd.DataFrame | Mapping[str, np.ndarray] | None = None,
        horizon: int | None = None,
    ) -> AttentionMaps:
        """Attention weights behind the forecast of each series of `df` (a long frame or its
        columns; see AttentionMaps). `future_df` is read as `predict` reads it for `horizon`
        steps: covariates given for those steps only are held beyond them."""
        model = self._require_model()
        mc = self.model_config
        prepared = self.prepare(df, future_df, horizon)
        with torch.inference_mode():
            _, attention = model(
                prepared.past_values.to(self.device),
                prepared.past_observed_mask.to(self.device),
                _to(prepared.past_covariates, self.device),
                _to(prepared.future_covariates, self.device),
                return_attention=True,
            )

        def arrays(layers: list[torch.Tensor]) -> list[np.ndarray]:
            return [w.float().cpu().numpy() for w in layers]

        # The first token starts N * P steps before the forecast origin (padding included),
        # which may be before the range timestamps have: only padding lies there.
        starts = shift(
            prepared.last_timestamps, self.freq, 1 - mc.n_patches * mc.patch, errors="coerce"
        )
        integers = is_integer_axis(self.freq)

        def label(t: np.datetime64) -> str:
            return time_text(t, integers) if integers else pd.Timestamp(t).isoformat()

        context_starts = [None if pd.isna(t) else label(t) for t in starts]
        return AttentionMaps(
            series_ids=list(prepared.series_ids),
            encoder=arrays(attention.encoder),
            decoder_self=arrays(attention.decoder_self),
            cross=arrays(attention.cross),
            context_starts=context_starts,
            patch_length=mc.patch,
            patch_stride=mc.patch,
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
        )

    def forecast_windows(self, df: pd.DataFrame, max_windows: int = 0) -> WindowForecasts:
        """Forecast every stride-1 window with a full context and horizon inside each series.

        This is how the long-term forecasting benchmarks score a test split: no window dropped.
        `max_windows` > 0 keeps that many evenly spaced windows instead. All of them at once:
        `iter_forecast_windows` gives them a batch at a time.
        """
        parts = list(self.iter_forecast_windows(df, max_windows))
        h, q = self.max_horizon, len(self.quantiles)
        return WindowForecasts(
            series_ids=np.concatenate([p.series_ids for p in parts] or [np.empty(0, object)]),
            target=np.concatenate([p.target for p in parts] or [np.empty((0, h))]),
            mean=np.concatenate([p.mean for p in parts] or [np.empty((0, h))]),
            quantiles=None
            if not q
            else np.concatenate([p.quantiles for p in parts] or [np.empty((0, h, q))]),
        )

    def iter_forecast_windows(
        self, df: pd.DataFrame, max_windows: int = 0
    ) -> Iterator[WindowForecasts]:
        """`forecast_windows`, one `predict_batch_size` batch of windows at a time: memory stays
        one batch, however many windows (2.9 million of 720 steps in Traffic's test split)."""
        self._require_model()
        mc = self.model_config
        validated = validate_long_frame(
            df,
            covariates=mc.covariates,
            freq=self.freq,
            allow_missing=True,
            wall_clock=self.wall_clock,
        )
        panel = SeriesPanel.from_validated(validated, mc)
        origins = panel.window_origins(mc.prediction_length, min_context=mc.context_length)
        origins = evenly_spaced(origins, max_windows)
        ids = np.asarray(panel.series_ids, dtype=object)[panel.series_of(origins)]
        batch_size = self.train_config.predict_batch_size
        for begin in range(0, len(origins), batch_size):
            chunk = origins[begin : begin + batch_size]
            batch = self._without_glitches(
                gather_windows(panel, chunk, mc.context_length, mc.prediction_length)
            )
            output = self._forward(
                batch.past_values,
                batch.past_observed_mask,
                batch.past_covariates,
                batch.future_covariates,
            )
            target = batch.future_values.numpy().copy()
            target[~batch.future_observed_mask.numpy()] = np.nan
            yield WindowForecasts(
                series_ids=ids[begin : begin + batch_size],
                target=target,
                mean=output.mean.cpu().numpy(),
                quantiles=None if output.quantiles is None else output.quantiles.cpu().numpy(),
            )

    # -- persistence ----------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write config.json, model.safetensors and reference.json into directory `path`.

        Everything is computed before anything is written, and every file is written beside
        its final name before any is renamed over it: a failed or interrupted save leaves the
        model saved before, if any, as it was. Under torchrun only rank 0 writes (every rank
        holds the same weights); the others return `path` at once.
        """
        model = self._require_model()
        path = Path(path)
        if distributed_rank() != 0:
            return path
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        training = self._saved_training
        if self.train_result is not None:
            r = self.train_result
            training = {
                "best_epoch": r.best_epoch,
                "best_val_loss": r.best_val_loss,
                "initial_val_loss": r.initial_val_loss,
                "linear_start_ridge": r.linear_start_ridge,
                "linear_start_prior": r.linear_start_prior,
                "seconds": r.seconds,
                "device": r.device,
                "epochs": len(r.epochs),
                "tail_epochs": None if r.tail is None else len(r.tail.epochs),
                "glitches": r.n_glitches,
            }
        meta = {
            "format_version": FORMAT_VERSION,
            "model_config": config_to_dict(self.model_config),
            "train_config": config_to_dict(self.train_config),
            "freq": self.freq,
            "wall_clock": self._fitted_wall_clock,
            "training": training,
            "torch_version": torch.__version__,
        }
        reference = self._reference_forecast()
        if not all(np.isfinite(values).all() for values in reference.values()):
            raise TrainingDivergedError(
                f"{path}: not saved: the model forecasts non-finite values (its weights hold "
                "NaN or inf), expected finite forecasts"
            )
        contents = {
            WEIGHTS_FILE: safetensors.torch.save(state),
            REFERENCE_FILE: json.dumps(
                {name: values.tolist() for name, values in reference.items()}
            ).encode(),
        }
        # config.json, renamed last, vouches for the other two: a save that dies between its
        # renames leaves files of two saves, which `load` names instead of failing on them.
        meta["sha256"] = {name: hashlib.sha256(data).hexdigest() for name, data in contents.items()}
        contents[CONFIG_FILE] = json.dumps(meta, indent=2).encode()
        path.mkdir(parents=True, exist_ok=True)
        partials: list[Path] = []
        try:
            for name, data in contents.items():
                partials.append(path / f".{name}.partial")
                _write_file(partials[-1], data)
            # The three renames, microseconds, are the only moment the directory holds a mix
            # of the old model and the new: a Ctrl-C waits until they are done.
            with _interrupts_deferred():
                for name, partial in zip(contents, partials, strict=True):
                    partial.replace(path / name)
        except BaseException:
            for partial in partials:
                partial.unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path: str | Path, device: str | None = None, verify: bool = True) -> Forecaster:
        """Load a saved model. Reads JSON and safetensors only: nothing is unpickled.

        With `verify`, the forecast saved beside the weights is replayed and must come out the
        same (`ModelCodeMismatchError` otherwise), so a model never serves under code that
        forecasts differently from the code that trained it. Models saved without one load.
        `device` None is "auto" (cuda when there is one), not the device it trained on: a
        model trained on a GPU serves on a CPU machine. A missing, damaged or mismatched file
        is a `ModelFileError` naming it.
        """
        path = Path(path)
        meta, state, saved_reference = _read_saved(path)
        train_values = {**meta["train_config"], "device": device or "auto"}
        model_values = dict(meta["model_config"])
        train_values.setdefault("glitch_threshold", None)  # saved before the rule: none
        train_values.setdefault("seasonal_glitch_factor", None)  # before the cycle's test
        train_values.setdefault("zero_glitch_ratio", None)  # before the zeros' test
        if "naive_head" in model_values:  # saved before its blend could be gates: softmax
            model_values.setdefault("naive_blend", "softmax")
        model_values.setdefault("short_history_band_unit", "std")  # before the level unit
        model_values.setdefault("observed_drift", False)  # before the observed history's slope
        try:
            forecaster = cls(
                config_from_dict(ModelConfig, model_values),
                config_from_dict(TrainConfig, train_values),
            )
        except InvalidConfigError as exc:
            raise ModelFileError(f"{path / CONFIG_FILE}: {exc}", field="model") from None
        forecaster.freq = meta.get("freq")
        forecaster._fitted_wall_clock = meta.get("wall_clock")  # absent before it was saved
        training = meta.get("training")
        forecaster._saved_training = training if isinstance(training, dict) else None
        model = PatchTransformer(forecaster.model_config)
        # A model saved before intervals were calibrated was used with a scale of 1, one saved
        # before they were calibrated per band of history with one factor for all.
        scale = state.get("interval_scale", torch.ones(()))
        state["interval_scale"] = (
            scale.expand(N_HISTORY_BANDS).clone() if scale.dim() == 0 else scale
        )
        # One saved before the naive head existed forecast with the draft alone: closed gates.
        if model.naive_head is not None and "naive_head.weight" not in state:
            state["naive_head.weight"] = torch.zeros_like(model.naive_head.weight)
            state["naive_head.bias"] = torch.zeros_like(model.naive_head.bias)
        # One saved before the left padding was imputed read it as 0: the identity. One saved
        # before the choice was made per band of history imputed in every band (its factor
        # the identity when it did not impute at all).
        state.setdefault("padding_factor", model.padding_factor.clone())
        state.setdefault("padding_imputed", torch.ones_like(model.padding_imputed))
        # One saved before the blend with drift existed forecast without it.
        state.setdefault("drift_weight", torch.zeros(()))
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:  # missing, unexpected or misshapen tensors
            raise ModelFileError(
                f"{path / WEIGHTS_FILE}: its tensors do not fit the model {CONFIG_FILE} "
                f"describes: {' '.join(str(exc).split())}",
                field="model",
            ) from None
        forecaster.model = model.to(forecaster.device).eval()
        if verify and saved_reference is not None:
            forecaster.check_reference(saved_reference, str(path))
        return forecaster

    def check_reference(self, expected: Mapping[str, np.ndarray], where: str) -> None:
        """Raise `ModelCodeMismatchError` unless this code reproduces each `expected` forecast
        (`mean` (S, H), and `quantiles` (S, H, Q) in models saved since the intervals are
        calibrated)."""
        got = self._reference_forecast()
        for name, values in expected.items():
            scale = 1.0 + float(np.abs(values).max(initial=0.0))
            mine = got.get(name)
            deviation = (
                float(np.abs(mine - values).max(initial=0.0))
                if mine is not None and mine.shape == values.shape
                else np.inf
            )
            if not deviation <= REFERENCE_TOLERANCE * scale:
                raise ModelCodeMismatchError(
                    f"{where}: this code does not reproduce the model's reference forecast "
                    f"({name}: largest difference {deviation:.3g}, allowed "
                    f"{REFERENCE_TOLERANCE * scale:.3g}); it was saved by code that forecasts "
                    "differently: serve it with that code version or retrain it with this one"
                )

    def _reference_forecast(self) -> dict[str, np.ndarray]:
        """Mean (2, H) and quantile (2, H, Q) forecasts of two fixed synthetic histories
        (covariates 0)."""
        mc = self.model_config
        n = mc.context_length
        freq = self.freq or "h"
        try:
            ds = synthetic_range(REFERENCE_START, n + mc.prediction_length, freq)[:n]
        except InvalidTimestampsError:  # yearly data: 336 years from 2020 pass pandas' 2262
            ds = synthetic_range(EARLY_REFERENCE_START, n + mc.prediction_length, freq)[:n]
        t = np.arange(n, dtype=np.float64)
        history = {
            "unique_id": np.repeat(np.array(["reference-a", "reference-b"], dtype=object), n),
            "ds": np.tile(ds, 2),
            "y": np.concatenate([10 + np.sin(t / 5) + 0.01 * t, 3 + np.cos(t / 3)]),
            **{name: np.zeros(2 * n) for name in mc.covariates},
        }
        future = None
        if mc.covariates:
            future_ds = steps_after(ds[-1:], freq, mc.prediction_length)[0].astype(ds.dtype)
            future = {
                "unique_id": np.repeat(
                    np.array(["reference-a", "reference-b"], dtype=object), mc.prediction_length
                ),
                "ds": np.tile(future_ds, 2),
                **{name: np.zeros(2 * mc.prediction_length) for name in mc.covariates},
            }
        forecast = self.forecast(self.prepare(history, future))
        return {"mean": forecast.mean, "quantiles": forecast.quantiles}

    # -- internals ------------------------------------------------------------------------
    def _inference_model(self) -> torch.nn.Module:
        """The model, compiled once (dynamic shapes: batches differ) when `compile` is set."""
        model = self._require_model()
        if not self.train_config.compile:
            return model
        if self._compiled is None or self._compiled[0] is not model:
            self._compiled = (model, torch.compile(model, dynamic=True))
        return self._compiled[1]

    def _require_model(self) -> PatchTransformer:
        if self.model is None:
            raise RuntimeError(
                "the Forecaster is not fitted: call fit() or Forecaster.load() first"
            )
        return self.model

    def check_horizon(self, horizon: int | None) -> int:
        """`horizon` as an int in 1..prediction_length (None: prediction_length)."""
        if horizon is None:
            return self.max_horizon
        if (
            isinstance(horizon, bool)
            or not isinstance(horizon, int | np.integer)
            or not 1 <= horizon <= self.max_horizon
        ):
            raise HorizonTooLongError(
                f"horizon: expected an integer between 1 and {self.max_horizon} (the model's "
                f"prediction_length), got {horizon!r}",
                field="horizon",
            )
        return int(horizon)

    def check_quantiles(self, quantiles: Sequence[float] | None) -> tuple[float, ...]:
        """Each requested level as the trained level it equals (None: all of them)."""
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

    def _glitches(self, validated: ValidatedFrame, mc: ModelConfig | None = None) -> np.ndarray:
        """The rows of a validated history read as glitches (`TrainConfig.glitch_threshold`),
        each series read whole, with the seasonal cycle of `mc` (this model's when None):
        (rows,) bool."""
        tc = self.train_config
        mc = mc or self.model_config
        return series_glitches(
            np.asarray(validated.columns["y"], dtype=np.float64),
            validated.offsets,
            tc.glitch_threshold,
            mc.season_length or 1,
            tc.seasonal_glitch_factor,
            tc.zero_glitch_ratio,
        )

    def _without_glitches(self, batch: WindowBatch) -> WindowBatch:
        """The batch with its contexts' glitches masked (`TrainConfig.glitch_threshold`)."""
        tc = self.train_config
        observed = mask_glitches(
            batch.past_values,
            batch.past_observed_mask,
            tc.glitch_threshold,
            self.model_config.season_length or 1,
            tc.seasonal_glitch_factor,
            tc.zero_glitch_ratio,
        )
        return dataclasses.replace(
            batch,
            past_values=torch.where(observed, batch.past_values, 0.0),
            past_observed_mask=observed,
        )

    def _forward(
        self,
        past_values: torch.Tensor,
        past_observed_mask: torch.Tensor,
        past_covariates: torch.Tensor | None,
        future_covariates: torch.Tensor | None,
    ) -> ModelOutput:
        """One forward pass on the model's device; forecasts back on the CPU in float64."""
        model = self._inference_model()
        if model.training:  # eval() walks every submodule: not on every call
            model.eval()
        with torch.inference_mode(), bf16_autocast(self.device, self.train_config.bf16):
            output, _ = model(
                _to(past_values, self.device),
                _to(past_observed_mask, self.device),
                _to(past_covariates, self.device),
                _to(future_covariates, self.device),
            )
            forecast = output.denormalize()
        mean = forecast.mean.double().cpu()
        quantiles = None if forecast.quantiles is None else forecast.quantiles.double().cpu()
        if self.model_config.non_negative:
            mean = mean.clamp_min(0.0)
            quantiles = None if quantiles is None else quantiles.clamp_min(0.0)
        return ModelOutput(mean, quantiles)


def _write_file(target: Path, data: bytes) -> None:
    """`data` in `target`, on disk before a rename makes it part of the model."""
    with target.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())


def _read_saved(
    path: Path,
) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, np.ndarray] | None]:
    """The config, the weights and the reference forecast (None in models saved without one)
    of a directory `Forecaster.save` wrote; `ModelFileError` naming the file that is missing,
    damaged, or, by the checksums in config.json (models saved since), from another save."""
    if not path.is_dir():
        what = "a file" if path.exists() else "not found"
        raise ModelFileError(
            f"{path}: {what}; expected a directory written by Forecaster.save", field="model"
        )
    found: dict[str, bytes] = {}
    for name in (CONFIG_FILE, WEIGHTS_FILE, REFERENCE_FILE):
        try:
            found[name] = (path / name).read_bytes()
        except FileNotFoundError:
            if name != REFERENCE_FILE:
                raise ModelFileError(
                    f"{path}: no {name}; expected a directory written by Forecaster.save",
                    field="model",
                ) from None
    try:
        meta = json.loads(found[CONFIG_FILE])
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ModelFileError(
            f"{path / CONFIG_FILE}: not valid JSON ({exc}); the file is damaged", field="model"
        ) from None
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        version = meta.get("format_version") if isinstance(meta, dict) else None
        raise ModelFileError(
            f"{path / CONFIG_FILE}: expected format_version {FORMAT_VERSION}, got {version!r} "
            "(retrain the model with this version)",
            field="model",
        )
    missing = [k for k in ("model_config", "train_config") if not isinstance(meta.get(k), dict)]
    if missing:
        raise ModelFileError(
            f"{path / CONFIG_FILE}: no {missing[0]!r} mapping (got {meta.get(missing[0])!r}); "
            "the file is damaged",
            field="model",
        )
    try:
        readable = isinstance(meta.get("freq"), str) and parse_freq(meta["freq"]) is not None
    except FrequencyInferenceError:
        readable = False
    if not readable:
        raise ModelFileError(
            f"{path / CONFIG_FILE}: 'freq' is {meta.get('freq')!r}, expected the pandas "
            "offset alias fit saved; the file is damaged",
            field="model",
        )
    for name, expected in (meta.get("sha256") or {}).items():
        data = found.get(name)
        if data is None or hashlib.sha256(data).hexdigest() != expected:
            what = (
                f"is missing though {CONFIG_FILE} lists it"
                if data is None
                else f"does not match the checksum in {CONFIG_FILE}"
            )
            raise ModelFileError(
                f"{path / name}: {what} (the file is damaged, or from another save: one "
                "interrupted between its renames); save the model again",
                field="model",
            )
    try:
        state = safetensors.torch.load(found[WEIGHTS_FILE])
    except SafetensorError as exc:
        raise ModelFileError(
            f"{path / WEIGHTS_FILE}: not readable as safetensors ({exc}); the file is damaged",
            field="model",
        ) from None
    reference = None
    if REFERENCE_FILE in found:
        try:
            saved = json.loads(found[REFERENCE_FILE])
            reference = {k: np.asarray(v, dtype=np.float64) for k, v in saved.items()}
        except (ValueError, TypeError, AttributeError) as exc:
            raise ModelFileError(
                f"{path / REFERENCE_FILE}: not a saved forecast ({exc}); the file is damaged",
                field="model",
            ) from None
    return meta, state, reference


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) that arrives inside the block until it ends (main thread only,
    where Python delivers signals; elsewhere the block runs as is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt


def _frame(data: pd.DataFrame | Mapping[str, np.ndarray]) -> pd.DataFrame:
    return data if isinstance(data, pd.DataFrame) else pd.DataFrame(dict(data))


def _observed_series(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` less its series with no observed target, when others remain: they give no
    validation window (a series in an outage through the validation stretch), and refusing
    them refused the whole fit."""
    if TARGET not in frame.columns or ID not in frame.columns:
        return frame  # validation names what is missing
    observed = pd.to_numeric(frame[TARGET], errors="coerce").notna().to_numpy()
    keep = pd.Series(observed).groupby(frame[ID].to_numpy()).transform("any").to_numpy()
    return frame if keep.all() or not keep.any() else frame[keep]


def _blind_context_error(
    validated: ValidatedFrame, k: int, glitches: bool, context_length: int
) -> MissingValuesError:
    """The error for series `k`, whose context holds no observed value: forecast, it would be
    the scaler's default of 0 whatever the series' level."""
    start, end = validated.offsets[k], validated.offsets[k + 1]
    sid = str(validated.series_ids[k])
    seen = np.flatnonzero(~np.isnan(validated.columns[TARGET][start:end]))
    if glitches:
        why = "every observed value in it was read as a glitch"
    else:
        last = pd.Timestamp(validated.columns[TIME][start + seen[-1]])
        why = (
            f"its last observation is at {last}, {end - start - 1 - seen[-1]} steps before its end"
        )
    return MissingValuesError(
        f"series {sid!r} has no observed value in its last {context_length} steps, the context "
        f"the model reads ({why}); send its recent values, or drop its trailing missing rows to "
        "forecast on from its last observation",
        series_id=sid,
        field=TARGET,
    )


def _context_timestamps(steps: np.ndarray, last_timestamps: np.ndarray, freq: str) -> np.ndarray:
    """The timestamps of the context steps marked in `steps` (S, L) whose last step is at
    `last_timestamps` (S,): (S,) object, a datetime64[ns] array per series."""
    length = steps.shape[1]
    out = no_glitches(len(steps))
    rows, cols = np.nonzero(steps)
    if len(rows):
        stamps = shift(last_timestamps[rows], freq, cols - (length - 1))
        for row in np.unique(rows):
            out[row] = stamps[rows == row]
    return out


def _rows_frame(validated: ValidatedFrame, rows: np.ndarray) -> pd.DataFrame:
    """Long frame `unique_id, ds` of the `rows` (bool, one per row) of a validated history."""
    index = np.flatnonzero(rows)
    series = np.searchsorted(validated.offsets, index, side="right") - 1
    return pd.DataFrame(
        {
            ID: pd.array(np.asarray(validated.series_ids, dtype=object)[series], dtype="string"),
            TIME: np.asarray(validated.columns[TIME])[index].astype("datetime64[ns]"),
        }
    )


def _to(tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """Copy a batch to `device` once, asynchronously from pinned memory on CUDA."""
    if tensor is None or tensor.device == device:
        return tensor
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def _hold_out_tail(
    panel: SeriesPanel, horizon: int
) -> tuple[WindowSet, WindowSet | None, WindowSet]:
    """Split each series' last AUTO_VALIDATION_FRACTION (at least one horizon) for validation:
    (training windows, validation windows, the windows the tail epochs train on).

    Training windows end before the held-out tail; validation windows forecast inside it, with
    the series' earlier points as their history. A series too short to give both keeps every
    window for training, those whose targets run past its end included. The tail epochs add
    the held-out tail's windows of the kinds the path trained on: a split series' complete
    ones only, since its path never saw targets past an end (with the windows past the end
    too, Tourism Monthly's holdout OWA went from 0.799 to 0.851 and M3 Quarterly's from 0.924
    to 0.935 on the same judged path; docs/model-choices.md). When no series can give both,
    every seventh series is held out whole instead (its windows validate, the others train):
    judged on the training loss, a model of a catalogue of short series trained 35 epochs and
    forecast worse than naive (M4 Hourly summed into days: 15-26 days of history, H = 14;
    docs/benchmark-history.md, Daily data). With a single series, training runs on the
    training loss.
    """
    lengths = np.diff(panel.offsets)
    val_points = np.maximum(horizon, (lengths * AUTO_VALIDATION_FRACTION).astype(np.int64))
    can_split = lengths - val_points >= horizon + 1
    cutoff = np.where(can_split, panel.offsets[:-1] + lengths - val_points, panel.offsets[1:])
    origins = panel.training_origins(horizon)
    series = panel.series_of(origins)
    # A split series trains on the windows whose targets end by its cutoff (after it come
    # the validation points); the others on every window, those running past their end too.
    in_train = (origins + horizon <= cutoff[series]) | ~can_split[series]
    train = WindowSet(panel, origins[in_train])
    complete = origins + horizon <= panel.offsets[series + 1]
    val_origins = origins[(origins >= cutoff[series]) & can_split[series] & complete]
    if len(val_origins) > 0:
        tail = WindowSet(panel, origins[complete | ~can_split[series]])
        return train, WindowSet(panel, val_origins), tail
    everything = WindowSet(panel, origins)
    held = np.arange(len(lengths)) % round(1 / AUTO_VALIDATION_FRACTION) == 0  # (S,)
    if len(origins) == 0 or held[series].all():
        logger.warning("series too short for a validation split: judging epochs on training loss")
        return train, None, everything
    logger.warning(
        "series too short to hold out a horizon: validating on %d whole series of %d",
        len(np.unique(series[held[series]])),
        len(lengths),
    )
    return (
        WindowSet(panel, origins[~held[series]]),
        WindowSet(panel, origins[held[series]]),
        everything,
    )
