"""Integer ds through the pipelines: retrained, registered, forecast and monitored as steps."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipelines.cli import main
from tests.pipelines.pipeline_helpers import TINY_MODEL, client_for, config_file

STEP, SEASON = 10, 12


def steps_csv(path, n_steps: int = 240, seed: int = 0):
    rng = np.random.default_rng(seed)
    t = np.arange(n_steps)
    frame = pd.concat(
        [
            pd.DataFrame(
                {
                    "unique_id": f"s{k}",
                    "ds": STEP * t,
                    "y": 5 + k + np.sin(2 * np.pi * t / SEASON) + rng.normal(0, 0.1, n_steps),
                }
            )
            for k in range(4)
        ],
        ignore_index=True,
    )
    frame.to_csv(path, index=False)
    return frame


def test_retrain_predict_and_monitor_integer_steps(tmp_path, capsys):
    steps_csv(tmp_path / "steps.csv")
    config = config_file(
        tmp_path,
        model={**TINY_MODEL, "season_length": SEASON, "patch_length": SEASON},
        backtest_windows=2,
    )
    assert main(["retrain", "--config", str(config), "--data", str(tmp_path / "steps.csv")]) == 0
    run = client_for(tmp_path).search_runs(["1"], order_by=["start_time DESC"])[0]
    assert run.data.params["data.freq"] == "10ns"
    assert run.data.params["data.end"] == str(STEP * 239)  # the step, not a 1970 timestamp
    assert run.data.params["split.val_end"].isdigit()

    out = tmp_path / "forecast.csv"
    code = main(
        [
            "predict",
            "--config",
            str(config),
            "--input",
            str(tmp_path / "steps.csv"),
            "--output",
            str(out),
        ]
    )
    assert code == 0
    forecast = pd.read_csv(out)
    assert forecast["ds"].dtype == np.int64
    assert sorted(forecast["ds"].unique()) == [STEP * (240 + k) for k in range(12)]

    # The actuals arrive; the logged forecasts are scored on the steps they were made for.
    later = steps_csv(tmp_path / "later.csv", n_steps=252, seed=0)
    assert len(later) == 4 * 252
    capsys.readouterr()
    code = main(["monitor", "--config", str(config), "--data", str(tmp_path / "later.csv")])
    assert code == 0
    printed = capsys.readouterr().out
    assert "48 point(s), 4 series, to 2510" in printed
