"""Faults: unreachable tracking server, a run killed mid-training, overlapping runs, and a
failed scheduled run. In every case champion stays where it was and nothing is half-done."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from pipelines.lock import pipeline_lock
from pipelines.retrain import retrain
from pipelines.schedule import run_schedule, scheduler_lock_path
from tests.pipelines.pipeline_helpers import ROOT, client_for, config_file, make_settings, run_cli


def _versions(root) -> list[str]:
    return sorted(
        str(v.version) for v in client_for(root).search_model_versions("name='forecaster'")
    )


def _champion(root) -> str:
    return str(client_for(root).get_registered_model("forecaster").aliases["champion"])


def test_unreachable_server_exits_within_bounded_time(tmp_path, data_csv):
    cfg = config_file(tmp_path)
    started = time.monotonic()
    proc = run_cli(
        "retrain",
        "--config",
        str(cfg),
        "--data",
        str(data_csv),
        "--tracking-uri",
        "http://127.0.0.1:9",
        cwd=tmp_path,
        timeout=120,
    )
    assert time.monotonic() - started < 60
    assert proc.returncode == 4
    err = proc.stderr.strip().splitlines()
    assert err[-1].startswith("error: MLflow tracking server at http://127.0.0.1:9 is unreachable")
    assert "Traceback" not in proc.stderr


def test_server_that_never_answers_times_out(tmp_path, data_csv):
    # A socket that accepts connections but never replies, as a hung server would.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        cfg = config_file(tmp_path)
        started = time.monotonic()
        proc = run_cli(
            "retrain",
            "--config",
            str(cfg),
            "--data",
            str(data_csv),
            "--tracking-uri",
            f"http://127.0.0.1:{port}",
            cwd=tmp_path,
            timeout=120,
            env={"MLFLOW_HTTP_REQUEST_TIMEOUT": "1", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"},
        )
    assert time.monotonic() - started < 60
    assert proc.returncode == 4, proc.stderr
    # Not "unreachable": a server that took the request may have applied it.
    assert "did not answer in time" in proc.stderr.strip().splitlines()[-1]


def _start_long_retrain(store, data_csv, stderr) -> subprocess.Popen:
    """A `retrain` CLI process whose training lasts long enough for a signal to land in it."""
    cfg = config_file(
        store,
        train={
            "max_epochs": 200,
            "patience": 200,
            "batch_size": 8,
            "progress": False,
            "device": "cpu",
            "max_windows_per_epoch": 64,
        },
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORECASTER_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "retrain", "--config", str(cfg)]
        + ["--data", str(data_csv)],
        cwd=store,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
    )


def _wait_for_first_epoch(store, proc: subprocess.Popen):
    """The running MLflow run once it has logged an epoch, or None if the process ended or
    three minutes passed first."""
    client = client_for(store)
    experiment = client.get_experiment_by_name("forecaster")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        runs = client.search_runs(
            [experiment.experiment_id], filter_string="attributes.status = 'RUNNING'"
        )
        if runs and client.get_metric_history(runs[0].info.run_id, "train_loss"):
            return runs[0]
        time.sleep(0.5)
    return None


def test_run_killed_mid_training_leaves_registry_untouched_and_next_run_is_clean(store, data_csv):
    before = _versions(store)
    proc = _start_long_retrain(store, data_csv, stderr=subprocess.DEVNULL)
    try:
        run = _wait_for_first_epoch(store, proc)
        assert run is not None, "training never logged an epoch"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    client = client_for(store)
    assert _versions(store) == before
    assert _champion(store) == "1"
    assert client.get_run(run.info.run_id).info.status == "RUNNING"  # it could not say more

    # The next run takes the (released) lock, marks the dead run KILLED and registers cleanly
    # (on version 1's inputs, which alone would train nothing).
    result = retrain(make_settings(store, retrain_unchanged=True), data_csv)
    assert client.get_run(run.info.run_id).info.status == "KILLED"
    assert result.version.version == str(len(before) + 1)
    assert client.get_run(result.run_id).info.status == "FINISHED"


def test_second_scheduler_exits_with_a_clear_message(tmp_path, data_csv):
    cfg = config_file(tmp_path)
    settings = make_settings(tmp_path)
    with pipeline_lock(scheduler_lock_path(settings), what="scheduler"):
        proc = run_cli(
            "schedule",
            "--config",
            str(cfg),
            "--data",
            str(data_csv),
            "--cron",
            "0 3 * * *",
            cwd=tmp_path,
            timeout=60,
        )
    assert proc.returncode == 5
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: another scheduler is in progress")
    assert str(os.getpid()) in last


def test_manual_run_while_another_holds_the_lock(tmp_path, data_csv, capsys):
    from pipelines.cli import main

    cfg = config_file(tmp_path)
    with pipeline_lock(make_settings(tmp_path).lock_file):
        code = main(["retrain", "--config", str(cfg), "--data", str(data_csv)])
    assert code == 5
    assert "another pipeline run is in progress" in capsys.readouterr().err


def test_failed_scheduled_run_is_logged_failed_and_champion_stays(store, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("unique_id,ds,y\na,2024-01-01 00:00,abc\na,2024-01-01 01:00,2.0\n")
    settings = make_settings(store, data=str(bad))
    report = run_schedule(
        settings, cron="* * * * * *", max_runs=2, sleep=lambda s: time.sleep(min(s, 0.2))
    )
    assert (report.runs, report.failed, report.succeeded) == (2, 2, 0)
    assert _champion(store) == "1"
    assert _versions(store) == ["1"]
    client = client_for(store)
    experiment = client.get_experiment_by_name("forecaster")
    failed = client.search_runs(
        [experiment.experiment_id], filter_string="attributes.status = 'FAILED'"
    )
    assert len(failed) == 2
    assert all("NonNumericValuesError" in r.data.tags["error"] for r in failed)


@pytest.mark.parametrize(
    ("cron", "says"),
    [
        ("at dawn", "expected a cron expression"),
        ("", "expected a cron expression"),
        ("0 0 31 2 *", "never fires"),
    ],  # 31 February parses, then crashed the scheduler
)
def test_invalid_cron_is_rejected(tmp_path, capsys, cron, says):
    from pipelines.cli import main

    cfg = config_file(tmp_path)
    assert main(["schedule", "--config", str(cfg), "--cron", cron]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cron: ") and says in err
    settings = config_file(tmp_path, schedule=cron)
    assert main(["schedule", "--config", str(settings), "--max-runs", "1"]) == 2
    assert "schedule" in capsys.readouterr().err


def test_terminated_run_is_marked_killed(store, data_csv):
    signum = signal.SIGTERM
    proc = _start_long_retrain(store, data_csv, stderr=subprocess.PIPE)
    run = _wait_for_first_epoch(store, proc)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert run is not None, stderr
    assert proc.returncode == 128 + signum, stderr
    assert client_for(store).get_run(run.info.run_id).info.status == "KILLED", stderr
    assert _versions(store) == ["1"] and _champion(store) == "1"


_OPEN_STORE = """
import sys, time
from pathlib import Path
from pipelines import tracking
start = Path(sys.argv[2])
while not start.exists():
    time.sleep(0.01)
tracking.ensure_experiment("forecaster", tracking_uri=sys.argv[1])
tracking.client(sys.argv[1]).search_registered_models()
"""


def test_commands_opening_a_fresh_sqlite_store_together_both_succeed(tmp_path):
    """MLflow creates a SQLite store's tables when a process first opens it: two commands
    started together on a fresh store (a retrain beside a monitor) both created them, and one
    died on "table registered_model_tags already exists"."""
    for attempt in range(2):
        uri = f"sqlite:///{tmp_path}/fresh{attempt}.db"
        start = tmp_path / f"start{attempt}"
        processes = [
            subprocess.Popen(
                [sys.executable, "-c", _OPEN_STORE, uri, str(start)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(3)
        ]
        time.sleep(5)  # every process has imported MLflow and waits
        start.touch()
        for process in processes:
            _, err = process.communicate(timeout=120)
            assert process.returncode == 0, err[-2000:]
