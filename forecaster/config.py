"""Model and training configuration: frozen, validated on construction.

Defaults were chosen on validation data of hourly multivariate sensor series (ETTh1's
validation split; see the README's design section), never on a test split.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal

from forecaster.errors import InvalidConfigError
from forecaster.features import CALENDAR_FEATURES

Loss = Literal["mse", "mae", "huber", "pinball"]


def _check(condition: bool, name: str, expected: str, actual: object) -> None:
    if not condition:
        raise InvalidConfigError(f"{name}: expected {expected}, got {actual!r}", field=name)


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of the patch Transformer encoder-decoder."""

    # L: steps of history the model reads per forecast.
    context_length: int = 512
    # H: steps the model forecasts in one pass; shorter horizons are truncations of it.
    prediction_length: int = 96
    # P: steps per encoder token. A token is a patch of P consecutive values.
    patch_length: int = 16
    # S: steps between the starts of consecutive encoder patches (S < P overlaps them).
    patch_stride: int = 8
    # Steps per decoder token; the decoder emits H / decoder_patch_length tokens in one pass.
    decoder_patch_length: int = 16
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
    # Dropout on residual branches and embeddings; sensor data overfits quickly.
    dropout: float = 0.2
    # Dropout on attention weights.
    attention_dropout: float = 0.0
    # Quantiles the probabilistic head predicts; empty for a point forecast only.
    quantiles: tuple[float, ...] = (0.1, 0.5, 0.9)
    # Loss on the point forecast; "pinball" trains quantiles only and uses the median as mean.
    loss: Loss = "mse"
    # Weight of the pinball loss on the quantile head relative to the point loss.
    quantile_loss_weight: float = 0.5
    # Add a linear map from the (normalised) context to the horizon, as in DLinear; the
    # Transformer then learns what a linear model misses, and training starts from a strong fit.
    linear_skip: bool = True
    # Reversible instance normalisation: scale each window by its own mean and std.
    revin: bool = True
    # Calendar features of `ds` fed to encoder and decoder tokens (names from
    # forecaster.features.CALENDAR_FEATURES). Daily and weekly cycles generalise; day/month of
    # year would be memorised from a year or two of history.
    calendar_features: tuple[str, ...] = ("hour_of_day", "day_of_week")
    # Names of user-given known-future covariate columns, fed like the calendar features.
    covariates: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check(self.context_length >= 1, "context_length", ">= 1", self.context_length)
        _check(self.prediction_length >= 1, "prediction_length", ">= 1", self.prediction_length)
        _check(
            1 <= self.patch_length <= self.context_length,
            "patch_length",
            f"between 1 and context_length={self.context_length}",
            self.patch_length,
        )
        _check(
            1 <= self.patch_stride <= self.patch_length,
            "patch_stride",
            f"between 1 and patch_length={self.patch_length}",
            self.patch_stride,
        )
        _check(
            self.decoder_patch_length >= 1,
            "decoder_patch_length",
            ">= 1",
            self.decoder_patch_length,
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
        _check(0.0 <= self.dropout < 1.0, "dropout", "in [0, 1)", self.dropout)
        _check(
            0.0 <= self.attention_dropout < 1.0,
            "attention_dropout",
            "in [0, 1)",
            self.attention_dropout,
        )
        quantiles = tuple(float(q) for q in self.quantiles)
        _check(
            all(0.0 < q < 1.0 for q in quantiles) and len(set(quantiles)) == len(quantiles),
            "quantiles",
            "distinct values strictly between 0 and 1",
            self.quantiles,
        )
        object.__setattr__(self, "quantiles", tuple(sorted(quantiles)))
        object.__setattr__(self, "covariates", tuple(self.covariates))
        object.__setattr__(self, "calendar_features", tuple(self.calendar_features))
        unknown = [name for name in self.calendar_features if name not in CALENDAR_FEATURES]
        _check(not unknown, "calendar_features", f"names from {list(CALENDAR_FEATURES)}", unknown)
        _check(
            self.loss in ("mse", "mae", "huber", "pinball"),
            "loss",
            "mse, mae, huber or pinball",
            self.loss,
        )
        _check(
            self.loss != "pinball" or 0.5 in self.quantiles,
            "loss",
            "quantiles to include 0.5 when loss='pinball' (the median is the point forecast)",
            self.quantiles,
        )
        _check(
            self.quantile_loss_weight >= 0,
            "quantile_loss_weight",
            ">= 0",
            self.quantile_loss_weight,
        )

    @property
    def n_patches(self) -> int:
        """N: encoder tokens; the context is padded by one stride at the end, as in PatchTST."""
        return (self.context_length - self.patch_length) // self.patch_stride + 2

    @property
    def n_horizon_tokens(self) -> int:
        """M: decoder tokens, enough to cover the horizon."""
        return -(-self.prediction_length // self.decoder_patch_length)

    @property
    def n_covariates(self) -> int:
        """Covariate channels per time step (calendar features first, then user columns)."""
        return len(self.calendar_features) + len(self.covariates)


@dataclass(frozen=True)
class TrainConfig:
    """How the model is trained."""

    # Upper bound on passes over the training windows; early stopping usually ends sooner.
    max_epochs: int = 10
    # Windows (one series each) per optimisation step.
    batch_size: int = 256
    # Peak AdamW learning rate, reached after warmup and decayed by cosine.
    learning_rate: float = 3e-4
    # AdamW decoupled weight decay.
    weight_decay: float = 1e-2
    # Fraction of all steps spent warming the learning rate up linearly.
    warmup_fraction: float = 0.05
    # Global gradient-norm clip; 0 disables clipping.
    grad_clip: float = 1.0
    # Epochs without validation improvement before stopping (best weights are restored).
    patience: int = 3
    # Cap on training windows drawn per epoch (a fresh random subset each epoch); 0 = all.
    # Keeps an epoch short on CPU so early stopping checks validation often.
    max_windows_per_epoch: int = 16384
    # Cap on validation windows (evenly spaced, fixed across epochs); 0 = all.
    max_val_windows: int = 0
    # Seed for weights, window sampling and dropout.
    seed: int = 0
    # "auto" picks cuda when available, else cpu; or name a torch device.
    device: str = "auto"
    # Wrap the model in torch.compile (worth it on GPU for long runs).
    compile: bool = False
    # Autocast to bfloat16 on CUDA devices.
    bf16: bool = True
    # Show a tqdm progress bar with the running loss.
    progress: bool = True
    # Series per forward pass at prediction time.
    predict_batch_size: int = 1024

    def __post_init__(self) -> None:
        _check(self.max_epochs >= 1, "max_epochs", ">= 1", self.max_epochs)
        _check(self.batch_size >= 1, "batch_size", ">= 1", self.batch_size)
        _check(self.learning_rate > 0, "learning_rate", "> 0", self.learning_rate)
        _check(self.weight_decay >= 0, "weight_decay", ">= 0", self.weight_decay)
        _check(0 <= self.warmup_fraction < 1, "warmup_fraction", "in [0, 1)", self.warmup_fraction)
        _check(self.grad_clip >= 0, "grad_clip", ">= 0", self.grad_clip)
        _check(self.patience >= 1, "patience", ">= 1", self.patience)
        _check(
            self.max_windows_per_epoch >= 0,
            "max_windows_per_epoch",
            ">= 0",
            self.max_windows_per_epoch,
        )
        _check(self.max_val_windows >= 0, "max_val_windows", ">= 0", self.max_val_windows)
        _check(self.predict_batch_size >= 1, "predict_batch_size", ">= 1", self.predict_batch_size)


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
