"""Training under torchrun (two CPU processes, gloo): the ranks shard each epoch's windows
without overlap, augmentations included, and the same script saves on every rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import torch.distributed as dist
    import forecaster.training as training
    from forecaster import Forecaster, ModelConfig, TrainConfig
    from forecaster.synthetic import generate_synthetic

    seen = []
    gather = training.gather_windows

    def recording(panel, origins, context, horizon):
        if horizon > 0 and len(origins) == 64:  # training batches, not validation
            seen.append(origins.copy())
        return gather(panel, origins, context, horizon)

    training.gather_windows = recording
    df = generate_synthetic(n_series=8, n_steps=24 * 14, freq="h", seed=0)
    model = Forecaster(
        ModelConfig(context_length=32, prediction_length=8, patch_length=4, d_model=16,
                    n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32),
        TrainConfig(max_epochs=3, patience=5, batch_size=64, max_windows_per_epoch=0,
                    tail_epochs=0, frequency_mask_probability=0.5, progress=False,
                    device="cpu"),
    ).fit(df)
    per_epoch = len(seen) // 3
    epochs = [np.concatenate(seen[e * per_epoch : (e + 1) * per_epoch]) for e in range(3)]
    shards = [None] * dist.get_world_size()
    dist.all_gather_object(shards, epochs)
    model.save(sys.argv[1])  # every rank runs the same line
    if dist.get_rank() == 0:
        overlap = [len(np.intersect1d(shards[0][e], shards[1][e])) for e in range(3)]
        mean = model.predict(df)["mean"].tolist()
        result = {"overlap": overlap, "windows": len(epochs[0]), "mean": mean}
        with open(sys.argv[2], "w") as out:
            json.dump(result, out)
    dist.barrier()
    dist.destroy_process_group()
    """
)
# torch 2.13's gloo backend on CPU aborts a rank at interpreter exit about one run in ten,
# after all its work, even in a script of a few lines without this library (a DDP Linear, a
# gather, destroy_process_group): torchrun then reports the rank killed by SIGABRT.
EXIT_ABORT = "terminate called without an active exception"


def _torchrun(source: str, tmp_path: Path, *args: str) -> None:
    """Run `source` as a script on two CPU ranks under torchrun; fail on a rank's error."""
    script = tmp_path / "train.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed beside this Python")
    done = subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node=2", str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 or EXIT_ABORT in done.stderr, done.stderr[-3000:]


def test_two_ranks_shard_every_epoch_and_one_save_serves_both(tmp_path):
    result_file = tmp_path / "result.json"
    _torchrun(SCRIPT, tmp_path, str(tmp_path / "m"), str(result_file))
    result = json.loads(result_file.read_text())  # written before any rank exits
    assert result["windows"] > 0 and result["overlap"] == [0, 0, 0]

    from forecaster import Forecaster
    from forecaster.synthetic import generate_synthetic

    df = generate_synthetic(n_series=8, n_steps=24 * 14, freq="h", seed=0)
    reloaded = Forecaster.load(tmp_path / "m", device="cpu")
    assert reloaded.predict(df)["mean"].tolist() == pytest.approx(result["mean"], abs=1e-6)


BUDGET_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch.distributed as dist
    from forecaster import Forecaster, ModelConfig, TrainConfig
    from forecaster.synthetic import generate_synthetic

    # Only rank 1 is out of time after its first epoch: both must stop there, or rank 0's
    # next epoch would wait forever for a rank that has moved on.
    budget = 1e-3 if os.environ["RANK"] == "1" else 3600.0
    df = generate_synthetic(n_series=8, n_steps=24 * 14, freq="h", seed=0)
    model = Forecaster(
        ModelConfig(context_length=32, prediction_length=8, patch_length=4, d_model=16,
                    n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32),
        TrainConfig(max_epochs=4, patience=5, batch_size=64, tail_epochs=0, progress=False,
                    device="cpu", max_train_seconds=budget),
    ).fit(df)
    r = model.train_result
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, (len(r.epochs), r.out_of_time))
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as out:
            json.dump(ranks, out)
    dist.barrier()
    dist.destroy_process_group()
    """
)


def test_a_budget_that_runs_out_on_one_rank_stops_every_rank(tmp_path):
    result_file = tmp_path / "result.json"
    _torchrun(BUDGET_SCRIPT, tmp_path, str(result_file))
    assert json.loads(result_file.read_text()) == [[1, True], [1, True]]
