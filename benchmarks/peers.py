"""NeuralForecast's models as the benchmarks' peers: one place for the settings they share.

Issue #7 runs the peers with their documented defaults but for `max_steps` 1000 and the robust
scaler; each benchmark sets `input_size` (`benchmarks.m4`: 7 * H; `benchmarks.ltsf`: the
protocol's lookback) and whatever else its data needs.
"""

from __future__ import annotations

from typing import Any

MAX_STEPS = 1000


def neuralforecast_model(
    name: str, horizon: int, input_size: int, seed: int, **settings: Any
) -> Any:
    """NeuralForecast's model `name` (NHITS, PatchTST, DLinear...) with the peers' settings;
    ImportError when the `peers` extra is not installed."""
    import neuralforecast.models

    return getattr(neuralforecast.models, name)(
        h=horizon,
        input_size=input_size,
        max_steps=MAX_STEPS,
        scaler_type="robust",
        random_seed=seed,
        enable_progress_bar=False,
        logger=False,
        **settings,
    )
