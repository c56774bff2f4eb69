"""Whether a process lives, as the run cleanup, the job store and the metrics directory ask."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipelines.lock import process_alive


def test_a_process_lives_until_it_has_exited():
    assert process_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert process_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not process_alive(child.pid)


@pytest.mark.parametrize("pid", [0, -1])
def test_no_pid_names_a_process_group_or_every_process(pid):
    # os.kill reads 0 as this process group and -1 as every process: both would answer alive.
    assert not process_alive(pid)
