"""The training loop: determinism, early stopping, callbacks, distributed data parallel."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from forecaster import EpochLog, Forecaster, ModelConfig, TrainConfig, training
from forecaster.config import HISTORY_EDGES, N_HISTORY_BANDS
from forecaster.errors import TrainingDivergedError
from forecaster.forecaster import _hold_out_tail
from forecaster.model import PatchTransformer
from forecaster.training import (
    INTERVAL_SCALES,
    WindowSet,
    _WeightAverage,
    calibrate_intervals,
    choose_padding_imputation,
    evaluate_loss,
    resolve_device,
    train_model,
)
from forecaster.validation import validate_long_frame
from forecaster.windows import SeriesPanel, gather_windows, with_history
from tests.forecaster.conftest import TINY_MODEL, TINY_TRAIN

ROOT = Path(__file__).resolve().parents[2]


def test_training_is_deterministic_on_cpu(series):
    def weights():
        model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN)).fit(series)
        return model.model.state_dict()

    first, second = weights(), weights()
    for name, tensor in first.items():
        assert torch.equal(tensor, second[name]), name


def test_frequency_masking_when_asked_changes_training_and_stays_deterministic(series):
    def train_losses(probability: float) -> list[float]:
        config = TrainConfig(**{**TINY_TRAIN, "frequency_mask_probability": probability})
        model = Forecaster(ModelConfig(**TINY_MODEL), config).fit(series)
        return [log.train_loss for log in model.train_result.epochs]

    masked = train_losses(1.0)
    assert masked == train_losses(1.0)
    assert masked != train_losses(0.0)


def test_an_epoch_is_max_windows_per_epoch_windows_however_few_the_data_holds(series):
    """A small catalogue takes as many steps between two validations as a large one: the epoch
    passes over its windows as often as it takes; 0 is one pass."""
    batches: list[int] = []

    def count(module, args, output):
        if isinstance(module, PatchTransformer) and module.training:
            batches.append(len(args[0]))

    def fit(windows_per_epoch: int) -> Forecaster:
        batches.clear()
        # No tail epoch, which would count its own batches when the epoch beats the start.
        config = TrainConfig(
            **{
                **TINY_TRAIN,
                "max_epochs": 1,
                "max_windows_per_epoch": windows_per_epoch,
                "tail_epochs": 0,
            }
        )
        return Forecaster(ModelConfig(**TINY_MODEL), config).fit(series)

    handle = torch.nn.modules.module.register_module_forward_hook(count)
    try:
        model = fit(64 * 40)
        assert model.train_result.n_train_windows < 64 * 40
        assert batches == [64] * 40
        model = fit(0)
        assert batches == [64] * (model.train_result.n_train_windows // 64)
    finally:
        handle.remove()


def test_an_epoch_reads_its_loss_off_the_device_once_not_every_step(series, monkeypatch):
    """On a GPU each read of a loss makes the host wait for the device; the reported training
    loss is still the mean of the epoch's step losses."""
    step_losses: list[torch.Tensor] = []
    reads = 0
    window_loss, item = training.window_loss, torch.Tensor.item

    def recorded(output, batch, config, weights=None):
        loss, point = window_loss(output, batch, config, weights)
        if weights is not None:  # training's call; validation passes no step weights
            step_losses.append(loss.detach().clone())
        return loss, point

    def counted(tensor):
        nonlocal reads
        reads += 1
        return item(tensor)

    monkeypatch.setattr(training, "window_loss", recorded)
    monkeypatch.setattr(torch.Tensor, "item", counted)
    config = TrainConfig(
        **{**TINY_TRAIN, "max_epochs": 1, "max_windows_per_epoch": 64 * 40, "tail_epochs": 0}
    )
    model = Forecaster(ModelConfig(**TINY_MODEL), config).fit(series)
    assert len(step_losses) == 40
    assert reads < 40
    monkeypatch.undo()
    expected = sum(loss.item() for loss in step_losses) / 40
    assert model.train_result.epochs[0].train_loss == pytest.approx(expected, rel=1e-12)


def test_callback_sees_every_epoch_and_the_best_one_is_marked(series):
    logs: list[EpochLog] = []
    config = TrainConfig(**{**TINY_TRAIN, "max_epochs": 3, "patience": 3})
    model = Forecaster(ModelConfig(**TINY_MODEL), config).fit(series, callbacks=[logs.append])
    assert [log.epoch for log in logs] == [1, 2, 3]
    assert all(log.val_loss is not None and log.train_loss > 0 for log in logs)
    result = model.train_result
    assert result.best_val_loss <= min(log.val_loss for log in logs)
    if result.best_epoch:  # otherwise the linear start (epoch 0) was never beaten
        assert logs[result.best_epoch - 1].val_loss == result.best_val_loss
        assert logs[result.best_epoch - 1].is_best


def test_a_training_budget_ends_training_between_epochs_with_the_best_weights(series):
    """A budget that leaves no time after the first epoch gives what one epoch gives; one
    with time to spare changes nothing."""
    budgets = {"max_epochs": 4, "patience": 4, "tail_epochs": 0}
    one_epoch = Forecaster(
        ModelConfig(**TINY_MODEL), TrainConfig(**{**TINY_TRAIN, **budgets, "max_epochs": 1})
    ).fit(series)
    config = TrainConfig(**{**TINY_TRAIN, **budgets, "max_train_seconds": 1e-3})
    budgeted = Forecaster(ModelConfig(**TINY_MODEL), config).fit(series)
    result = budgeted.train_result
    assert result.out_of_time and len(result.epochs) == 1
    pd.testing.assert_frame_equal(budgeted.predict(series), one_epoch.predict(series))

    ample = TrainConfig(**{**TINY_TRAIN, **budgets, "max_train_seconds": 3600.0})
    unbounded = TrainConfig(**{**TINY_TRAIN, **budgets})
    runs = [Forecaster(ModelConfig(**TINY_MODEL), c).fit(series) for c in (ample, unbounded)]
    assert not runs[0].train_result.out_of_time
    assert len(runs[0].train_result.epochs) == 4
    pd.testing.assert_frame_equal(runs[0].predict(series), runs[1].predict(series))


def test_training_that_cannot_beat_the_linear_start_keeps_it(series):
    """Plateaus restore the best weights and decay the rate; epoch 0 stays if never beaten."""
    linear = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**{**TINY_TRAIN, "max_epochs": 0}))
    linear.fit(series)
    # A learning rate this high makes every epoch worse than the linear start.
    config = TrainConfig(
        **{**TINY_TRAIN, "max_epochs": 20, "learning_rate": 5.0, "linear_start_lr_scale": 1.0}
    )
    model = Forecaster(ModelConfig(**TINY_MODEL), config).fit(series)
    result = model.train_result
    assert result.stopped_early
    # `patience` epochs per plateau, then stop
    assert len(result.epochs) == config.patience * (config.max_lr_decays + 1)
    rates = [round(log.learning_rate, 6) for log in result.epochs]
    assert rates == [r for r in (5.0, 1.5, 0.45) for _ in range(config.patience)]
    assert result.best_epoch == 0
    assert result.best_val_loss == result.initial_val_loss
    pd.testing.assert_frame_equal(model.predict(series), linear.predict(series))


def test_device_auto_picks_cuda_only_when_available(monkeypatch):
    # Both answers of the check, so the CUDA branch is proven on a machine without a GPU.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto").type == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto").type == "cpu"
    assert resolve_device("cpu").type == "cpu"


WORKER = """
import sys
from pathlib import Path
import torch.distributed as dist
from safetensors.torch import save_file
from forecaster import Forecaster, ModelConfig, TrainConfig
from forecaster.synthetic import generate_synthetic
from tests.forecaster.conftest import TINY_MODEL, TINY_TRAIN

out = Path(sys.argv[1])
model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN))
model.fit(generate_synthetic(n_series=4, n_steps=24 * 10, seed=0))
rank = dist.get_rank()
save_file({k: v.contiguous() for k, v in model.model.state_dict().items()}, out / f"rank{rank}.safetensors")
(out / f"rank{rank}.world").write_text(str(model.train_result.world_size))
"""


@pytest.mark.slow
def test_two_process_gloo_training_keeps_weights_synchronised(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        str(tmp_path),
    ]
    completed = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert (tmp_path / "rank0.world").read_text() == "2"
    rank0, rank1 = (
        load_file(tmp_path / "rank0.safetensors"),
        load_file(tmp_path / "rank1.safetensors"),
    )
    for name, tensor in rank0.items():
        assert torch.equal(tensor, rank1[name]), f"{name} differs between ranks"


def test_a_replay_retrains_along_the_kept_path(series):
    """kept_lr_factors replays the evaluated run: same windows and seed give the same weights."""
    model_config = ModelConfig(**TINY_MODEL)
    evaluated = Forecaster(
        model_config, TrainConfig(**{**TINY_TRAIN, "max_epochs": 4, "patience": 1})
    ).fit(series, val_df=series)
    result = evaluated.train_result
    # patience 1: every epoch that did not improve was restored away at once
    base = TrainConfig().learning_rate
    assert result.kept_lr_factors == tuple(
        e.learning_rate / base for e in result.epochs if e.is_best
    )
    factors = result.kept_lr_factors or (1.0,)
    refit = Forecaster(
        model_config, TrainConfig(**{**TINY_TRAIN, "replay_lr_factors": factors})
    ).fit(series)
    assert len(refit.train_result.epochs) == len(factors)
    assert [e.learning_rate for e in refit.train_result.epochs] == [
        TrainConfig().learning_rate * f for f in factors
    ]
    assert refit.train_result.kept_lr_factors == factors
    assert all(e.val_loss is None for e in refit.train_result.epochs)
    assert np.isfinite(refit.predict(series)["mean"]).all()


def test_the_kept_path_holds_the_stale_epochs_before_a_later_best(series, monkeypatch):
    """With patience 2 an epoch that did not improve stays on the weights' path when a later
    epoch improves without a restore between them; epochs restored away leave it. The
    validation losses are scripted so that each rule of the plateau schedule is exercised."""
    scripted = iter(
        # epoch 0, then 1 best, 2 stale, 3 best, 4-5 stale (restore to 3, rate x 0.3),
        # 6 best, 7-8 stale (restore to 6, rate x 0.09), 9-10 stale: stop
        [1.0, 0.9, 0.95, 0.8, 0.85, 0.86, 0.7, 0.75, 0.76, 0.74, 0.73]
    )
    monkeypatch.setattr(training, "evaluate_loss", lambda *args, **kwargs: next(scripted))
    config = TrainConfig(**{**TINY_TRAIN, "max_epochs": 20, "tail_epochs": 0})
    assert (config.patience, config.max_lr_decays, config.lr_decay) == (2, 2, 0.3)
    result = Forecaster(ModelConfig(**TINY_MODEL), config).fit(series, val_df=series).train_result
    assert [round(e.learning_rate / config.learning_rate, 6) for e in result.epochs] == [
        *[1.0] * 5,
        *[0.3] * 3,
        *[0.09] * 2,
    ]
    assert result.stopped_early and result.best_epoch == 6 and result.best_val_loss == 0.7
    assert result.kept_lr_factors == (1.0, 1.0, 1.0, 0.3)
    assert result.kept_restarts == (3,)  # the second restore's epochs were restored away
    assert next(scripted, None) is None  # every scripted loss was read, none more


def test_a_run_that_reaches_the_cap_cools_down_and_its_refit_replays_the_restarts(
    series, monkeypatch
):
    """The last cooldown_share of the epoch budget takes the rate down towards zero on top
    of the plateau's decays; a refit replays the rates and starts fresh AdamW moments only
    where the evaluated run did (after its restore), not at each step of the cooldown."""
    scripted = iter(
        # epoch 0, 1-2 best, 3-4 stale (restore to 2, rate x 0.3), 5-10 best
        [1.0, 0.9, 0.8, 0.85, 0.86, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
    )
    monkeypatch.setattr(training, "evaluate_loss", lambda *args, **kwargs: next(scripted))
    config = TrainConfig(
        **{**TINY_TRAIN, "max_epochs": 10, "cooldown_share": 0.3, "tail_epochs": 0}
    )
    model_config = ModelConfig(**TINY_MODEL)
    evaluated = Forecaster(model_config, config).fit(series, val_df=series)
    result = evaluated.train_result
    rates = [round(e.learning_rate / config.learning_rate, 6) for e in result.epochs]
    # int(0.3 x 10) = 3 cooling epochs at 3/4, 2/4 and 1/4 of the plateau's rate
    assert rates == [1.0] * 4 + [0.3] * 3 + [0.225, 0.15, 0.075]
    assert result.best_epoch == 10 and not result.stopped_early
    assert result.kept_lr_factors == pytest.approx((1.0, 1.0, 0.3, 0.3, 0.3, 0.225, 0.15, 0.075))
    assert result.kept_restarts == (2,)

    created = []
    adamw = training._adamw
    monkeypatch.setattr(training, "_adamw", lambda *args: created.append(1) or adamw(*args))
    refit = Forecaster(model_config, evaluated.refit_config()).fit(series)
    replayed = [e.learning_rate / config.learning_rate for e in refit.train_result.epochs]
    assert replayed == pytest.approx(result.kept_lr_factors)
    assert len(created) == 2  # the first epoch's optimiser and the restart at epoch index 2


def test_fit_trains_the_kept_weights_on_the_held_out_tail_too(series):
    """The tail validation judged on is the most recent data: after early stopping, the kept
    weights train tail_epochs more epochs on every window, the tail's included, at the last
    rate of their path; the quantile head and the interval factors stay as validation
    calibrated them, so the bands do not narrow to the tail's in-sample errors."""
    # Without a linear start any learning beats epoch 0, so an epoch is kept.
    model_config = ModelConfig(**{**TINY_MODEL, "linear_start": False})
    config = TrainConfig(
        **{**TINY_TRAIN, "max_epochs": 3, "learning_rate": 3e-3, "max_windows_per_epoch": 4096}
    )
    assert config.tail_epochs == 1
    kept = Forecaster(model_config, config).fit(series)
    judged = Forecaster(model_config, dataclasses.replace(config, tail_epochs=0)).fit(series)
    result, tail = kept.train_result, kept.train_result.tail
    assert judged.train_result.tail is None
    assert result.kept_lr_factors == judged.train_result.kept_lr_factors != ()
    assert result.best_val_loss == judged.train_result.best_val_loss
    assert tail.n_train_windows > result.n_train_windows  # the tail's windows train too
    assert [e.learning_rate for e in tail.epochs] == [
        config.learning_rate * result.kept_lr_factors[-1]
    ]
    assert tail.interval_scale == result.interval_scale
    assert not kept.predict(series)["mean"].equals(judged.predict(series)["mean"])
    kept_head, judged_head = kept.model.quantile_head, judged.model.quantile_head
    assert torch.equal(kept_head.weight, judged_head.weight)
    assert torch.equal(kept_head.bias, judged_head.bias)
    assert kept_head.weight.requires_grad  # left trainable for whoever fine-tunes it


def test_a_kept_linear_start_gets_no_tail_epochs(series):
    """Validation kept the linear start alone (no epoch beat it; here the learning rate is far
    too high): nothing trains unjudged."""
    train = TrainConfig(**{**TINY_TRAIN, "learning_rate": 10.0})
    model = Forecaster(ModelConfig(**TINY_MODEL), train).fit(series)
    assert model.train_result.best_epoch == 0
    assert model.train_result.kept_lr_factors == ()
    assert model.train_result.tail is None


@pytest.mark.parametrize("warm_start", [True, False])
def test_a_warm_start_goes_on_from_the_trained_linear_start(series, tiny_config, warm_start):
    """Training on from trained weights keeps their linear start; a cold start refits it."""
    panel = SeriesPanel.from_validated(validate_long_frame(series), tiny_config)
    windows = WindowSet(panel, panel.window_origins(tiny_config.prediction_length))
    model = PatchTransformer(tiny_config)
    with torch.no_grad():
        model.linear_start.weight.fill_(0.01)
    config = TrainConfig(**{**TINY_TRAIN, "replay_lr_factors": (1.0,), "linear_start_lr_scale": 0})
    train_model(model, windows, None, config, warm_start=warm_start)
    assert (model.linear_start.weight == 0.01).all().item() is warm_start


def test_a_given_val_df_is_never_trained_on(series):
    """With val_df the caller chose the split (as the pipelines and benchmarks.ltsf do): no
    tail epochs, the model kept is the one validation judged."""
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN)).fit(
        series, val_df=series
    )
    assert model.train_result.tail is None


def test_the_tail_epochs_add_the_held_out_windows_of_the_kinds_the_path_trained_on(series):
    """A series long enough to split trains on complete windows only, so its tail epochs add
    its held-out complete windows and no window whose targets run past its end; a series too
    short to split trained on those all along and keeps them."""
    mc = ModelConfig(**TINY_MODEL)
    h = mc.prediction_length
    first = series[series["unique_id"] == series["unique_id"].iloc[0]]
    short = first.head(h).assign(unique_id="new")  # one horizon: nothing to hold out
    panel = SeriesPanel.from_validated(validate_long_frame(pd.concat([first, short])), mc)
    train, val, tail = _hold_out_tail(panel, h)
    long_end, short_end = panel.offsets[1], panel.offsets[2]
    long_tail = tail.origins[tail.origins < long_end]
    assert (long_tail + h <= long_end).all()
    assert set(train.origins) | set(val.origins) <= set(tail.origins)
    assert set(long_tail) == set(panel.window_origins(h)[panel.window_origins(h) < long_end])
    short_tail = tail.origins[tail.origins >= long_end]
    assert (short_tail + h > short_end).all()  # every target of the short series' windows
    assert len(short_tail) == h - 1  # origins after each of its first h - 1 points


def _band_coverage(model: Forecaster, series: pd.DataFrame) -> float:
    """Share of the automatic validation windows' targets inside the 0.1-0.9 band."""
    mc = model.model_config
    panel = SeriesPanel.from_validated(validate_long_frame(series), mc)
    _, val, _ = _hold_out_tail(panel, mc.prediction_length)
    batch = gather_windows(panel, val.origins, mc.context_length, mc.prediction_length)
    with torch.inference_mode():
        output, _ = model.model(batch.past_values, batch.past_observed_mask)
    band = output.denormalize().quantiles
    truth = batch.future_values
    return float(((truth >= band[..., 0]) & (truth <= band[..., -1])).double().mean())


def _coverage_under(model: Forecaster, batch, band: int, factor: float) -> float:
    """Band coverage of `batch` with `factor` for the given band of history."""
    model.model.interval_scale[band] = factor
    with torch.inference_mode():
        output, _ = model.model(batch.past_values, batch.past_observed_mask)
    q = output.denormalize().quantiles
    truth = batch.future_values
    return float(((truth >= q[..., 0]) & (truth <= q[..., -1])).double().mean())


def test_each_band_of_history_gets_the_factor_that_holds_80_percent_there(series):
    """Windows cut to a short history (as a new series is) get their own factor, chosen on
    validation windows cut into their band; it holds 80 % there, where the factor of the
    windows as they are does not."""
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN)).fit(series)
    mc = model.model_config
    panel = SeriesPanel.from_validated(validate_long_frame(series), mc)
    _, val, _ = _hold_out_tail(panel, mc.prediction_length)
    scales = model.train_result.interval_scale
    assert len(set(scales)) > 1, scales
    batch = gather_windows(panel, val.origins, mc.context_length, mc.prediction_length)
    bounds = [0, *(int(edge * mc.context_length) for edge in HISTORY_EDGES)]
    rng = np.random.default_rng(123)  # other lengths than calibration drew
    closer = []
    for band, factor in enumerate(scales[:-1]):
        shortest, longest = max(bounds[band] + 1, 2), bounds[band + 1]
        if shortest > longest:  # band 0 of a 32-step context: at most one step of history
            continue
        keep = rng.integers(shortest, longest + 1, len(val.origins))
        short = with_history(batch, torch.from_numpy(keep))
        pooled = _coverage_under(model, short, band, scales[-1])
        own = _coverage_under(model, short, band, factor)
        assert abs(own - 0.8) <= abs(pooled - 0.8), (band, own, pooled, scales)
        closer.append(abs(own - 0.8) < abs(pooled - 0.8))
        if factor < INTERVAL_SCALES[-1]:  # else even the widest factor tried holds less
            assert abs(own - 0.8) < 0.05, (band, own, scales)
    assert any(closer), scales


def test_intervals_are_calibrated_on_the_forecasts_users_get(series):
    """With `impute_padding` short histories are forecast with their padding imputed, so their
    bands are calibrated on imputed forecasts: calibrating the fitted model again chooses the
    factors fit chose."""
    # tail_epochs=0: the model calibration saw.
    config = TrainConfig(**{**TINY_TRAIN, "tail_epochs": 0, "impute_padding": True})
    model = Forecaster(ModelConfig(**TINY_MODEL), config).fit(series)
    mc = model.model_config
    assert not torch.equal(model.model.padding_factor, torch.eye(mc.context_length + 1))
    panel = SeriesPanel.from_validated(validate_long_frame(series), mc)
    _, val, _ = _hold_out_tail(panel, mc.prediction_length)
    model.model.interval_scale.fill_(1.0)
    again = calibrate_intervals(model.model, val, model.train_config, torch.device("cpu"))
    assert again == model.train_result.interval_scale


def test_series_that_stay_at_their_level_do_not_narrow_the_others_bands(series):
    """All-zero and constant series are inside any band; counted, six of them beside two
    seasonal series brought the factor to its floor and those series' coverage to 6-22 %.
    Calibrating with them gives the factors calibrating without them gives."""
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN)).fit(series)
    model.model.interval_scale.fill_(1.0)
    mc, cpu = model.model_config, torch.device("cpu")

    def factors(frame: pd.DataFrame) -> tuple[float, ...]:
        panel = SeriesPanel.from_validated(validate_long_frame(frame), mc)
        _, val, _ = _hold_out_tail(panel, mc.prediction_length)
        return calibrate_intervals(model.model, val, model.train_config, cpu)

    one = series[series["unique_id"] == series["unique_id"].iloc[0]]
    still = [
        one.assign(unique_id=f"still-{k}", y=level)
        for k, level in enumerate([0.0, 0.0, 0.0, 5.0, 1e6, -3.0] * 4)
    ]
    alone = factors(series)
    assert factors(pd.concat([series, *still], ignore_index=True)) == alone


def test_each_band_reads_its_padding_the_way_its_validation_windows_forecast_best(series):
    """The fit's choice is what the validation windows say for the judged model; a factor
    that imputes nonsense is chosen in no band."""
    config = TrainConfig(**{**TINY_TRAIN, "tail_epochs": 0})
    model = Forecaster(ModelConfig(**TINY_MODEL), config).fit(series)
    mc, cpu = model.model_config, torch.device("cpu")
    panel = SeriesPanel.from_validated(validate_long_frame(series), mc)
    _, val, _ = _hold_out_tail(panel, mc.prediction_length)
    chosen = model.train_result.impute_padding
    assert choose_padding_imputation(model.model, val, config, cpu) == chosen
    assert tuple(model.model.padding_imputed.tolist()) == chosen  # left as the fit chose
    # An intercept row of 1e4 imputes the padding about 1e4 window deviations away.
    model.model.padding_factor[1:, 0] = 1e4
    assert choose_padding_imputation(model.model, val, config, cpu) == (False,) * N_HISTORY_BANDS


def test_a_narrow_band_is_widened_until_it_holds_80_percent(series):
    """The 0.1-0.9 band of a model whose intervals were learned too narrow (halved here) is
    widened until it holds 80 % of the validation targets, within one grid step."""
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN)).fit(series)
    with torch.no_grad():
        model.model.quantile_head.weight.mul_(0.5)
        model.model.quantile_head.bias.mul_(0.5)
    model.model.interval_scale.fill_(1.0)
    raw = _band_coverage(model, series)
    mc = model.model_config
    panel = SeriesPanel.from_validated(validate_long_frame(series), mc)
    _, val, _ = _hold_out_tail(panel, mc.prediction_length)
    scales = calibrate_intervals(model.model, val, model.train_config, torch.device("cpu"))
    model.model.interval_scale.copy_(torch.tensor(scales))
    calibrated = _band_coverage(model, series)
    # The validation windows see more than half a context of history: the last band's factor.
    scale = scales[-1]
    assert raw < 0.7 and scale > 1.5, (raw, scale)
    assert abs(calibrated - 0.8) < 0.03, (raw, calibrated, scale)
    # One step further either way would be further from 80 %.
    for neighbour in (scale * 0.95, scale / 0.95):
        model.model.interval_scale[-1] = neighbour
        assert abs(_band_coverage(model, series) - 0.8) >= abs(calibrated - 0.8) - 1e-12


def test_fit_widens_a_band_that_is_narrow_on_the_held_out_tail(series):
    """The held-out tail is noisier than the training windows (a change of regime): fit
    widens the band learned on the training windows until it holds 80 % of the tail."""
    rng = np.random.default_rng(0)
    tail = series.groupby("unique_id").cumcount(ascending=False) < 50
    spread = series.groupby("unique_id")["y"].transform("std")
    noisy = series.assign(y=series["y"] + tail * rng.normal(0, 0.3, len(series)) * spread)
    # The model judged on the tail, before it trains on the tail too.
    config = TrainConfig(**{**TINY_TRAIN, "tail_epochs": 0})
    model = Forecaster(ModelConfig(**TINY_MODEL), config).fit(noisy)
    scales = model.train_result.interval_scale
    assert scales[-1] > 1.2
    assert model.model.interval_scale.tolist() == pytest.approx(scales)
    assert abs(_band_coverage(model, noisy) - 0.8) < 0.03


def test_validation_windows_without_an_observed_target_leave_the_scale_at_1(series):
    """No evidence, no calibration: a held-out tail that is all missing keeps the band."""
    tail = series.groupby("unique_id").cumcount(ascending=False) < 50
    gappy = series.assign(y=series["y"].where(~tail))
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN)).fit(gappy)
    assert model.train_result.n_val_windows > 0
    assert model.train_result.interval_scale == (1.0,) * N_HISTORY_BANDS


def test_a_refit_of_the_linear_start_fits_it_on_every_window(series):
    """Replaying no epoch (the evaluated run kept its linear start) holds nothing out."""
    config = TrainConfig(**{**TINY_TRAIN, "replay_lr_factors": ()})
    model = Forecaster(ModelConfig(**TINY_MODEL), config).fit(series)
    evaluated = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN)).fit(series)
    result = model.train_result
    assert result.epochs == [] and result.n_val_windows == 0
    assert result.n_train_windows > evaluated.train_result.n_train_windows


def test_the_scale_widens_every_quantile_around_the_point_forecast(series):
    model = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**{**TINY_TRAIN, "max_epochs": 1}))
    model.fit(series)
    model.model.interval_scale.fill_(1.0)
    narrow = model.predict(series)
    model.model.interval_scale.fill_(2.0)
    wide = model.predict(series)
    pd.testing.assert_series_equal(wide["mean"], narrow["mean"])
    for column in ("q0.1", "q0.5", "q0.9"):
        np.testing.assert_allclose(
            wide[column] - wide["mean"], 2 * (narrow[column] - narrow["mean"]), rtol=1e-5, atol=1e-4
        )


def test_a_given_interval_scale_is_used_as_is(series):
    """What a refit does: it has no held-out windows and keeps the evaluated run's scale."""
    config = TrainConfig(**{**TINY_TRAIN, "replay_lr_factors": (1.0,), "interval_scale": 1.37})
    model = Forecaster(ModelConfig(**TINY_MODEL), config).fit(series)
    assert model.train_result.interval_scale == (1.37,) * N_HISTORY_BANDS
    assert model.model.interval_scale.tolist() == pytest.approx([1.37] * N_HISTORY_BANDS)
    one_per_band = (1.1, 1.2, 1.3, 1.4, 1.5, 1.6)
    config = dataclasses.replace(config, interval_scale=one_per_band)
    model = Forecaster(ModelConfig(**TINY_MODEL), config).fit(series)
    assert model.model.interval_scale.tolist() == pytest.approx(one_per_band)


def test_weight_average_follows_its_recursion_and_swaps_back():
    layer = torch.nn.Linear(2, 1, bias=False)
    average = _WeightAverage(layer, decay=0.5)
    start = layer.weight.detach().clone()
    steps = [torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, -1.0]]), torch.tensor([[0.0, 4.0]])]
    expected = start.clone()
    for k, weights in enumerate(steps, start=1):
        with torch.no_grad():
            layer.weight.copy_(weights)
        average.update()
        decay = min(0.5, (1 + k) / (10 + k))  # the ramp: 0.18, 0.25, 0.31, then 0.5
        expected = decay * expected + (1 - decay) * weights
    with average.applied():
        torch.testing.assert_close(layer.weight.detach(), expected)
    torch.testing.assert_close(layer.weight.detach(), steps[-1])  # its own weights again


def test_the_weights_returned_are_the_ones_validation_judged(series):
    """With weight averaging on (the default), best_val_loss is the returned model's loss."""
    config = TrainConfig(**{**TINY_TRAIN, "max_epochs": 3, "patience": 3, "tail_epochs": 0})
    assert config.ema_decay > 0
    model = Forecaster(ModelConfig(**TINY_MODEL), config).fit(series)
    result = model.train_result
    panel = SeriesPanel.from_validated(
        validate_long_frame(series, freq=model.freq, allow_missing=True), model.model_config
    )
    _, val, _ = _hold_out_tail(panel, model.model_config.prediction_length)
    loss = evaluate_loss(model.model, val, config, model.device)
    assert loss == pytest.approx(result.best_val_loss, rel=1e-6)


def test_a_replay_that_diverges_is_refused_and_the_tail_falls_back(series, tmp_path):
    """A replay keeps its last weights: at a learning rate that diverges they were NaN, and the
    refit forecast NaN (and saved, and was blamed on the code at load)."""
    diverging = {**TINY_TRAIN, "learning_rate": 1e6, "replay_lr_factors": (1.0,)}
    with pytest.raises(TrainingDivergedError, match="training loss nan"):
        Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**diverging)).fit(series)
    # The tail epoch after validation replays at the kept path's last rate: when it diverges
    # the judged weights stay, and forecast what they did.
    judged = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**{**TINY_TRAIN, "tail_epochs": 0}))
    judged.fit(series)
    tail = Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN))
    original = training.train_model

    def diverging_tail(model, windows, val, config, *args, **kwargs):
        if config.replay_lr_factors is not None:
            config = dataclasses.replace(config, learning_rate=1e6)
        return original(model, windows, val, config, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("forecaster.forecaster.train_model", diverging_tail)
        tail.fit(series)
    assert tail.train_result.tail is None
    pd.testing.assert_frame_equal(tail.predict(series), judged.predict(series))
    # A model whose weights hold NaN is not saved.
    with torch.no_grad():
        next(tail.model.parameters()).fill_(float("nan"))
    with pytest.raises(TrainingDivergedError, match="not saved"):
        tail.save(tmp_path / "nan")
    assert not (tmp_path / "nan" / "model.safetensors").exists()


def test_weight_decay_falls_on_weight_matrices_and_the_linear_start_has_its_own_rate(
    tiny_config,
):
    """nanoGPT's grouping: attention, feed-forward and embedding matrices decay; biases, norms
    and the horizon queries do not; the linear start neither decays nor moves at the full rate."""
    model = PatchTransformer(tiny_config)
    config = TrainConfig(weight_decay=0.05, linear_start_lr_scale=0.2)
    groups = training._parameter_groups(model, config)
    name_of = {id(p): name for name, p in model.named_parameters()}
    decay, no_decay, linear = ({name_of[id(p)] for p in g["params"]} for g in groups)
    assert [(g["weight_decay"], g["lr_scale"]) for g in groups] == [
        (0.05, 1.0),
        (0.0, 1.0),
        (0.0, 0.2),
    ]
    assert {"patch_embedding.weight", "point_head.weight", "naive_head.weight"} <= decay
    assert any(n.startswith("encoder.layers.0.self_attention.") for n in decay)
    assert any(n.startswith("decoder.layers.0.feed_forward.") for n in decay)
    assert all(name_of[id(p)] in decay for p in model.encoder.parameters() if p.dim() == 2)
    assert {"horizon_queries", "patch_embedding.bias", "encoder.norm.weight"} <= no_decay
    assert all(model.get_parameter(n).dim() == 1 for n in no_decay - {"horizon_queries"})
    assert linear == {"linear_start.weight", "linear_start.bias"}
    assert decay | no_decay | linear == set(name_of.values())
    assert len(decay) + len(no_decay) + len(linear) == len(name_of)  # each in one group only


@pytest.mark.parametrize("warmup_steps, reached", [(8, 8), (100, 16)])
def test_the_rate_warms_up_linearly_to_its_peak_within_an_epoch_then_holds_it(
    series, monkeypatch, warmup_steps, reached
):
    """Step s of the warmup runs at s / W of the peak, W at most one epoch's 16 steps; the
    linear start's group takes linear_start_lr_scale of the rate all along."""
    rates = []
    step = torch.optim.AdamW.step

    def recording(self, *args, **kwargs):
        rates.append(tuple(group["lr"] for group in self.param_groups))
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", recording)
    config = TrainConfig(**{**TINY_TRAIN, "warmup_steps": warmup_steps, "tail_epochs": 0})
    Forecaster(ModelConfig(**TINY_MODEL), config).fit(series)
    peak, scale = config.learning_rate, config.linear_start_lr_scale
    expected = [min(1.0, s / reached) * peak for s in range(1, 33)]  # 2 epochs of 16 steps
    assert [r[0] for r in rates] == pytest.approx(expected)
    assert [r[1] for r in rates] == pytest.approx(expected)
    assert [r[2] for r in rates] == pytest.approx([r * scale for r in expected])


def test_a_replay_logged_without_its_restarts_restarts_where_the_rate_changes(series, monkeypatch):
    """A replay whose run was logged before restarts were (replay_restarts None) starts fresh
    AdamW moments wherever its factor changes, as that run did after each restore, and at no
    epoch whose factor is the one before's."""
    created = []
    adamw = training._adamw
    monkeypatch.setattr(training, "_adamw", lambda *args: created.append(1) or adamw(*args))
    config = TrainConfig(**{**TINY_TRAIN, "replay_lr_factors": (1.0, 1.0, 0.3, 0.3)})
    Forecaster(ModelConfig(**TINY_MODEL), config).fit(series)
    assert len(created) == 2  # the first epoch's optimiser and the restart at the third


def test_a_second_restore_to_the_same_epoch_decays_again_and_counts_one_restart(
    series, monkeypatch
):
    """Two plateaus in a row restore the same best weights twice, each time at a smaller rate;
    the kept path restarts AdamW's moments there once, not once per restore."""
    scripted = iter(
        # epoch 0, 1 best, 2-3 stale (restore to 1, rate x 0.3), 4-5 stale (restore to 1
        # again, x 0.09), 6 best, 7-8 stale: stop
        [1.0, 0.9, 0.95, 0.96, 0.97, 0.98, 0.8, 0.85, 0.86]
    )
    monkeypatch.setattr(training, "evaluate_loss", lambda *args, **kwargs: next(scripted))
    config = TrainConfig(**{**TINY_TRAIN, "max_epochs": 20, "tail_epochs": 0})
    result = Forecaster(ModelConfig(**TINY_MODEL), config).fit(series, val_df=series).train_result
    assert [round(e.learning_rate / config.learning_rate, 6) for e in result.epochs] == [
        *[1.0] * 3,
        *[0.3] * 2,
        *[0.09] * 3,
    ]
    assert result.stopped_early and result.best_epoch == 6
    assert result.kept_lr_factors == pytest.approx((1.0, 0.09))
    assert result.kept_restarts == (1,)


def test_a_budget_that_runs_out_with_the_last_epoch_is_not_reported_as_cutting_training(
    series, caplog
):
    """out_of_time says epochs were left untrained: not when the budget's last epoch was the
    last there was to train."""
    config = TrainConfig(
        **{**TINY_TRAIN, "max_epochs": 1, "tail_epochs": 0, "max_train_seconds": 1e-6}
    )
    result = Forecaster(ModelConfig(**TINY_MODEL), config).fit(series).train_result
    assert len(result.epochs) == 1 and not result.out_of_time
    assert "no time for epoch" not in caplog.text


def test_without_validation_the_padding_is_read_as_the_mean_in_every_band(series):
    """A run with no validation windows (a replay not given its run's choice) has nothing to
    choose the padding's reading on: every band reads it as the mean, as training did."""
    config = TrainConfig(**{**TINY_TRAIN, "replay_lr_factors": (1.0,)})
    model = Forecaster(ModelConfig(**TINY_MODEL), config).fit(series)
    assert model.train_result.impute_padding == (False,) * N_HISTORY_BANDS
    assert not model.model.padding_imputed.any()


def trending(n_series: int = 24, seed: int = 0) -> pd.DataFrame:
    """Short yearly series on straight lines of their own level and slope, a little noise:
    what the drift method forecasts and a model of two epochs does not yet."""
    rng = np.random.default_rng(seed)
    frames = []
    for k in range(n_series):
        n = int(rng.integers(12, 30))
        t = np.arange(n)
        y = 100 + 50 * rng.random() + (2 + 8 * rng.random()) * t + rng.normal(0, 0.5, n)
        ds = pd.date_range("1990-01-01", periods=n, freq="YS")
        frames.append(pd.DataFrame({"unique_id": f"s{k}", "ds": ds, "y": y}))
    return pd.concat(frames, ignore_index=True)


def test_the_drift_weight_is_the_one_whose_blend_validates_best():
    """The fit's weight is the grid's argmin of the validation windows' mean absolute error,
    each series' errors over its MASE scale (the mean absolute one-step change of its
    history, the seasonal naive's in-sample error); on trending series that is a real blend,
    not 0."""
    data = trending()
    config = TrainConfig(**{**TINY_TRAIN, "tail_epochs": 0})
    model = Forecaster(ModelConfig(**TINY_MODEL), config).fit(data)
    chosen = model.train_result.drift_weight
    assert chosen > 0
    assert model.model.drift_weight.item() == chosen
    mc, cpu = model.model_config, torch.device("cpu")
    panel = SeriesPanel.from_validated(validate_long_frame(data), mc)
    _, val, _ = _hold_out_tail(panel, mc.prediction_length)
    batch = gather_windows(panel, val.origins, mc.context_length, mc.prediction_length)
    # Yearly data has no season: MASE's scale is each whole series' mean absolute step.
    steps = {
        k: np.abs(np.diff(panel.values[panel.offsets[k] : panel.offsets[k + 1]])).mean()
        for k in range(len(panel.series_ids))
    }
    scale = np.array([steps[k] for k in panel.series_of(val.origins)])[:, None]  # (W, 1)
    target = batch.future_values.numpy()
    observed = batch.future_observed_mask.numpy()
    errors = {}
    with torch.no_grad():
        for weight in training.DRIFT_WEIGHTS:
            model.model.drift_weight.fill_(weight)
            out, _ = model.model.eval()(batch.past_values, batch.past_observed_mask)
            forecast = out.denormalize().mean.double().numpy()
            errors[weight] = (np.abs(forecast - target) / scale)[observed].mean()
    assert errors[chosen] == pytest.approx(min(errors.values()), rel=1e-6)
    assert errors[chosen] < errors[0.0]
    model.model.drift_weight.fill_(0.5)
    assert training.choose_drift_weight(model.model, val, config, cpu) == chosen
    assert model.model.drift_weight.item() == 0.5  # left as it was


def test_a_series_level_does_not_weigh_in_the_drift_weight():
    """Counted in each series' MASE unit (its change, not its level), a series weighs the
    same in the choice wherever it sits. Half the series trend (drift forecasts them), half
    are noise about a level (drift follows their last reading, a poor guess): the same model
    chooses the same weight when the trending ones are lifted by 100,000. The forecasts and
    the drift move with the level, so only the unit could change the choice; counted against
    each series' RMS, the lifted series would weigh a thousandth and the noisy ones decide."""
    rng = np.random.default_rng(1)
    noisy = [
        pd.DataFrame(
            {
                "unique_id": f"n{k}",
                "ds": pd.date_range("1990-01-01", periods=25, freq="YS"),
                "y": 100 + rng.normal(0, 5, 25),
            }
        )
        for k in range(12)
    ]
    data = pd.concat([trending(12), *noisy], ignore_index=True)
    config = TrainConfig(**{**TINY_TRAIN, "tail_epochs": 0})
    model = Forecaster(ModelConfig(**TINY_MODEL), config).fit(data)
    mc, cpu = model.model_config, torch.device("cpu")
    choices = []
    for lift in (0.0, 1e5):
        trend = data["unique_id"].str.startswith("s")
        lifted = data.assign(y=np.where(trend, data["y"] + lift, data["y"]))
        panel = SeriesPanel.from_validated(validate_long_frame(lifted), mc)
        _, val, _ = _hold_out_tail(panel, mc.prediction_length)
        choices.append(training.choose_drift_weight(model.model, val, config, cpu))
    assert 0 < choices[0] == choices[1] == model.train_result.drift_weight


def test_seasonal_series_are_not_blended_with_drift(fitted):
    """Drift extrapolates a daily cycle's last swing: validation keeps the model's forecast."""
    assert fitted.train_result.drift_weight == 0.0
    assert fitted.model.drift_weight.item() == 0.0


def test_at_weight_one_a_short_series_is_forecast_by_the_drift_method():
    """The blend's other end is FPP3's drift method: the last value plus the mean step from
    the first observation (every series here is shorter than the drift span)."""
    data = trending()
    config = TrainConfig(**{**TINY_TRAIN, "max_epochs": 1, "drift_weight": 1.0})
    model = Forecaster(ModelConfig(**TINY_MODEL), config).fit(data)
    assert model.train_result.drift_weight == 1.0
    predicted = model.predict(data)
    for sid, history in data.groupby("unique_id"):
        y = history["y"].to_numpy()
        steps = np.arange(1, 9)
        expected = y[-1] + (y[-1] - y[0]) / (len(y) - 1) * steps
        got = predicted.loc[predicted["unique_id"] == sid, "mean"].to_numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-5, err_msg=sid)
        bands = predicted.loc[predicted["unique_id"] == sid, ["q0.1", "q0.9"]].to_numpy()
        assert (bands[:, 0] <= got).all() and (got <= bands[:, 1]).all(), sid


def test_training_never_applies_the_blend(series):
    """In training mode the network's own forecast is trained: a weight installed before a
    fit changes nothing of its losses, only what eval mode forecasts."""
    mc = ModelConfig(**TINY_MODEL)
    torch.manual_seed(0)
    model = PatchTransformer(mc)
    panel = SeriesPanel.from_validated(validate_long_frame(series), mc)
    batch = gather_windows(panel, panel.window_origins(mc.prediction_length)[:16], 32, 8)
    inputs = (batch.past_values, batch.past_observed_mask)
    model.train()
    torch.manual_seed(1)
    plain, _ = model(*inputs)
    model.drift_weight.fill_(0.7)
    torch.manual_seed(1)
    blended_in_training, _ = model(*inputs)
    assert torch.equal(plain.mean, blended_in_training.mean)
    assert blended_in_training.drift is None
    model.eval()
    out, _ = model(*inputs)
    model.drift_weight.zero_()
    base, _ = model(*inputs)
    torch.testing.assert_close(out.mean, torch.lerp(base.mean, base.drift, 0.7))
