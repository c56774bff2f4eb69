"""The accelerator paths, proven on CPU: bfloat16 autocast and torch.compile."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pandas as pd
import pytest
from torch._dynamo.utils import counters

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
    counters.clear()
    compiled = _fit(series, compile=True)
    compiled.predict(series)
    # Two graphs, each compiled once: training's (the tail epoch's, with the quantile head
    # frozen, included) and forecasting's, with no graph break. A break or a recompile costs
    # minutes of compilation on CPU and a host sync a batch on a GPU.
    assert not counters["graph_break"]
    assert counters["stats"]["unique_graphs"] == 2
    assert compiled.train_result.best_epoch == eager.train_result.best_epoch
    # Kernels fused in another order round differently, and training carries it along: two
    # epochs at the full rate and the tail epoch move the validation loss by about 0.5 % and
    # the forecast by about 0.2 % of the data's spread.
    assert compiled.train_result.best_val_loss == pytest.approx(
        eager.train_result.best_val_loss, rel=1e-2
    )
    assert _relative_gap(compiled.predict(series), eager.predict(series), series) < 5e-3

    # The compiled forward computes what the eager one does, with the padding of a series
    # shorter than the context imputed (every band imputing), which it does without the
    # host reads that would break its graph.
    newcomer = series[series["unique_id"] == series["unique_id"].iloc[0]].tail(20)
    recent = pd.concat([series, newcomer.assign(unique_id="newcomer")], ignore_index=True)
    compiled.model.padding_imputed.fill_(True)
    assert compiled.model.imputes_padding()
    by_compiled = compiled.predict(recent)
    compiled.train_config = dataclasses.replace(compiled.train_config, compile=False)
    by_eager = compiled.predict(recent)
    assert _relative_gap(by_compiled, by_eager, series) < 1e-5
    compiled.model.padding_imputed.fill_(False)  # the newcomer's forecast reads its padding
    assert _relative_gap(compiled.predict(recent), by_eager, series) > 1e-3
