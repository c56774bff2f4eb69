"""The training loop.

AdamW with linear warmup and cosine decay, gradient clipping, early stopping on validation
loss with the best weights restored, bf16 autocast on CUDA, optional torch.compile, and
DistributedDataParallel when launched by `torchrun` (nccl on GPU, gloo on CPU).
"""

from __future__ import annotations

import copy
import logging
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from tqdm.auto import tqdm

from forecaster.config import ModelConfig, TrainConfig
from forecaster.model import PatchTransformer, forecast_loss, point_loss
from forecaster.windows import SeriesPanel, gather_windows

logger = logging.getLogger(__name__)

# Windows used for the least-squares start of the linear skip (evenly spaced).
LINEAR_INIT_WINDOWS = 50_000


@dataclass(frozen=True)
class EpochLog:
    """What a per-epoch callback receives."""

    epoch: int  # 1-based
    train_loss: float
    val_loss: float | None  # None when there is no validation data
    learning_rate: float  # at the end of the epoch
    seconds: float  # wall time of the epoch
    is_best: bool  # this epoch's weights are the best so far (kept)


@dataclass(frozen=True)
class TrainResult:
    epochs: list[EpochLog]
    best_epoch: int
    best_val_loss: float | None
    seconds: float
    device: str
    world_size: int
    stopped_early: bool = False
    n_train_windows: int = 0
    n_val_windows: int = 0


def resolve_device(name: str = "auto") -> torch.device:
    """ "auto" -> cuda when available, else cpu; anything else is passed to torch.device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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


def _lr_lambda(total_steps: int, warmup_steps: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def evenly_spaced(starts: np.ndarray, limit: int) -> np.ndarray:
    """At most `limit` of `starts`, evenly spaced over them (all of them when limit is 0)."""
    if limit == 0 or len(starts) <= limit:
        return starts
    return starts[np.linspace(0, len(starts) - 1, limit).round().astype(np.int64)]


def train_model(
    model: PatchTransformer,
    train_panel: SeriesPanel,
    val_panel: SeriesPanel | None,
    config: TrainConfig,
    callbacks: Sequence[Callable[[EpochLog], None]] = (),
) -> TrainResult:
    """Fit `model` in place on every stride-1 window of `train_panel`.

    The model ends with the weights of the epoch of lowest validation loss (or the last
    epoch when there is no validation data). Returns the per-epoch history.
    """
    mc: ModelConfig = model.config
    window = mc.context_length + mc.prediction_length
    train_starts = train_panel.window_starts(window)
    if len(train_starts) == 0:
        raise ValueError(
            "no training window: every series is shorter than context + prediction length"
        )
    val_starts = val_panel.window_starts(window) if val_panel is not None else np.empty(0, np.int64)
    val_starts = evenly_spaced(val_starts, config.max_val_windows)

    world, device = _setup_distributed(resolve_device(config.device))
    seed_everything(config.seed)
    if model.linear_skip is not None:
        init_starts = evenly_spaced(train_starts, LINEAR_INIT_WINDOWS)
        init = gather_windows(train_panel, init_starts, mc.context_length, mc.prediction_length)
        val_init = None
        if len(val_starts):
            val_init = gather_windows(
                val_panel,
                evenly_spaced(val_starts, LINEAR_INIT_WINDOWS),
                mc.context_length,
                mc.prediction_length,
            )
        linear_ridge = model.fit_linear_skip(
            init.past_values,
            init.future_values,
            None if val_init is None else val_init.past_values,
            None if val_init is None else val_init.future_values,
        )
        logger.info("linear start: ridge %g chosen on validation windows", linear_ridge)
    model.to(device)
    train_module: nn.Module = model
    if world.enabled:
        train_module = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    if config.compile:
        train_module = torch.compile(train_module)

    per_epoch = len(train_starts)
    if config.max_windows_per_epoch:
        per_epoch = min(per_epoch, config.max_windows_per_epoch)
    # Every rank takes the same number of steps, or DDP's all-reduce would wait forever.
    steps_per_epoch = max(1, per_epoch // (config.batch_size * world.world_size))
    total_steps = steps_per_epoch * config.max_epochs
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, _lr_lambda(total_steps, max(1, int(config.warmup_fraction * total_steps)))
    )
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda" and config.bf16
        else nullcontext()
    )
    rng = np.random.default_rng(config.seed)  # same on every rank: ranks shard one permutation

    history: list[EpochLog] = []
    best_loss, best_epoch, best_state = math.inf, 0, None
    if len(val_starts):
        # Epoch 0 is a candidate: training must beat the initial (linear) fit to replace it.
        best_loss = evaluate_loss(model, val_panel, val_starts, config, device, world)
        best_state = copy.deepcopy({k: v.detach().cpu() for k, v in model.state_dict().items()})
    epochs_without_improvement = 0
    started = time.perf_counter()
    stopped_early = False
    for epoch in range(1, config.max_epochs + 1):
        epoch_started = time.perf_counter()
        model.train()
        order = rng.permutation(train_starts)[
            : steps_per_epoch * config.batch_size * world.world_size
        ]
        shard = order[world.rank :: world.world_size]
        running, seen = 0.0, 0
        bar = tqdm(
            range(steps_per_epoch),
            desc=f"epoch {epoch}/{config.max_epochs}",
            disable=not (config.progress and world.is_main),
            leave=False,
        )
        for step in bar:
            starts = shard[step * config.batch_size : (step + 1) * config.batch_size]
            batch = gather_windows(train_panel, starts, mc.context_length, mc.prediction_length).to(
                device
            )
            with autocast:
                output, _ = train_module(
                    batch.past_values, batch.past_covariates, batch.future_covariates
                )
                loss = forecast_loss(output, batch.future_values, mc)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip:
                nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            scheduler.step()
            running += loss.item()
            seen += 1
            bar.set_postfix(loss=f"{running / seen:.4f}")
        bar.close()
        train_loss = _mean_across_ranks(running / max(seen, 1), world, device)
        val_loss = (
            evaluate_loss(model, val_panel, val_starts, config, device, world)
            if len(val_starts)
            else None
        )
        monitored = val_loss if val_loss is not None else train_loss
        is_best = monitored < best_loss
        if is_best:
            best_loss, best_epoch, epochs_without_improvement = monitored, epoch, 0
            best_state = copy.deepcopy({k: v.detach().cpu() for k, v in model.state_dict().items()})
        else:
            epochs_without_improvement += 1
        log = EpochLog(
            epoch,
            train_loss,
            val_loss,
            scheduler.get_last_lr()[0],
            time.perf_counter() - epoch_started,
            is_best,
        )
        history.append(log)
        if world.is_main:
            logger.info(
                "epoch %d train_loss=%.5f val_loss=%s (%.1fs)",
                epoch,
                train_loss,
                "n/a" if val_loss is None else f"{val_loss:.5f}",
                log.seconds,
            )
            for callback in callbacks:
                callback(log)
        if val_loss is not None and epochs_without_improvement >= config.patience:
            stopped_early = True
            break

    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return TrainResult(
        epochs=history,
        best_epoch=best_epoch,
        best_val_loss=best_loss if len(val_starts) else None,
        seconds=time.perf_counter() - started,
        device=str(device),
        world_size=world.world_size,
        stopped_early=stopped_early,
        n_train_windows=len(train_starts),
        n_val_windows=len(val_starts),
    )


def _mean_across_ranks(value: float, world: _Distributed, device: torch.device) -> float:
    if not world.enabled:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return float(tensor.item() / world.world_size)


@torch.inference_mode()
def evaluate_loss(
    model: PatchTransformer,
    panel: SeriesPanel,
    starts: np.ndarray,
    config: TrainConfig,
    device: torch.device,
    world: _Distributed | None = None,
) -> float:
    """Mean point-forecast loss over the given windows (sharded across ranks under DDP).

    Early stopping watches the point forecast alone: the quantile term of the objective keeps
    falling while the intervals widen, which would hide a point forecast getting worse.
    """
    world = world or _Distributed()
    mc = model.config
    model.eval()
    shard = starts[world.rank :: world.world_size]
    total = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, window count
    batch_size = config.predict_batch_size
    for begin in range(0, len(shard), batch_size):
        chunk = shard[begin : begin + batch_size]
        batch = gather_windows(panel, chunk, mc.context_length, mc.prediction_length).to(device)
        output, _ = model(batch.past_values, batch.past_covariates, batch.future_covariates)
        total[0] += point_loss(output, batch.future_values, mc).double() * len(chunk)
        total[1] += len(chunk)
    if world.enabled:
        dist.all_reduce(total)
    return float(total[0] / total[1].clamp(min=1))
