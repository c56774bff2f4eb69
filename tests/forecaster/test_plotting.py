"""Forecast and attention plots write readable PNGs."""

from __future__ import annotations

import numpy as np
import pytest

from forecaster.baselines import SeasonalNaive
from forecaster.errors import InvalidConfigError
from forecaster.outputs import AttentionMaps
from forecaster.plotting import plot_attention, plot_forecast
from forecaster.synthetic import generate_synthetic

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plot_forecast_writes_png(tmp_path):
    df = generate_synthetic(n_series=3, n_steps=24 * 10, seed=5)
    history = df.groupby("unique_id").head(24 * 9)
    actuals = df.groupby("unique_id").tail(24)
    forecast = SeasonalNaive().fit(history).predict(history, horizon=24)
    path = plot_forecast(history, forecast, tmp_path / "plots" / "forecast.png", actuals=actuals)
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    one = plot_forecast(history, forecast, tmp_path / "one.png", series_ids=["series_001"])
    assert one.stat().st_size > 5_000
    with pytest.raises(InvalidConfigError, match="nope"):
        plot_forecast(history, forecast, tmp_path / "x.png", series_ids=["nope"])


def _rows(rng, shape, causal=False):
    w = rng.random(shape)
    if causal:
        w = w * np.tril(np.ones(shape[-2:]))
    return w / w.sum(axis=-1, keepdims=True)


def test_plot_attention_writes_png(tmp_path):
    rng = np.random.default_rng(0)
    maps = AttentionMaps(
        series_ids=["a", "b"],
        encoder=[_rows(rng, (2, 4, 12, 12)) for _ in range(2)],
        decoder_self=[_rows(rng, (2, 4, 6, 6), causal=True)],
        cross=[_rows(rng, (2, 4, 6, 12))],
        context_starts=["2024-01-01T00:00:00", "2024-01-01T00:00:00"],
        patch_length=16,
        patch_stride=8,
    )
    path = plot_attention(maps, tmp_path / "attention.png", series_index=1)
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    with pytest.raises(InvalidConfigError, match="series_index"):
        plot_attention(maps, tmp_path / "bad.png", series_index=2)
    with pytest.raises(InvalidConfigError, match="layer"):
        plot_attention(maps, tmp_path / "bad.png", layer=3)
