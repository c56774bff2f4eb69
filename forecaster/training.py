"""The training loop.

1. The linear start is fitted in closed form (ridge regression on the normalised training
   windows), shrunk towards a naive forecast (the context's mean, its last value, its last
   season or its last value with drift), the prior and the ridge strength chosen by blocked
   5-fold cross-validation over time on the training windows, never on the validation windows
   that later judge the Transformer.
2. AdamW (fused where torch has it) with warmup, nanoGPT's parameter groups (weight decay on
   weight matrices only) and the linear start in a group of its own at a fraction of the
   learning rate.
3. After each epoch the validation loss decides: a better model is kept; on a plateau the best
   weights come back and the learning rate decays (the optimiser's moments restart); after
   `max_lr_decays` plateaus training stops. Epoch 0, the linear start, is a candidate too.
   `max_epochs` and, when set, `max_train_seconds` (a wall-clock budget) end it earlier; the
   last `cooldown_share` of the `max_epochs` budget takes the rate linearly towards zero, so
   a run that reaches the cap ends annealed (warmup-stable-decay).

bf16 autocast on CUDA, optional torch.compile, and DistributedDataParallel when launched by
`torchrun` (nccl on GPU, gloo on CPU). Batches are copied to a GPU from pinned memory, and
the host reads nothing back from it between steps (the losses add up on the device).
"""

from __future__ import annotations

import copy
import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from tqdm.auto import tqdm

from forecaster.config import (
    HISTORY_BANDS,
    HISTORY_EDGES,
    N_HISTORY_BANDS,
    ModelConfig,
    TrainConfig,
)
from forecaster.errors import InvalidConfigError, TrainingDivergedError
from forecaster.model import (
    NormalizedOutput,
    PatchTransformer,
    history_band,
    naive_forecast_maps,
    pinball_loss,
    point_loss,
    point_loss_per_step,
)
from forecaster.scaling import InstanceStats
from forecaster.windows import (
    SeriesPanel,
    WindowBatch,
    gather_windows,
    mase_units,
    with_frequency_masking,
    with_history,
    with_outages,
)

logger = logging.getLogger(__name__)

# Windows used for the closed-form linear start (evenly spaced over the training windows).
LINEAR_START_WINDOWS = 50_000
# Ridge strengths tried for the linear start, as multiples of the number of windows. The
# strongest ones leave little but the prior, a naive forecast: on short noisy series that is
# what cross-validation wants (M1 Yearly chose 100; with 10 the largest, the mean prior won).
LINEAR_START_RIDGES = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1e3)
# Blocked cross-validation folds (consecutive stretches of each series' windows).
LINEAR_START_FOLDS = 5
# Factors tried for the width of the intervals: 0.5 to 8 in steps of 2 ** (1 / 14), about 5 %.
INTERVAL_SCALES = tuple(float(s) for s in np.geomspace(0.5, 8.0, 57))
# Weights tried for the blend of the point forecast with the drift forecast (see
# choose_drift_weight): steps of a tenth, coarse enough not to fit the validation windows' noise.
DRIFT_WEIGHTS = tuple(i / 10 for i in range(11))
# Scored targets a band of history needs for a factor of its own (see calibrate_intervals).
CALIBRATION_MIN_TARGETS = 1_000
# A normalised target this close to 0 sits at its context's level (float rounding of a
# constant context's mean is about 1e-13 of its scale).
_AT_LEVEL = 1e-9
# Most longer validation windows cut short to calibrate a band that has too few of its own
# (and to choose its padding's reading). 4,096 windows of M4 Hourly's 414 series chose the same
# readings as 16,384, and factors one step of INTERVAL_SCALES apart at most, in a quarter of
# the time: the forecasts of cut copies took 33 s of an M4 Hourly fit (docs/model-choices.md).
CALIBRATION_WINDOWS = 4_096
# Training steps between two readings of the running loss for the progress bar.
PROGRESS_EVERY = 20


@dataclass(frozen=True)
class WindowSet:
    """Windows of one panel: its series and the origins (first forecast steps) to use."""

    panel: SeriesPanel
    origins: np.ndarray  # (W,) int64


@dataclass(frozen=True)
class EpochLog:
    """What a per-epoch callback receives."""

    epoch: int  # 1-based
    train_loss: float
    val_loss: float | None  # None when there is no validation data
    learning_rate: float  # during the epoch
    seconds: float  # wall time of the epoch
    is_best: bool  # this epoch's weights are the best so far (kept)


@dataclass(frozen=True)
class TrainResult:
    epochs: list[EpochLog]
    best_epoch: int  # 0: the linear start was never beaten
    best_val_loss: float | None
    seconds: float
    device: str
    world_size: int
    stopped_early: bool = False
    # Training ended because the next epoch would have overrun TrainConfig.max_train_seconds.
    out_of_time: bool = False
    n_train_windows: int = 0
    n_val_windows: int = 0
    # Validation loss of the model before gradient training (the linear start alone).
    initial_val_loss: float | None = None
    # Ridge strength of the linear start and the map it is shrunk towards, chosen by
    # cross-validation (see fit_linear_start); None without one.
    linear_start_ridge: float | None = None
    linear_start_prior: str | None = None
    # Learning-rate factor of each epoch on the path to the kept weights (restored-away epochs
    # left out): TrainConfig(replay_lr_factors=...) retrains along the same path.
    kept_lr_factors: tuple[float, ...] = ()
    # The epochs of that path (0-based) that started fresh AdamW moments after a restore:
    # TrainConfig(replay_restarts=...) restarts them there too.
    kept_restarts: tuple[int, ...] = ()
    # Factors on the quantiles' offsets from the point forecast, one per band of history
    # (see calibrate_intervals).
    interval_scale: tuple[float, ...] = (1.0,) * N_HISTORY_BANDS
    # Per band of history, whether forecasts impute the left padding (see
    # choose_padding_imputation).
    impute_padding: tuple[bool, ...] = (False,) * N_HISTORY_BANDS
    # The share of the way to the drift forecast that forecasts move (see choose_drift_weight).
    drift_weight: float = 0.0
    # The epochs the kept weights then trained on every window, the held-out tail's included
    # (TrainConfig.tail_epochs); None when there were none.
    tail: TrainResult | None = None
    # Readings of the training data the glitch rule finds (Forecaster.training_glitches).
    n_glitches: int = 0


def resolve_device(name: str = "auto") -> torch.device:
    """ "auto" -> cuda when available, else cpu; anything else names a torch device, which
    must be usable here (InvalidConfigError otherwise, rather than torch's assertion)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise InvalidConfigError(
            f"device: expected auto, cpu, cuda, cuda:N or mps, got {name!r}", field="device"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidConfigError(
            f"device: {name!r} asked for, but CUDA is not available here (torch "
            f"{torch.__version__}); expected auto or cpu",
            field="device",
        )
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise InvalidConfigError(
            f"device: {name!r} asked for, but this machine has {torch.cuda.device_count()} "
            "CUDA device(s)",
            field="device",
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise InvalidConfigError(
            f"device: {name!r} asked for, but MPS is not available here", field="device"
        )
    return device


def bf16_autocast(device: torch.device, bf16: bool | None) -> AbstractContextManager:
    """The forward pass's autocast context: bfloat16 on CUDA by default, anywhere when asked."""
    enabled = device.type == "cuda" if bf16 is None else bf16
    if not enabled:
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def evenly_spaced(items: np.ndarray, limit: int) -> np.ndarray:
    """At most `limit` of `items`, evenly spaced over them (all of them when limit is 0)."""
    if limit == 0 or len(items) <= limit:
        return items
    return items[np.linspace(0, len(items) - 1, limit).round().astype(np.int64)]


@dataclass
class _Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def distributed_rank() -> int:
    """This process's rank under torchrun (the process group's, else the environment's); 0
    when not distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _setup_distributed(device: torch.device) -> tuple[_Distributed, torch.device]:
    """Join the process group torchrun describes in the environment, if any."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return _Distributed(), device
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return _Distributed(dist.get_rank(), dist.get_world_size(), local_rank), device


# ------------------------------------------------------------------------------------------
# the linear start


@dataclass(frozen=True)
class LinearStartFit:
    """What cross-validation chose for the linear start."""

    ridge: float  # strength, a multiple of the number of windows (LINEAR_START_RIDGES)
    prior: str  # the map it is shrunk towards, a key of `naive_forecast_maps`
    # (L + 1, L + 1) Cholesky factor of the fit's ridge Gram matrix, for the model's
    # padding_factor (see impute_left_padding).
    padding_factor: torch.Tensor | None = field(default=None, compare=False, repr=False)


@torch.no_grad()
def fit_linear_start(
    model: PatchTransformer, train: WindowSet, device: torch.device
) -> LinearStartFit:
    """Ridge-fit the linear start on normalised training windows; start the heads from it.
    The factor for imputing left padding is returned, not installed (see train_model).

    The ridge shrinks the map towards a naive forecast (`naive_forecast_maps`, its prior): the
    context's mean, its last value, its last season (and long season) or its last value with
    drift. The prior and the ridge strength (one of LINEAR_START_RIDGES) are the pair with the
    lowest error under blocked cross-validation: each series' windows are cut into
    LINEAR_START_FOLDS consecutive stretches, and each stretch is predicted by the fit on the
    others. The error is the one validation reads (the configured point loss in each series'
    units), so the fit and the epochs are judged alike. It is fitted on the windows with a full
    context when at least half of the series have one, else on every window.
    """
    mc = model.config
    assert model.linear_start is not None, "config.linear_start is off"
    panel = train.panel
    origins = train.origins
    series = panel.series_of(origins)
    n_series = len(np.unique(series))
    # Windows with every target inside their series where there are any: the closed form
    # would read a target past the series' end as 0, the window's mean.
    complete = origins + mc.prediction_length <= panel.offsets[series + 1]
    if complete.any():
        origins, series = origins[complete], series[complete]
    full = origins - panel.offsets[series] >= mc.context_length
    # Full-context windows, unless they come from a minority of the series: a map fitted on a
    # few long series' windows does not carry over to the many short ones.
    if 2 * len(np.unique(series[full])) >= n_series:
        origins = evenly_spaced(origins[full], LINEAR_START_WINDOWS)
    else:
        origins = evenly_spaced(origins, LINEAR_START_WINDOWS)
    batch = gather_windows(panel, origins, mc.context_length, mc.prediction_length).to(device)
    x, stats = model.scaler(batch.past_values, batch.past_observed_mask, torch.float64)
    model.padding_factor.copy_(torch.eye(mc.context_length + 1))  # the padding read as 0
    x = model.linear_start_input(x, batch.past_observed_mask)
    target = _normalized_target(batch, stats).double()
    observed = batch.future_observed_mask
    unit = (stats.scale / batch.loss_scale).double()  # (W, 1): normalised -> series units
    design = torch.cat([x, torch.ones_like(x[:, :1])], dim=1)  # (W, L + 1)

    fold = _blocked_folds(panel.series_of(origins), LINEAR_START_FOLDS)
    gram, moment = design.T @ design, design.T @ target
    eye = torch.eye(design.shape[1], dtype=torch.float64, device=device)
    parts = []
    for k in range(LINEAR_START_FOLDS):
        rows = torch.from_numpy(fold == k).to(device)
        if rows.any() and not rows.all():
            d = design[rows]
            parts.append(
                (d, target[rows], observed[rows].double(), unit[rows], d.T @ d, d.T @ target[rows])
            )
    priors = naive_forecast_maps(
        mc.context_length,
        mc.prediction_length,
        mc.season_length or 1,
        mc.long_season_length or 1,
    )
    priors = {name: prior.to(device) for name, prior in priors.items()}
    best_error, ridge, prior_name = math.inf, LINEAR_START_RIDGES[0], "mean"
    for name, prior in priors.items() if parts else ():
        for candidate in LINEAR_START_RIDGES:
            error = 0.0
            for d, t, o, u, g, m in parts:
                n = len(design) - len(d)
                solution = torch.linalg.solve(
                    gram - g + candidate * n * eye, moment - m + candidate * n * prior
                )
                error += float(point_loss((d @ solution - t) * u, o, mc.loss) * o.sum())
            if error < best_error:
                best_error, ridge, prior_name = error, candidate, name
    prior = priors[prior_name]
    solution = torch.linalg.solve(
        gram + ridge * len(design) * eye, moment + ridge * len(design) * prior
    )  # (L + 1, H)
    model.linear_start.weight.copy_(solution[:-1].T)
    model.linear_start.bias.copy_(solution[-1])
    # Intercept first, then the lags from the newest to the oldest (see impute_left_padding);
    # per window, so that the factor's scale does not grow with the number of windows.
    order = torch.arange(mc.context_length, -1, -1, device=device)  # intercept, newest..oldest
    shrunk = (gram + ridge * len(design) * eye) / len(design)
    padding_factor = torch.linalg.cholesky(shrunk[order][:, order])
    if model.quantile_head is not None:
        # Start the intervals at the linear fit's residual quantiles, not at zero width.
        # In the unit the head's offsets are read in (InstanceStats.band_unit).
        residuals = ((target - design @ solution) / stats.band_unit)[observed]
        residuals = residuals[torch.randperm(len(residuals), device=device)[:1_000_000]]
        levels = torch.tensor(mc.quantiles, dtype=torch.float64, device=device)
        offsets = torch.quantile(residuals, levels)  # (Q,)
        nn.init.zeros_(model.quantile_head.weight)
        # The head's outputs are laid out (P, Q), quantile fastest.
        model.quantile_head.bias.copy_(offsets.repeat(mc.patch))
    return LinearStartFit(ridge, prior_name, padding_factor)


def _blocked_folds(series: np.ndarray, n_folds: int) -> np.ndarray:
    """Fold of each window: its rank among its series' windows, cut into n_folds runs.

    `series` (the series of each window, windows in panel order) is non-decreasing.
    """
    first = np.searchsorted(series, series, side="left")
    size = np.searchsorted(series, series, side="right") - first
    rank = np.arange(len(series)) - first
    return np.minimum(rank * n_folds // size, n_folds - 1)


# ------------------------------------------------------------------------------------------
# losses


def _normalized_target(batch: WindowBatch, stats: InstanceStats) -> torch.Tensor:
    """The targets in the scaler's units (0 where unobserved), float64."""
    target = (batch.future_values - stats.loc) / stats.scale
    return torch.where(batch.future_observed_mask, target, torch.zeros_like(target))


def horizon_weights(config: ModelConfig, device: torch.device) -> torch.Tensor:
    """(H,) weight of each horizon step in the training loss, mean 1 (see ModelConfig)."""
    steps = torch.arange(1, config.prediction_length + 1, dtype=torch.float32, device=device)
    weights = steps ** (-config.horizon_weight_decay)
    return weights / weights.mean()


def window_loss(
    output: NormalizedOutput,
    batch: WindowBatch,
    config: ModelConfig,
    step_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(objective, point loss) of a batch, errors counted in each series' units.

    The objective is the point loss under `step_weights` (H,) plus the weighted pinball loss of
    the quantiles; the point loss alone, unweighted over the horizon, is what validation reads.
    """
    dtype, stats = output.mean.dtype, output.stats
    unit = (stats.scale / batch.loss_scale).to(dtype)  # (B, 1): normalised -> series units
    target = _normalized_target(batch, stats).to(dtype) * unit
    mean = output.mean * unit
    observed = batch.future_observed_mask.to(dtype)
    plain = point_loss(mean - target, observed, config.loss)
    weights = observed if step_weights is None else observed * step_weights
    objective = plain if step_weights is None else point_loss(mean - target, weights, config.loss)
    if output.quantiles is not None and config.quantile_loss_weight > 0:
        levels = torch.tensor(config.quantiles, dtype=dtype, device=target.device)
        quantile_term = pinball_loss(output.quantiles * unit.unsqueeze(-1), target, levels, weights)
        objective = objective + config.quantile_loss_weight * quantile_term
    return objective, plain


# ------------------------------------------------------------------------------------------
# the loop


def cooldown(epoch: int, n_epochs: int, config: TrainConfig) -> float:
    """The factor on the rate of `epoch` (1-based) of an `n_epochs` budget: 1, then over the
    budget's last K = int(cooldown_share x n_epochs) epochs K/(K+1), ..., 1/(K+1)."""
    cooling = int(config.cooldown_share * n_epochs)
    return min(1.0, (n_epochs - epoch + 1) / (cooling + 1))


def _parameter_groups(model: PatchTransformer, config: TrainConfig) -> list[dict]:
    """nanoGPT's grouping: decay weight matrices only; the linear start on its own."""
    decay, no_decay, linear = [], [], []
    for name, parameter in model.named_parameters():
        if name.startswith("linear_start."):
            linear.append(parameter)
        elif parameter.dim() >= 2 and name != "horizon_queries":
            decay.append(parameter)
        else:
            no_decay.append(parameter)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay, "lr_scale": 1.0},
        {"params": no_decay, "weight_decay": 0.0, "lr_scale": 1.0},
    ]
    if linear:
        groups.append(
            {"params": linear, "weight_decay": 0.0, "lr_scale": config.linear_start_lr_scale}
        )
    return groups


def _adamw(groups: list[dict], learning_rate: float, device: torch.device) -> torch.optim.AdamW:
    """AdamW, fused into one kernel per step where torch has one: at this model's size the
    default per-parameter loop costs 5 % of a training step (M4 Hourly's model, batch 256, 2
    CPU threads: 55.5 ms, fused 52.4 ms, medians of 8 interleaved rounds of 15 steps)."""
    fused = True if device.type in ("cpu", "cuda") else None
    return torch.optim.AdamW(groups, lr=learning_rate, fused=fused)


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return copy.deepcopy({k: v.detach().cpu() for k, v in model.state_dict().items()})


class _WeightAverage:
    """An exponential moving average of a model's parameters (Polyak averaging).

    The decay ramps up as (1 + k) / (10 + k) over the k updates since the last reset, so the
    average follows the first steps closely instead of dwelling on the starting weights.
    """

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.parameters = list(model.parameters())
        self.average = [p.detach().clone() for p in self.parameters]
        self.updates = 0

    @torch.no_grad()
    def reset(self) -> None:
        """Start over from the model's current weights."""
        for average, parameter in zip(self.average, self.parameters, strict=True):
            average.copy_(parameter)
        self.updates = 0

    @torch.no_grad()
    def update(self) -> None:
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        torch._foreach_lerp_(self.average, [p.detach() for p in self.parameters], 1 - decay)

    @torch.no_grad()
    def copy_to_model(self) -> None:
        for average, parameter in zip(self.average, self.parameters, strict=True):
            parameter.copy_(average)

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The model holds the average inside the block, its own weights again after."""
        with torch.no_grad():
            own = [p.detach().clone() for p in self.parameters]
            self.copy_to_model()
        try:
            yield
        finally:
            with torch.no_grad():
                for parameter, weights in zip(self.parameters, own, strict=True):
                    parameter.copy_(weights)


def train_model(
    model: PatchTransformer,
    train: WindowSet,
    val: WindowSet | None,
    config: TrainConfig,
    callbacks: Sequence[Callable[[EpochLog], None]] = (),
    warm_start: bool = False,
    frozen: nn.Module | None = None,
) -> TrainResult:
    """Fit `model` in place on the windows of `train`, judged on those of `val`.

    The model ends with the weights of the epoch of lowest validation loss (epoch 0 being the
    linear start), or of the last epoch when there is no validation data. With `warm_start`
    training goes on from the model's weights, its linear start included, instead of fitting
    the linear start first. The weights of `frozen`, a submodule, stay as they are.
    """
    mc: ModelConfig = model.config
    clock = time.perf_counter()  # what max_train_seconds counts from
    if len(train.origins) == 0:
        raise ValueError(
            "no training window: expected a series with a step of history and a target after it"
        )
    val_origins = np.empty(0, np.int64) if val is None else val.origins
    val_origins = evenly_spaced(val_origins, config.max_val_windows)
    has_val = len(val_origins) > 0

    world, device = _setup_distributed(resolve_device(config.device))
    seed_everything(config.seed)
    model.to(device)
    start = None
    if model.linear_start is not None and not warm_start:
        start = fit_linear_start(model, train, device)
        logger.info(
            "linear start: ridge %g, shrunk towards the %s, chosen by cross-validation",
            start.ridge,
            start.prior,
        )
    # Training and validation read the left padding as 0 (the row's mean); once trained, the
    # bands of history that `impute_padding` chooses impute it (impute_left_padding). Trained
    # on imputed drafts, M4 Hourly validated as well but forecast its holdout worse
    # (docs/model-choices.md).
    padding_factor = model.padding_factor.clone() if start is None else start.padding_factor
    model.padding_factor.copy_(torch.eye(mc.context_length + 1))
    train_module: nn.Module = model
    if world.enabled:
        train_module = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    if config.compile:
        train_module = torch.compile(train_module)

    # An epoch is the same number of windows however many the data holds (successive shuffled
    # passes over a small data set), so a catalogue of a few hundred short series is trained
    # for as many steps between two validations as a large one.
    per_epoch = config.max_windows_per_epoch or len(train.origins)
    # Every rank takes the same number of steps, or DDP's all-reduce would wait forever.
    steps_per_epoch = max(1, per_epoch // (config.batch_size * world.world_size))
    # Warm up over at most one epoch, so that small data sets train from their first epoch.
    warmup_steps = min(config.warmup_steps, steps_per_epoch)
    groups = _parameter_groups(model, config)
    step_weights = horizon_weights(mc, device)
    autocast = bf16_autocast(device, config.bf16)
    rng = np.random.default_rng(config.seed)  # same on every rank: ranks shard one permutation
    # Augmentations draw as much as their batch holds (frequency masking one row per complete
    # window): from the order's stream on other ranks, they would desync the permutation the
    # ranks shard. One process keeps the one stream, so runs replay to the digit.
    augment_rng = rng if world.world_size == 1 else np.random.default_rng([config.seed, world.rank])
    outage_span = config.outage_seasons * (mc.season_length or mc.patch)

    def evaluate() -> float:
        return evaluate_loss(model, WindowSet(val.panel, val_origins), config, device, world)

    average = _WeightAverage(model, config.ema_decay) if config.ema_decay else None
    history: list[EpochLog] = []
    initial = evaluate() if has_val else None
    if world.is_main and initial is not None:
        logger.info("epoch 0 (before gradient training) val_loss=%.5f", initial)
    best_loss, best_epoch, best_state = (initial if has_val else math.inf), 0, _snapshot(model)
    optimizer = _adamw(groups, config.learning_rate, device)
    lr_factor, decays, stale, step = 1.0, 0, 0, 0
    replay = config.replay_lr_factors
    is_replay = replay is not None
    path: list[float] = []  # lr factor of each epoch the current weights went through
    restarts: list[int] = []  # positions in path that started fresh AdamW moments
    best_path = 0  # len(path) when the best weights were taken
    started = time.perf_counter()
    stopped_early = out_of_time = False
    n_epochs = len(replay) if is_replay else config.max_epochs
    for epoch in range(1, n_epochs + 1):
        epoch_started = time.perf_counter()
        if is_replay:
            given = config.replay_restarts
            restart = replay[epoch - 1] != lr_factor if given is None else epoch - 1 in given
            if epoch > 1 and restart:  # as after a restore
                optimizer = _adamw(groups, config.learning_rate, device)
            lr_factor = replay[epoch - 1]
        # A replay's factors hold the cooldown already.
        rate = lr_factor if is_replay else lr_factor * cooldown(epoch, n_epochs, config)
        path.append(rate)
        model.train()
        needed = steps_per_epoch * config.batch_size * world.world_size
        passes = -(-needed // len(train.origins))
        order = np.concatenate([rng.permutation(train.origins) for _ in range(passes)])[:needed]
        shard = order[world.rank :: world.world_size]
        # Summed on the device: reading a loss every step would make the host wait for the
        # GPU each step (the bar reads it every PROGRESS_EVERY steps, the epoch's end once).
        running, seen = torch.zeros((), dtype=torch.float64, device=device), 0
        bar = tqdm(
            range(steps_per_epoch),
            desc=f"{'replay ' if is_replay else ''}epoch {epoch}/{n_epochs}",
            disable=not (config.progress and world.is_main),
            leave=False,
        )
        for batch_index in bar:
            step += 1
            warmup = min(1.0, step / warmup_steps) if warmup_steps else 1.0
            learning_rate = config.learning_rate * rate * warmup
            for group in optimizer.param_groups:
                group["lr"] = learning_rate * group["lr_scale"]
            origins = shard[batch_index * config.batch_size : (batch_index + 1) * config.batch_size]
            batch = gather_windows(train.panel, origins, mc.context_length, mc.prediction_length)
            if config.frequency_mask_probability:
                batch = with_frequency_masking(
                    batch,
                    config.frequency_mask_probability,
                    config.frequency_mask_rate,
                    augment_rng,
                )
            if config.outage_probability:
                batch = with_outages(batch, config.outage_probability, outage_span, augment_rng)
            batch = batch.to(device)
            with autocast:
                output, _ = train_module(
                    batch.past_values,
                    batch.past_observed_mask,
                    batch.past_covariates,
                    batch.future_covariates,
                )
            loss, _ = window_loss(_float(output), batch, mc, step_weights)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            # Dropped rather than never computed (requires_grad): torch.compile guards on
            # requires_grad and would compile the training graph again for the tail epoch.
            # AdamW and the clipping skip a parameter without a gradient.
            for parameter in () if frozen is None else frozen.parameters():
                parameter.grad = None
            if config.grad_clip:
                nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            if average is not None:
                average.update()
            running += loss.detach()
            seen += 1
            if not bar.disable and seen % PROGRESS_EVERY == 0:
                bar.set_postfix(loss=f"{running.item() / seen:.4f}")
        bar.close()
        train_loss = _mean_across_ranks(running.item() / max(seen, 1), world, device)
        if is_replay and not math.isfinite(train_loss):
            # A replay keeps its last weights whatever they are: NaN ones would forecast NaN.
            raise TrainingDivergedError(
                f"replayed epoch {epoch} of {n_epochs}: training loss {train_loss}, expected a "
                "finite one; the path validation kept does not replay on this data"
            )
        # Judged (and kept) with the averaged weights when there are any.
        with average.applied() if average is not None else nullcontext():
            val_loss = evaluate() if has_val else None
            monitored = val_loss if val_loss is not None else train_loss
            is_best = monitored < best_loss or is_replay  # a replay keeps every epoch
            if is_best:
                best_loss, best_epoch, stale, best_path = monitored, epoch, 0, len(path)
                if not is_replay:  # the replay's last weights are its result: no copies needed
                    best_state = _snapshot(model)
        if not is_best:
            stale += 1
        history.append(
            EpochLog(
                epoch,
                train_loss,
                val_loss,
                config.learning_rate * rate,
                time.perf_counter() - epoch_started,
                is_best,
            )
        )
        if world.is_main:
            logger.info(
                "epoch %d train_loss=%.5f val_loss=%s lr=%.2g (%.1fs)",
                epoch,
                train_loss,
                "n/a" if val_loss is None else f"{val_loss:.5f}",
                config.learning_rate * rate,
                history[-1].seconds,
            )
            for callback in callbacks:
                callback(history[-1])
        if stale >= config.patience and not is_replay:
            if decays >= config.max_lr_decays:
                stopped_early = True
                break
            # A plateau: go back to the best weights and take smaller steps from there.
            decays, stale = decays + 1, 0
            lr_factor *= config.lr_decay
            model.load_state_dict(best_state)
            if average is not None:
                average.reset()
            del path[best_path:]
            restarts = [r for r in restarts if r < best_path] + [best_path]
            optimizer = _adamw(groups, config.learning_rate * lr_factor, device)
        if config.max_train_seconds is not None and not is_replay and epoch < n_epochs:
            longest = max(log.seconds for log in history)
            overrun = time.perf_counter() - clock + longest > config.max_train_seconds
            # Every rank stops together, or the others would wait for it forever.
            if _mean_across_ranks(float(overrun), world, device) > 0:
                out_of_time = True
                if world.is_main:
                    logger.info(
                        "training budget of %gs: no time for epoch %d (the longest took %.1fs)",
                        config.max_train_seconds,
                        epoch + 1,
                        longest,
                    )
                break

    if not (is_replay and best_epoch):
        model.load_state_dict(best_state)
    elif average is not None:
        average.copy_to_model()
    model.eval()
    model.padding_factor.copy_(padding_factor)
    impute_padding = config.impute_padding or (False,) * N_HISTORY_BANDS
    if config.impute_padding is None and has_val and model.linear_start is not None:
        impute_padding = choose_padding_imputation(
            model, WindowSet(val.panel, val_origins), config, device, world
        )
        _log_per_band("left padding", ["imputed" if i else "mean" for i in impute_padding], world)
    model.padding_imputed.copy_(torch.tensor(impute_padding))
    drift_weight = config.drift_weight
    if drift_weight is None:
        drift_weight = 0.0
        if has_val:
            drift_weight = choose_drift_weight(
                model, WindowSet(val.panel, val_origins), config, device, world
            )
            if world.is_main:
                logger.info("drift weight %g, chosen on the validation windows", drift_weight)
    model.drift_weight.fill_(drift_weight)
    # The intervals are calibrated on the forecasts users get (short histories imputed or not,
    # blended with drift).
    interval_scale = config.interval_scale or (1.0,) * N_HISTORY_BANDS
    if model.quantile_head is not None and config.interval_scale is None and has_val:
        interval_scale = calibrate_intervals(
            model, WindowSet(val.panel, val_origins), config, device, world
        )
        _log_per_band("interval scales", [f"{f:.3g}" for f in interval_scale], world)
    model.interval_scale.copy_(torch.tensor(interval_scale))
    return TrainResult(
        epochs=history,
        best_epoch=best_epoch,
        best_val_loss=best_loss if has_val else None,
        seconds=time.perf_counter() - started,
        device=str(device),
        world_size=world.world_size,
        stopped_early=stopped_early,
        out_of_time=out_of_time,
        n_train_windows=len(train.origins),
        n_val_windows=len(val_origins),
        initial_val_loss=initial,
        linear_start_ridge=None if start is None else start.ridge,
        linear_start_prior=None if start is None else start.prior,
        kept_lr_factors=tuple(path[:best_path]),
        kept_restarts=tuple(r for r in restarts if r < best_path),
        interval_scale=interval_scale,
        impute_padding=impute_padding,
        drift_weight=drift_weight,
    )


def _log_per_band(what: str, values: Sequence[str], world: _Distributed) -> None:
    if world.is_main:
        chosen = ", ".join(f"{b} {v}" for b, v in zip(HISTORY_BANDS, values, strict=True))
        logger.info("%s: %s, chosen on the validation windows", what, chosen)


def _float(output: NormalizedOutput) -> NormalizedOutput:
    """Losses in float32, whatever the autocast dtype of the forward pass."""
    quantiles = None if output.quantiles is None else output.quantiles.float()
    drift = None if output.drift is None else output.drift.float()
    return NormalizedOutput(
        output.mean.float(), quantiles, output.draft.float(), output.stats, drift
    )


def _mean_across_ranks(value: float, world: _Distributed, device: torch.device) -> float:
    if not world.enabled:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return float(tensor.item() / world.world_size)


def _shard(origins: np.ndarray, world: _Distributed) -> np.ndarray:
    """This rank's share of `origins`, in the order `_forecast_batches` forecasts them."""
    return origins[world.rank :: world.world_size]


def _forecast_batches(
    model: PatchTransformer,
    windows: WindowSet,
    config: TrainConfig,
    device: torch.device,
    world: _Distributed,
    history: np.ndarray | None = None,
) -> Iterator[tuple[WindowBatch, NormalizedOutput]]:
    """This rank's share of `windows`, forecast in eval mode, one predict batch at a time;
    with `history` (W,), each window cut to that many steps of history (`with_history`)."""
    mc = model.config
    model.eval()
    shard = _shard(windows.origins, world)
    kept = None if history is None else _shard(history, world)
    for begin in range(0, len(shard), config.predict_batch_size):
        chunk = shard[begin : begin + config.predict_batch_size]
        batch = gather_windows(windows.panel, chunk, mc.context_length, mc.prediction_length).to(
            device
        )
        if kept is not None:
            keep = torch.from_numpy(kept[begin : begin + config.predict_batch_size]).to(device)
            batch = with_history(batch, keep)
        output, _ = model(
            batch.past_values,
            batch.past_observed_mask,
            batch.past_covariates,
            batch.future_covariates,
        )
        yield batch, _float(output)


@torch.inference_mode()
def evaluate_loss(
    model: PatchTransformer,
    windows: WindowSet,
    config: TrainConfig,
    device: torch.device,
    world: _Distributed | None = None,
) -> float:
    """Mean point loss over the given windows, in series units (sharded across ranks under DDP).

    Validation watches the point forecast alone, every horizon step alike: the quantile term of
    the objective keeps falling while the intervals widen, which would hide a point forecast
    getting worse.
    """
    world = world or _Distributed()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # weighted loss sum, weight sum
    for batch, output in _forecast_batches(model, windows, config, device, world):
        _, loss = window_loss(output, batch, model.config)
        weight = batch.future_observed_mask.sum()
        total[0] += loss.double() * weight
        total[1] += weight
    if world.enabled:
        dist.all_reduce(total)
    return float(total[0] / total[1].clamp(min=1))


@dataclass(frozen=True)
class BandSums:
    """Per band of history, sums of a per-window measure (bands, K) and observed targets
    (bands,): over the windows as they are, and with the copies cut into the short bands."""

    natural: torch.Tensor
    natural_targets: torch.Tensor
    pooled: torch.Tensor
    pooled_targets: torch.Tensor


def _band_sums(
    model: PatchTransformer,
    windows: WindowSet,
    config: TrainConfig,
    device: torch.device,
    world: _Distributed,
    measure: Callable[[WindowBatch, NormalizedOutput], torch.Tensor],
    width: int,
    padded_only: bool = False,
) -> BandSums:
    """`measure` (B, K = width) summed over the windows of each band of history
    (`history_band`). A band with fewer than CALIBRATION_MIN_TARGETS observed targets (new
    series seldom lend a validation window) adds copies of longer windows cut to random lengths
    inside it (`with_history`), the same lengths on every call. With `padded_only`, only windows whose
    history is shorter than the context count, and the last band (more than L/2) is cut too,
    to at most L - 1 steps; otherwise it holds every longer window and is never cut."""
    mc = model.config
    panel, origins = windows.panel, windows.origins
    history = origins - panel.offsets[panel.series_of(origins)]  # (W,) steps before each origin

    def sums(
        batches: Iterator[tuple[WindowBatch, NormalizedOutput]],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        total = torch.zeros(N_HISTORY_BANDS, width, dtype=torch.float64, device=device)
        targets = torch.zeros(N_HISTORY_BANDS, dtype=torch.float64, device=device)
        for batch, output in batches:
            band = history_band(batch.past_observed_mask)  # (B,)
            total.index_add_(0, band, measure(batch, output).double())
            targets.index_add_(0, band, batch.future_observed_mask.sum(dim=-1).double())
        if world.enabled:
            dist.all_reduce(total)
            dist.all_reduce(targets)
        return total, targets

    natural = origins[history < mc.context_length] if padded_only else origins
    batches = _forecast_batches(model, WindowSet(panel, natural), config, device, world)
    inside, targets = sums(batches)
    pooled, pooled_targets = inside.clone(), targets.clone()
    last = mc.context_length - 1 if padded_only else None
    bounds = [0, *(int(edge * mc.context_length) for edge in HISTORY_EDGES), last]
    for band in range(N_HISTORY_BANDS):
        shortest, longest = max(bounds[band] + 1, 2), bounds[band + 1]
        if longest is None or targets[band] >= CALIBRATION_MIN_TARGETS or shortest > longest:
            continue
        longer = evenly_spaced(origins[history > longest], CALIBRATION_WINDOWS)
        if len(longer) == 0:
            continue
        # The same lengths on every rank: each shards one draw.
        cut_to = np.random.default_rng(band).integers(shortest, longest + 1, len(longer))
        cut, cut_targets = sums(
            _forecast_batches(model, WindowSet(panel, longer), config, device, world, cut_to)
        )
        pooled[band] += cut[band]
        pooled_targets[band] += cut_targets[band]
    return BandSums(inside, targets, pooled, pooled_targets)


@torch.inference_mode()
def calibrate_intervals(
    model: PatchTransformer,
    windows: WindowSet,
    config: TrainConfig,
    device: torch.device,
    world: _Distributed | None = None,
) -> tuple[float, ...]:
    """Per band of history (`history_band`), the factor of INTERVAL_SCALES on the quantiles'
    offsets from the point forecast under which the band between the lowest and the highest
    quantile holds the share of the observed targets it is meant to hold (0.8 for 0.1-0.9).

    Intervals learned on the training windows come out narrow on windows the model has not
    seen, where its errors are larger; a factor chosen on held-out windows corrects that (split
    conformal calibration, as CQR does for a band). They come out narrowest where the model
    sees least, so each band of history gets its own factor, chosen on the validation windows
    whose history falls in it, plus copies of longer ones cut into it when it has too few
    (`_band_sums`); with still too few it takes the factor of all the windows as they are.
    Every factor is 1 with fewer than two quantile levels or no scored target. The model's
    own scales must be 1.
    """
    world = world or _Distributed()
    mc = model.config
    ones = (1.0,) * N_HISTORY_BANDS
    if len(mc.quantiles) < 2:
        return ones
    scales = torch.tensor(INTERVAL_SCALES, dtype=torch.float64, device=device)  # (G,)
    nominal = mc.quantiles[-1] - mc.quantiles[0]

    def hits(batch: WindowBatch, output: NormalizedOutput) -> torch.Tensor:
        """(B, G + 1): scored targets inside the band under each factor, then scored targets.

        A window whose every observed target sits at its context's level (a constant or
        all-zero series that stays so) is inside any band, however narrow: it says nothing of
        the band's width, and counted it would shrink every other series' band (six all-zero
        series beside two seasonal ones brought theirs from 83 % to 6 % coverage)."""
        assert output.quantiles is not None, "calibrating a model without quantiles"
        mean = output.mean.double()  # (B, H)
        target = _normalized_target(batch, output.stats).double()  # (B, H)
        error = target - mean
        low = output.quantiles[..., 0].double() - mean  # (B, H) offsets, sorted
        high = output.quantiles[..., -1].double() - mean
        observed = batch.future_observed_mask
        at_level = ((target.abs() <= _AT_LEVEL) | ~observed).all(dim=-1, keepdim=True)  # (B, 1)
        scored = observed & ~at_level
        inside = [((error >= f * low) & (error <= f * high) & scored).sum(dim=-1) for f in scales]
        return torch.stack([*inside, scored.sum(dim=-1)], dim=-1)

    def best(counts: torch.Tensor) -> float:
        """The factor whose coverage is nearest the nominal share, from (G + 1,) counts."""
        coverage = counts[:-1] / counts[-1]
        return INTERVAL_SCALES[int(torch.argmin((coverage - nominal).abs()))]

    counts = _band_sums(model, windows, config, device, world, hits, len(scales) + 1)
    natural = counts.natural.sum(dim=0)
    if natural[-1] == 0:
        return ones
    return tuple(
        best(pooled) if pooled[-1] >= CALIBRATION_MIN_TARGETS else best(natural)
        for pooled in counts.pooled
    )


@torch.inference_mode()
def choose_padding_imputation(
    model: PatchTransformer,
    windows: WindowSet,
    config: TrainConfig,
    device: torch.device,
    world: _Distributed | None = None,
) -> tuple[bool, ...]:
    """Per band of history (`history_band`), whether forecasts impute the left padding
    (`impute_left_padding`) rather than read it as the mean: where imputing lowers the point
    loss of the band's validation windows whose history is shorter than the context, plus
    copies of longer ones cut into the band when it has too few (`_band_sums`).

    Which reading forecasts better depends on the data: a model trained on long series that
    forecasts a series one point short moves its draft when the oldest lag reads the mean
    (M4 Hourly: 6 % of OWA), while a catalogue that trained on its short series learned its
    corrections for the mean (docs/model-choices.md). `padding_factor` must be installed;
    `padding_imputed` is left as it was.
    """
    world = world or _Distributed()
    loss = model.config.loss

    def errors(batch: WindowBatch, output: NormalizedOutput) -> torch.Tensor:
        """(B, 1) point loss summed over each window's observed targets, in series units."""
        unit = (output.stats.scale / batch.loss_scale).double()  # (B, 1)
        error = (output.mean.double() - _normalized_target(batch, output.stats)) * unit
        per_step = point_loss_per_step(error, loss) * batch.future_observed_mask
        return per_step.sum(dim=-1, keepdim=True)

    kept, losses = model.padding_imputed.clone(), []
    for impute in (False, True):
        model.padding_imputed.fill_(impute)
        losses.append(_band_sums(model, windows, config, device, world, errors, 1, True).pooled)
    model.padding_imputed.copy_(kept)
    mean_read, imputed = losses
    return tuple(bool(i < m) for i, m in zip(imputed[:, 0], mean_read[:, 0], strict=True))


@torch.inference_mode()
def choose_drift_weight(
    model: PatchTransformer,
    windows: WindowSet,
    config: TrainConfig,
    device: torch.device,
    world: _Distributed | None = None,
) -> float:
    """The weight of DRIFT_WEIGHTS under which the point forecast, moved that share of the way
    to the drift forecast (`PatchTransformer.drift_weight`), has the lowest point loss over the
    validation windows' observed targets, each series' errors counted in MASE's unit (its
    in-sample change over a season, `mase_units`); the smallest such weight on a tie, 0
    without a scored target.

    Combining a model with a simple method chosen on held-out windows is what won the M
    competitions (Makridakis et al., IJF 2020). The network, fitted to many short series at
    once, extrapolates their trends less than the drift method does; the blend gives back what
    validation says it misses, and stays at 0 where drift forecasts worse (docs/model-choices.md).
    The unit is the scale-free one forecasts are compared with the simple methods in (MASE:
    Hyndman and Koehler, IJF 2006), not the training loss's RMS: the RMS of a series that has
    trended far from its start is mostly its level, so counted against it the errors the blend
    is for weighed least. `model.drift_weight` is left as it was.
    """
    world = world or _Distributed()
    weights = torch.tensor(DRIFT_WEIGHTS, dtype=torch.float64, device=device)  # (G,)
    totals = torch.zeros(len(DRIFT_WEIGHTS), dtype=torch.float64, device=device)
    panel = windows.panel
    per_series = mase_units(
        panel.values, panel.offsets, model.config.season_length or 1, panel.loss_scale
    )  # (S,)
    window_units = torch.from_numpy(per_series[panel.series_of(_shard(windows.origins, world))])
    kept = model.drift_weight.clone()
    model.drift_weight.zero_()
    done = 0
    try:
        for batch, output in _forecast_batches(model, windows, config, device, world):
            assert output.drift is not None, "an eval-mode forward gives the drift forecast"
            size = batch.past_values.shape[0]
            series_unit = window_units[done : done + size, None].to(device)  # (B, 1)
            done += size
            unit = output.stats.scale.double() / series_unit  # (B, 1): normalised -> MASE units
            target = _normalized_target(batch, output.stats)  # (B, H)
            mean, drift = output.mean.double(), output.drift.double()
            # (G, B, H): each weight's blend, its errors counted in MASE units
            blended = mean + weights[:, None, None] * (drift - mean)
            per_step = point_loss_per_step((blended - target) * unit, model.config.loss)
            totals += (per_step * batch.future_observed_mask).sum(dim=(1, 2))
    finally:
        model.drift_weight.copy_(kept)
    if world.enabled:
        dist.all_reduce(totals)
    return DRIFT_WEIGHTS[int(torch.argmin(totals))]
