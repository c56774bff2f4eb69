"""Model and training configuration: frozen, validated on construction.

Defaults were chosen on validation windows only, never on a test split: ETTh1's validation
months and windows carved from the end of M4 Hourly's training series (see the README's design
section).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from forecaster.data import quantile_column
from forecaster.errors import InvalidConfigError
from forecaster.time_axis import (
    CALENDAR_FEATURES,
    is_integer_axis,
    long_season_length,
    patch_length_for,
    season_length,
)

Loss = Literal["mae", "mse", "huber"]
LOSSES = ("mae", "mse", "huber")
LossUnit = Literal["rms", "std", "rms_mase"]
LOSS_UNITS = ("rms", "std", "rms_mase")
NaiveBlend = Literal["gates", "softmax"]
NAIVE_BLENDS = ("gates", "softmax")
BandUnit = Literal["level", "std"]
BAND_UNITS = ("level", "std")


def _check(condition: bool, name: str, expected: str, actual: object) -> None:
    if not condition:
        raise InvalidConfigError(f"{name}: expected {expected}, got {actual!r}", field=name)


def _check_types(config: object) -> None:
    """Every field holds the type its annotation names, before any range is checked: an int
    field takes no 1.5 or True (torch would fail deep inside fit), a float field no text or
    infinity (a rate of inf trains to NaN), a bool field no "false" (which reads as true)."""
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):  # type: ignore[arg-type]
        value, hint = getattr(config, field.name), hints[field.name]
        _check(_is_a(value, hint), field.name, _describe(hint), value)
        # NumPy numbers are taken, and kept as Python ones: JSON (save, MLflow params) and
        # isinstance checks know those.
        plain = _plain(value)
        if plain is not value:
            object.__setattr__(config, field.name, plain)


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple | list) and any(isinstance(v, np.generic) for v in value):
        return type(value)(_plain(v) for v in value)
    return value


def _is_a(value: object, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    boolean = isinstance(value, bool | np.bool_)
    if hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_is_a(value, arg) for arg in args)
    if origin is Literal:
        return isinstance(value, str) and value in args
    if origin is tuple:  # tuple[X, ...]; a list is taken too (JSON has no tuples)
        return isinstance(value, tuple | list) and all(_is_a(v, args[0]) for v in value)
    if hint is bool:
        return boolean
    if hint is int:
        return isinstance(value, int | np.integer) and not boolean
    if hint is float:
        number = isinstance(value, int | float | np.integer | np.floating) and not boolean
        return number and math.isfinite(value)  # type: ignore[arg-type]
    if hint is str:
        return isinstance(value, str)
    return True


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None):
        return "None"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in args)
    if origin is Literal:
        return " or ".join(map(str, args))
    if origin is tuple:
        return f"a list of {_describe(args[0])} values"
    return {int: "an integer", float: "a finite number", bool: "true or false"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )


# Longest context: the model holds an (L+1) x (L+1) float32 map for a short history's padding
# and the linear start solves a system of that size, 1 GiB each at this L (a week of minutes is
# 10,080 steps). Beyond it a fit failed only on allocating terabytes.
MAX_CONTEXT_LENGTH = 16_384

# The context a model reads by default: in horizons, in seasonal cycles and in steps
# (`default_context_length`).
CONTEXT_HORIZONS = 7
CONTEXT_SEASONS = 3
MIN_DEFAULT_CONTEXT = 96
MAX_DEFAULT_CONTEXT = 336


def default_context_length(prediction_length: int, season_length: int = 1) -> int:
    """L for a horizon H and a seasonal period m when none is given: 7 H (N-BEATS' and
    NHITS' input size) and at least three cycles 3 m, within [96, 336] steps.

    336 steps was the one default for every horizon before: ETTh1 validates worse at 672
    (docs/model-choices.md, ETTh1 at long horizons), so longer horizons read 336 still; M4
    Hourly (H = 48) reads 336 as before. A short horizon reads the recent past: daily data
    forecast 14 days ahead from 98 days validated 3.7 % better than from 336, in half the
    time (docs/model-choices.md). 96 steps (four days of hours, the shortest lookback of the
    long-horizon benchmarks) keep a daily cycle and a season of days in view for H < 14.
    Three cycles reach past 96 steps for weekly data (156 weeks) and for sub-hourly data
    (15-minute data: three days, 288 steps): weekly series forecast a quarter ahead validated
    1.3-1.5 % better from three years than from 96 weeks, level with 336 (README, Short
    catalogues), and real half-hourly demand six hours ahead 10-13 % better from three days
    than from 96 steps (a week validated better still and forecast worse: one series; README,
    Half-hourly demand).
    """
    seasons = CONTEXT_SEASONS * season_length
    wanted = max(CONTEXT_HORIZONS * prediction_length, seasons, MIN_DEFAULT_CONTEXT)
    return min(wanted, MAX_DEFAULT_CONTEXT)


# Edges, as fractions of the context length L, of the bands of history whose intervals are
# calibrated apart: a window that has observed at most L/32, L/16, L/8, L/4, L/2 or more than
# L/2 steps since its series began. A model knows less the less history it sees, and its
# learned bands come out narrowest there (M4 Hourly, README design).
HISTORY_EDGES = (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2)
N_HISTORY_BANDS = len(HISTORY_EDGES) + 1
# How logs, metrics and reports name the bands.
HISTORY_BANDS = (
    *(f"up_to_L/{round(1 / edge)}" for edge in HISTORY_EDGES),
    f"beyond_L/{round(1 / HISTORY_EDGES[-1])}",
)


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of the patch Transformer encoder-decoder (see forecaster.model)."""

    # L: steps of history the model reads per forecast; shorter histories are left-padded
    # and masked, so this is a maximum, not a requirement. None: seven horizons and three
    # seasonal cycles at least, within [96, 336] steps (`default_context_length`), set by fit
    # (see `for_frequency`).
    context_length: int | None = None
    # H: steps the model forecasts in one pass; shorter horizons are truncations of it.
    prediction_length: int = 96
    # P: steps per token, for the context patches and the horizon patches alike. Tokens do not
    # overlap and the last context token ends at the forecast origin. None: whole cycles of the
    # seasonal period (`season_length`, given or the data's), at least 8 steps (24 for hourly
    # data, 12 for monthly, 14 for daily...; see `patch_length_for`), set by fit.
    patch_length: int | None = None
    # Steps per seasonal cycle of the data (24 for hourly data, 52 for weekly...; see
    # `forecaster.time_axis.season_length`). The linear start reads a missing step as the same
    # step one cycle earlier, or as the last observed value when there is none: the guess that
    # held up on validation for both scattered missing points and day-long outages. None: set
    # by fit from the data's frequency (and read as 1, the last value, by a model saved
    # before the field existed).
    season_length: int | None = None
    # Steps per the data's second, longer cycle: a week of sub-daily data whose season is the
    # day (168 for hourly data; see `forecaster.time_axis.long_season_length`). Where the
    # context holds it, its last cycle is one more naive forecast, for the naive head to blend
    # and the linear start's ridge to shrink towards: M4 Hourly validated 1.9-2.9 % better
    # with it, ETTh1 level (docs/model-choices.md). None: set by fit from the data's
    # frequency (and read as 1, none, by a model saved before the field existed).
    long_season_length: int | None = None
    # D: width of every token embedding.
    d_model: int = 64
    # Attention heads per layer; must divide d_model.
    n_heads: int = 4
    # Bidirectional self-attention blocks over the context patches.
    n_encoder_layers: int = 2
    # Blocks of causal self-attention + cross-attention over the horizon tokens.
    n_decoder_layers: int = 1
    # Hidden width of the position-wise feed-forward network.
    d_ff: int = 128
    # Dropout on residual branches and embeddings.
    dropout: float = 0.1
    # Dropout on attention weights.
    attention_dropout: float = 0.0
    # In training, each decoder block's update of horizon token m is dropped with probability
    # horizon_dropout * (m + 1) / M: far horizons, where the data says least, lean most on the
    # linear start (CATS' query-adaptive masking).
    horizon_dropout: float = 0.5
    # Quantiles the probabilistic head predicts; empty for a point forecast only.
    quantiles: tuple[float, ...] = (0.1, 0.5, 0.9)
    # Floor every forecast (the mean and each quantile) at 0, for counts, sales and volumes:
    # near a low level a band, or a trend read down, would otherwise reach below zero. Applied
    # at forecast time only, so training's gradients are the unfloored model's.
    non_negative: bool = False
    # Loss on the point forecast, counted in each series' unit (see loss_unit).
    loss: Loss = "mae"
    # The unit each series' errors are counted in, in training and validation, so series of
    # any size weigh alike. "rms": the root mean square of its observed values, i.e. its level
    # where it has one and its spread where it is centred on zero, so errors count relative to
    # the level, as sMAPE counts them (M4 Hourly holdout OWA, README design). "std": its spread
    # alone, as MASE counts; for data whose zero is arbitrary (temperatures in kelvin).
    # "rms_mase": the geometric mean of the RMS and MASE's own scale, the in-sample error of
    # the seasonal naive forecast, so both halves of OWA weigh (docs/model-choices.md).
    loss_unit: LossUnit = "rms"
    # Horizon step h weighs h ** -horizon_weight_decay in the training loss (normalised to a
    # mean of 1): near steps carry more signal (CARD's signal-decay loss). 0 weighs all alike.
    horizon_weight_decay: float = 0.5
    # Weight of the pinball loss on the quantile head relative to the point loss.
    quantile_loss_weight: float = 0.5
    # The unit the quantile head learns its offsets in where a window has observed fewer
    # steps than one season: "level", the magnitude of the window's mean where that exceeds
    # its std, which a few steps of a cycle understate (200 hourly sensors of 18 readings got
    # bands 31 times their history's std wide: InstanceScaler.statistics); "std", the
    # scaler's unit as everywhere else (models saved before the field existed).
    short_history_band_unit: BandUnit = "level"
    # Start from a ridge-fitted linear map from the context to the horizon (DLinear's), which the
    # decoder reads as its draft and corrects. The ridge shrinks it towards the naive forecast
    # cross-validation prefers: the context's mean, its last value, its last season (and its
    # last week, for sub-daily data: long_season_length) or its last value with drift (see
    # forecaster.training.fit_linear_start). Off: the Transformer forecasts alone.
    linear_start: bool = True
    # With the linear start: each horizon token blends its draft with the naive forecasts of
    # its context (the mean, last value, last season, last week, drift), so the model picks
    # per series what the one shared linear map cannot. Starts on the draft. Off: the draft
    # and its correction alone (docs/model-choices.md).
    naive_head: bool = True
    # How the naive head turns its outputs into the blend's weights, both convex and both
    # starting on the draft. "gates": one weight per naive forecast, clamped at zero and
    # scaled to sum at most 1, the draft taking the rest; they start at zero and move at the
    # learning rate's pace from the first step. "softmax": over the draft and the naive
    # forecasts, from logits of -8 that move too slowly to leave the draft within ETTh1's few
    # epochs; the first version, kept so the models saved with it load.
    naive_blend: NaiveBlend = "gates"
    # With the naive head: its drift forecast reads the slope from a row's first observation
    # where the row has observed fewer steps than the drift's span (see
    # forecaster.model.observed_drift). Off (models saved before the field existed): over the
    # span, the left padding read as the row's mean, which flattens a short history's trend.
    observed_drift: bool = True
    # Calendar features of `ds` fed to encoder and decoder tokens (names from
    # forecaster.time_axis.CALENDAR_FEATURES). Off by default: on validation data they let the
    # model memorise the training period's calendar (see the README's design section).
    calendar_features: tuple[str, ...] = ()
    # Names of user-given known-future covariate columns, fed like the calendar features.
    covariates: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_types(self)
        _check(self.prediction_length >= 1, "prediction_length", ">= 1", self.prediction_length)
        _check(
            self.context_length is None or 1 <= self.context_length <= MAX_CONTEXT_LENGTH,
            "context_length",
            f"in [1, {MAX_CONTEXT_LENGTH}]",
            self.context_length,
        )
        _check(
            self.patch_length is None or self.patch_length >= 1,
            "patch_length",
            "None or >= 1",
            self.patch_length,
        )
        _check(
            self.season_length is None or self.season_length >= 1,
            "season_length",
            "None or >= 1",
            self.season_length,
        )
        _check(
            self.long_season_length is None or self.long_season_length >= 1,
            "long_season_length",
            "None or >= 1",
            self.long_season_length,
        )
        _check(self.d_model >= 1, "d_model", ">= 1", self.d_model)
        _check(
            self.n_heads >= 1 and self.d_model % self.n_heads == 0,
            "n_heads",
            f"a divisor of d_model={self.d_model}",
            self.n_heads,
        )
        _check(self.n_encoder_layers >= 1, "n_encoder_layers", ">= 1", self.n_encoder_layers)
        _check(self.n_decoder_layers >= 1, "n_decoder_layers", ">= 1", self.n_decoder_layers)
        _check(self.d_ff >= 1, "d_ff", ">= 1", self.d_ff)
        for name in ("dropout", "attention_dropout", "horizon_dropout"):
            value = getattr(self, name)
            _check(0.0 <= value < 1.0, name, "in [0, 1)", value)
        quantiles = tuple(float(q) for q in self.quantiles)
        _check(
            all(0.0 < q < 1.0 for q in quantiles) and len(set(quantiles)) == len(quantiles),
            "quantiles",
            "distinct values strictly between 0 and 1",
            self.quantiles,
        )
        names = [quantile_column(q) for q in quantiles]
        _check(
            len(set(names)) == len(names),
            "quantiles",
            "levels whose forecast columns differ (q0.1 and q0.1000001 are both 'q0.1')",
            self.quantiles,
        )
        object.__setattr__(self, "quantiles", tuple(sorted(quantiles)))
        object.__setattr__(self, "covariates", tuple(self.covariates))
        object.__setattr__(self, "calendar_features", tuple(self.calendar_features))
        unknown = [name for name in self.calendar_features if name not in CALENDAR_FEATURES]
        _check(not unknown, "calendar_features", f"names from {list(CALENDAR_FEATURES)}", unknown)
        _check(self.loss in LOSSES, "loss", " or ".join(LOSSES), self.loss)
        _check(
            self.naive_blend in NAIVE_BLENDS,
            "naive_blend",
            " or ".join(NAIVE_BLENDS),
            self.naive_blend,
        )
        _check(self.loss_unit in LOSS_UNITS, "loss_unit", " or ".join(LOSS_UNITS), self.loss_unit)
        _check(
            self.short_history_band_unit in BAND_UNITS,
            "short_history_band_unit",
            " or ".join(BAND_UNITS),
            self.short_history_band_unit,
        )
        _check(
            self.horizon_weight_decay >= 0,
            "horizon_weight_decay",
            ">= 0",
            self.horizon_weight_decay,
        )
        _check(
            self.quantile_loss_weight >= 0,
            "quantile_loss_weight",
            ">= 0",
            self.quantile_loss_weight,
        )

    def for_frequency(self, freq: str | None) -> ModelConfig:
        """This configuration with what it leaves to the data set from data of `freq`: the
        patch, the seasonal period and the long one, and the context from the horizon and the
        period (`default_context_length`). Fit trains what this returns; a data split that
        hands the model its history asks it how long that history is."""
        _check(
            not (self.calendar_features and is_integer_axis(freq)),
            "calendar_features",
            "none for integer ds, which has no calendar",
            self.calendar_features,
        )
        season = self.season_length
        if season is None:
            season = season_length(freq) if freq is not None else 1
        long_season = self.long_season_length
        if long_season is None:
            long_season = long_season_length(freq) if freq is not None else 1
        context = self.context_length
        if context is None:
            context = default_context_length(self.prediction_length, season)
        patch = self.patch_length if self.patch_length is not None else patch_length_for(season)
        return dataclasses.replace(
            self,
            context_length=context,
            patch_length=patch,
            season_length=season,
            long_season_length=long_season,
        )

    @property
    def patch(self) -> int:
        """P, once resolved (fit sets it from the data's frequency when it is None)."""
        assert self.patch_length is not None, "patch_length is resolved by Forecaster.fit"
        return self.patch_length

    @property
    def n_patches(self) -> int:
        """N: context tokens; the context is left-padded to a whole number of patches."""
        assert self.context_length is not None, "context_length is resolved by Forecaster.fit"
        return -(-self.context_length // self.patch)

    @property
    def n_horizon_tokens(self) -> int:
        """M: decoder tokens, enough to cover the horizon."""
        return -(-self.prediction_length // self.patch)

    @property
    def n_covariates(self) -> int:
        """Covariate channels per time step (calendar features first, then user columns)."""
        return len(self.calendar_features) + len(self.covariates)


@dataclass(frozen=True)
class TrainConfig:
    """How the model is trained.

    An epoch is `max_windows_per_epoch` random training windows (however many the data holds),
    then one validation pass.
    When validation does not improve for `patience` epochs, the best weights are restored and
    the learning rate is multiplied by `lr_decay`; after `max_lr_decays` such decays training
    stops. The learning rate thus anneals exactly as far as the validation data supports, and
    a model that cannot beat its linear start keeps the linear start.
    """

    # Upper bound on epochs, a budget: large data sets (M4 Hourly, 414 series) still improve
    # slowly when they reach it, and its last `cooldown_share` anneals their rate. M4 Hourly's
    # epochs took 12-30 s on the 2-core CPU from one day to the next; 20 epochs, cooled down
    # over the last 4, keep its fit near 10 minutes on the slowest day seen and validate
    # within 1 % of 35 without a cooldown (docs/model-choices.md). 0 trains nothing by
    # gradient: the model is its closed-form linear start.
    max_epochs: int = 20
    # Wall-clock budget in seconds for the judged epochs, counted from the start of training
    # (the linear start's fit included), as Lightning's `max_time`: no epoch starts that the
    # longest epoch so far says would end past it, and training ends as after its last
    # learning-rate decay (the best weights kept, intervals calibrated). For scheduled
    # retraining that must end in its slot: the same data and seed then train further on a
    # faster machine, so a budgeted run is reproducible only on the same hardware. The first
    # epoch always runs; tail epochs (one epoch each) and a refit's replay are not cut.
    # None: no budget, `max_epochs` alone bounds training.
    max_train_seconds: float | None = None
    # Windows (one series each) per optimisation step.
    batch_size: int = 256
    # Peak AdamW learning rate, reached after warmup.
    learning_rate: float = 1e-3
    # The linear start's learning rate relative to the rest: it begins at its least-squares
    # optimum and should move only as far as the rest of the model needs.
    linear_start_lr_scale: float = 0.1
    # AdamW decoupled weight decay, on weight matrices only (not on norms, biases, queries or
    # the linear start), as nanoGPT groups them.
    weight_decay: float = 1e-2
    # Optimisation steps over which the learning rate warms up linearly (at most one epoch).
    warmup_steps: int = 100
    # Factor applied to the learning rate, after restoring the best weights, on a plateau.
    lr_decay: float = 0.3
    # Share of the `max_epochs` budget that cools down: its last int(share x max_epochs)
    # epochs take the rate down linearly towards zero, epoch by epoch (K epochs at K/(K+1),
    # ..., 1/(K+1) of the current rate), on top of the plateau's decays: warmup-stable-decay
    # (MiniCPM; Hägele et al. 2024, who call it the cooldown). Without it a run that reaches
    # the cap (M4 Hourly) stops at its full rate; runs that the plateau rule stops before the
    # last share never reach it. Counted in epochs: a run that `max_train_seconds` cuts short
    # may end before it. 0: no cooldown.
    cooldown_share: float = 0.2
    # Plateaus tolerated before training stops. Two, not four: the last two decays (rates of
    # 0.027 and 0.008 of the peak) gained at most 0.2 % of validation loss, and patience 2
    # needs their epochs for the full rate (docs/model-choices.md).
    max_lr_decays: int = 2
    # Epochs without validation improvement that make a plateau. With 1, one epoch level with
    # the best to four digits (M4 Hourly seeds 1 and 2) or one noisy epoch (the synthetic daily
    # set) decayed the rate of runs still improving, and run lengths varied by seed from 8 to
    # 29 epochs (docs/model-choices.md).
    patience: int = 2
    # Refit: one epoch per factor at learning_rate x factor on every window, with no
    # validation, early stopping or restores; an empty tuple is the linear start alone, fitted
    # on every window. An evaluated run's TrainResult.kept_lr_factors replays the path that
    # led to its best weights, so a model refit on all data trains as far as validation said.
    # None: not a refit.
    replay_lr_factors: tuple[float, ...] | None = None
    # With replay_lr_factors: the epochs (0-based, in the factors) that start fresh AdamW
    # moments, as the evaluated run did after each restore (TrainResult.kept_restarts). None:
    # wherever the factor changes (a replay logged before the cooldown, whose factors changed
    # only at restores).
    replay_restarts: tuple[int, ...] | None = None
    # When `fit` holds the validation tail out of the data itself (no `val_df`), the kept
    # weights then train this many more epochs on every window, the tail's included, at the
    # last learning rate of their path: the tail is each series' most recent data (at least
    # one horizon), which the judged model never trained on. Holdout OWA with 0 -> 1: M3
    # Monthly 0.971 -> 0.937, M4 Hourly 0.5023 -> 0.5015, M1 Quarterly 0.834 -> 0.844;
    # better on seven of eight sets, -1.1 % on their mean (docs/model-choices.md).
    # Retraining the whole kept path on every window (a refit, what `pipelines` does after a
    # promotion) gains more on some sets, loses on others and costs most of the training
    # again. No tail epoch when validation kept the linear start alone: nothing trains that
    # validation did not judge better. They train the point forecast only: the quantile head
    # keeps the weights its interval factors were calibrated for (docs/model-choices.md).
    # 0: none.
    tail_epochs: int = 1
    # Forecast a history shorter than the context with its left padding imputed by its linear
    # regression on the observed steps, under the linear start's ridge Gram matrix, so that its
    # draft is the ridge fit on the lags it has (impute_left_padding), or read as the window
    # mean, as in training. One choice per band of HISTORY_EDGES, like interval_scale; one bool
    # is the same choice for all. None: after training, each band imputes where that lowers the
    # point loss of its validation windows with padding (plus longer ones cut into the band
    # when it has too few; choose_padding_imputation), and reads the mean without validation;
    # a refit replays the evaluated run's (TrainResult.impute_padding). Imputing helps a model
    # trained on long series that forecasts new, shorter ones, and costs catalogues that train
    # on their short series, most where histories are shortest. Chosen per band, M4 Hourly
    # cut to 335 / 312 / 168 points scores holdout OWA 0.449 / 0.472 / 0.519 (the mean's
    # 0.478 / 0.507 / 0.531) while the weekly catalogue keeps its sMAPE 9.11 (9.31 imputed
    # everywhere): docs/model-choices.md, Histories cut short at forecast time.
    impute_padding: bool | tuple[bool, ...] | None = None
    # Before forecasting, a reading further than this many robust deviations (1.4826 times
    # the median absolute deviation) from the median of its centred 25-step window, whose two
    # neighbours are ordinary (twice as far out with one neighbour only), is read as
    # unobserved, as a NaN would be (forecaster/glitches.py). Over nine competition holdouts
    # (M4 Hourly, M1, M3, Tourism) 12 with the cycle's test below costs clean histories 0.03 %
    # of OWA on average against 0.26 % for 8, recovers as much of one reading ten times too
    # high a series, and a little less of one dropped to zero (docs/model-choices.md,
    # Glitches). Fit reads each series' whole history by the same rule and names what it
    # finds (Forecaster.training_glitches). None: no step is masked (models saved before the
    # rule existed).
    glitch_threshold: float | None = 12.0
    # How much further out than `glitch_threshold` a reading must lie from the median of the
    # same step in the three seasons before and after it (the three steps before and after
    # where the data has no season) to be a glitch too, once the window's glitches are out:
    # what finds a drop to zero inside a strong daily cycle, which the window's median does
    # not (M4 Hourly holdout OWA with one zero reading a series 0.543 with the window's test
    # at 8 alone, 0.492 with both at 12; clean 0.4505 -> 0.4507). None: the window alone
    # (models saved before it existed).
    seasonal_glitch_factor: float | None = 1.0
    # Once both tests are done, a reading of exactly zero is a glitch too when the other
    # readings of its 25-step window all lie on one side of zero, at least this share of
    # their median and 10 steps of the data's resolution away from it (twice the share with
    # one neighbour only): a dropped reading. Over nine competition holdouts with one zero
    # reading a series, mean OWA 0.974 -> 0.835 (M3 Yearly 1.430 -> 1.064, M4 Hourly 0.492
    # -> 0.452), clean holdouts unchanged; counts of a few units keep their zeros
    # (docs/model-choices.md, Zeros). None: no such test (models saved before it existed).
    zero_glitch_ratio: float | None = 0.1
    # Train with the glitches fit finds read as gaps, in contexts and targets alike. For long
    # series known to hold bad readings: with one reading in 500 made ten times too high or
    # zero, M4 Hourly's holdout OWA 0.486 / 0.470 -> 0.469 / 0.460 (seeds 0 / 1); the damaged
    # monthly sets do not gain (M3 Monthly 0.881 -> 0.892). Off by default because real data
    # pays for it: what the rule finds in clean M4 Hourly and ETTh1 is mostly real moves, and
    # left out it costs M4 Hourly's holdout 0.451 -> 0.460 and ETTh1's validation MSE up to
    # +1.2 % (docs/model-choices.md, Glitches in the training data).
    mask_training_glitches: bool = False
    # The share of the way from the point forecast to the drift forecast (the last value with
    # the observed history's mean step) that forecasts move: a combination of the network with
    # the simplest trend method (PatchTransformer.drift_weight). None: after training, the
    # weight of DRIFT_WEIGHTS (0, 0.1 .. 1) under which the validation windows' point loss,
    # each series' errors counted in MASE's unit, is lowest, 0 without them; a refit replays
    # the evaluated run's (TrainResult.drift_weight). A global model fitted on many short
    # trending series learns less of their trends than drift extrapolates: validation chose
    # 0.2-0.3 on the yearly competition sets and 0.1-0.2 on M1 and M3 Quarterly (paired holdout
    # OWA 1-4 % better than without the blend, M1 Yearly 0.5 % worse); where drift forecasts
    # badly (ETTh1, M4 Hourly, seasonal or mean-reverting data) it keeps 0
    # (docs/model-choices.md, A blend with drift chosen on validation).
    drift_weight: float | None = None
    # Factors on the quantiles' offsets from the point forecast, one per band of
    # HISTORY_EDGES (a window that sees at most L/32 of history first, more than L/2 last); one
    # number is the same factor for all. None: after training, for each band the factor (of a
    # grid from 0.5 to 8) under which the band between the outer quantiles holds its nominal
    # share of the validation targets (0.8 for 0.1-0.9), or 1 without them; a refit replays
    # the evaluated run's (TrainResult.interval_scale). On M4 Hourly the band is narrow on
    # unseen windows without it, and narrower the less history a window has (README, design).
    interval_scale: float | tuple[float, ...] | None = None
    # Global gradient-norm clip; 0 disables clipping.
    grad_clip: float = 1.0
    # Validate, keep and return an exponential moving average of the weights (Polyak
    # averaging) with this decay per step instead of the last step's weights; 0 turns it off.
    # On validation: M4 Hourly holdout OWA 0.528 -> 0.512, ETTh1 unchanged (README, design).
    ema_decay: float = 0.99
    # Training augmentation: each training window loses, with this probability, one span of
    # 1 .. outage_seasons * season_length context steps (ending at the forecast origin in half
    # the cases), so the model learns to forecast through the outages of a live feed. On
    # validation: M4 Hourly holdout with the last day missing MASE 1.30 -> 1.11, complete
    # histories OWA 0.511 -> 0.506; 0.1 did less on both (README, design). 0 turns it off.
    outage_probability: float = 0.25
    # Longest augmented outage, in seasons (see ModelConfig.season_length).
    outage_seasons: int = 3
    # Training augmentation, off by default: each complete training window is, with this
    # probability, replaced by itself with a share `frequency_mask_rate` of its Fourier
    # components zeroed, context and targets together (FrAug's FreqMask). At 0.5 on
    # validation: ETTh1 loss -0.15 / -0.17 / -0.33 % at H = 192 / 336 / 720 (+0.17 % at 96),
    # but M4 Hourly +0.9 % over three seeds (holdout OWA 0.508 against 0.500) and the weekly
    # catalogue slightly worse, so it helps one data set and hurts others
    # (docs/model-choices.md). 0 turns it off.
    frequency_mask_probability: float = 0.0
    # Share of Fourier components a masked window loses (0.2 beat 0.1 and 0.5 on ETTh1).
    frequency_mask_rate: float = 0.2
    # Training windows per epoch: a fresh random subset when the data holds more, successive
    # shuffled passes over all of them when it holds fewer, so that a catalogue of a few
    # hundred short series takes as many steps between two validations as a large one (when an
    # epoch was one pass, M1's 181 yearly series trained for a handful of steps an epoch,
    # within warmup, and scored below naive: holdout OWA 1.13 against 0.75 now). 0: one pass.
    max_windows_per_epoch: int = 65536
    # Cap on validation windows (evenly spaced over all series, fixed across epochs); 0 = all.
    # Validation runs every epoch: a catalogue of 48,000 monthly series holds ~930,000
    # validation windows, which took 70 % of each epoch; 65,536 (over a million targets)
    # judge an epoch as surely. M4 Hourly (30,255) and ETTh1 (<= 19,495) stay below it.
    max_val_windows: int = 65536
    # Seed for weights, window sampling and dropout.
    seed: int = 0
    # "auto" picks cuda when available, else cpu; or "cpu", "cuda", "cuda:N", "mps".
    device: str = "auto"
    # Wrap the model in torch.compile (worth it on GPU for long runs). Not on the 2-core CPU:
    # an M4 Hourly epoch took 33 s compiled against 26-32 s eager that day, after 80 s
    # compiling; on a faster day 12.7-13.1 s against 11.1-11.3 s, after 42 s.
    compile: bool = False
    # Autocast the forward pass to bfloat16. None: on CUDA only (where it is fast); True: on
    # any device; False: never. On the 2-core CPU, AMX-BF16 and all, an M4 Hourly epoch took
    # 13.7-14.3 s against 11.1-11.3 s in float32: at d_model 64 the casts cost more than the
    # smaller matrix products save.
    bf16: bool | None = None
    # Show a tqdm progress bar with the running loss.
    progress: bool = True
    # Series per forward pass at prediction time.
    predict_batch_size: int = 1024

    def __post_init__(self) -> None:
        _check_types(self)
        _check(self.max_epochs >= 0, "max_epochs", ">= 0", self.max_epochs)
        _check(
            self.max_train_seconds is None or self.max_train_seconds > 0,
            "max_train_seconds",
            "None or > 0",
            self.max_train_seconds,
        )
        _check(0 <= self.seed < 2**32, "seed", "in [0, 2**32)", self.seed)
        _check(
            re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", self.device) is not None,
            "device",
            "auto, cpu, cuda, cuda:N or mps",
            self.device,
        )
        _check(self.batch_size >= 1, "batch_size", ">= 1", self.batch_size)
        _check(self.learning_rate > 0, "learning_rate", "> 0", self.learning_rate)
        _check(
            self.linear_start_lr_scale >= 0,
            "linear_start_lr_scale",
            ">= 0",
            self.linear_start_lr_scale,
        )
        _check(self.weight_decay >= 0, "weight_decay", ">= 0", self.weight_decay)
        _check(self.warmup_steps >= 0, "warmup_steps", ">= 0", self.warmup_steps)
        _check(0 < self.lr_decay < 1, "lr_decay", "in (0, 1)", self.lr_decay)
        _check(self.max_lr_decays >= 0, "max_lr_decays", ">= 0", self.max_lr_decays)
        _check(self.patience >= 1, "patience", ">= 1", self.patience)
        if self.interval_scale is not None:
            scales = self.interval_scale
            if isinstance(scales, (int, float)):
                scales = (scales,) * N_HISTORY_BANDS
            _check(
                len(scales) == N_HISTORY_BANDS
                and all(isinstance(f, (int, float)) and math.isfinite(f) and f > 0 for f in scales),
                "interval_scale",
                f"None, a positive finite factor or {N_HISTORY_BANDS} of them",
                self.interval_scale,
            )
            object.__setattr__(self, "interval_scale", tuple(float(f) for f in scales))
        _check(
            self.drift_weight is None or 0 <= self.drift_weight <= 1,
            "drift_weight",
            "None or a weight in [0, 1]",
            self.drift_weight,
        )
        if self.impute_padding is not None:
            choice = self.impute_padding
            if isinstance(choice, bool):
                choice = (choice,) * N_HISTORY_BANDS
            if isinstance(choice, list):  # JSON has no tuples, as for every tuple field
                choice = tuple(choice)
            _check(
                isinstance(choice, tuple)
                and len(choice) == N_HISTORY_BANDS
                and all(isinstance(c, bool) for c in choice),
                "impute_padding",
                f"None, a bool or {N_HISTORY_BANDS} of them",
                self.impute_padding,
            )
            object.__setattr__(self, "impute_padding", choice)
        _check(
            self.glitch_threshold is None
            or (math.isfinite(self.glitch_threshold) and self.glitch_threshold > 0),
            "glitch_threshold",
            "None or a positive finite number",
            self.glitch_threshold,
        )
        _check(
            self.seasonal_glitch_factor is None
            or (math.isfinite(self.seasonal_glitch_factor) and self.seasonal_glitch_factor > 0),
            "seasonal_glitch_factor",
            "None or a positive finite number",
            self.seasonal_glitch_factor,
        )
        _check(
            self.zero_glitch_ratio is None or 0 <= self.zero_glitch_ratio < 1,
            "zero_glitch_ratio",
            "None or a number in [0, 1)",
            self.zero_glitch_ratio,
        )
        _check(self.grad_clip >= 0, "grad_clip", ">= 0", self.grad_clip)
        _check(0.0 <= self.ema_decay < 1.0, "ema_decay", "in [0, 1)", self.ema_decay)
        for name in ("outage_probability", "frequency_mask_probability", "frequency_mask_rate"):
            value = getattr(self, name)
            _check(0.0 <= value <= 1.0, name, "in [0, 1]", value)
        _check(self.outage_seasons >= 1, "outage_seasons", ">= 1", self.outage_seasons)
        _check(
            self.max_windows_per_epoch >= 0,
            "max_windows_per_epoch",
            ">= 0",
            self.max_windows_per_epoch,
        )
        _check(self.tail_epochs >= 0, "tail_epochs", ">= 0", self.tail_epochs)
        _check(0 <= self.cooldown_share < 1, "cooldown_share", "in [0, 1)", self.cooldown_share)
        _check(self.max_val_windows >= 0, "max_val_windows", ">= 0", self.max_val_windows)
        _check(self.predict_batch_size >= 1, "predict_batch_size", ">= 1", self.predict_batch_size)
        if self.replay_lr_factors is not None:
            factors = tuple(float(f) for f in self.replay_lr_factors)
            _check(
                all(math.isfinite(f) and f > 0 for f in factors),
                "replay_lr_factors",
                "None or positive finite factors",
                self.replay_lr_factors,
            )
            object.__setattr__(self, "replay_lr_factors", factors)
        if self.replay_restarts is not None:
            _check(
                all(r >= 0 for r in self.replay_restarts),
                "replay_restarts",
                "None or epoch indices >= 0",
                self.replay_restarts,
            )
            object.__setattr__(self, "replay_restarts", tuple(self.replay_restarts))


def config_to_dict(config: ModelConfig | TrainConfig) -> dict[str, Any]:
    """JSON-ready dict of a config (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def config_from_dict(cls: type, values: dict[str, Any]) -> Any:
    """Build a config from a dict, rejecting unknown keys with the list of known ones."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise InvalidConfigError(
            f"{cls.__name__}: unknown field(s) {unknown}; expected some of {sorted(known)}",
            field=unknown[0],
        )
    tuple_fields = {f.name for f in dataclasses.fields(cls) if "tuple" in str(f.type)}
    coerced = {
        k: tuple(v) if k in tuple_fields and isinstance(v, list) else v for k, v in values.items()
    }
    return cls(**coerced)


__all__ = ["ModelConfig", "TrainConfig", "config_to_dict", "config_from_dict"]
