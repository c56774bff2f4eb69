"""The accelerator paths, proven on CPU: bfloat16 autocast and torch.compile."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from forecaster import Forecaster, ModelConfig, TrainConfig
from tests.forecaster.conftest import TINY_MODEL, TINY_TRAIN


def _fit(series, **train) -> Forecaster:
    return Forecaster(ModelConfig(**TINY_MODEL), TrainConfig(**{**TINY_TRAIN, **train})).fit(series)


def _relative_gap(a, b, series) -> float:
    return float(np.abs(a["mean"] - b["mean"]).mean() / series["y"].std())


def test_bf16_autocast_trains_and_predicts_close_to_float32(series):
    """bf16=True autocasts on any device, so the CUDA path's numerics are exercised on CPU."""
    float32 = _fit(series, bf16=False)
    bf16 = _fit(series, bf16=True)
    reference = float32.predict(series)
    assert np.isfinite(bf16.predict(series)["mean"]).all()
    # trained under bf16: the same model up to rounding in the forward passes
    assert _relative_gap(bf16.predict(series), reference, series) < 0.05
    # the float32 weights predicted under bf16: only the forward pass's rounding differs
    float32.train_config = dataclasses.replace(float32.train_config, bf16=True)
    under_bf16 = float32.predict(series)
    assert 0 < _relative_gap(under_bf16, reference, series) < 0.01


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="torch.compile on CPU needs a C compiler")
def test_torch_compile_trains_and_predicts_like_eager(series):
    eager = _fit(series)
    compiled = _fit(series, compile=True)
    assert compiled.train_result.best_epoch == eager.train_result.best_epoch
    # Kernels fused in another order round differently, and training carries it along: two
    # epochs at the full rate and the tail epoch move the validation loss by about 0.5 % and
    # the forecast by about 0.2 % of the data's spread.
    assert compiled.train_result.best_val_loss == pytest.approx(
        eager.train_result.best_val_loss, rel=1e-2
    )
    assert _relative_gap(compiled.predict(series), eager.predict(series), series) < 5e-3
