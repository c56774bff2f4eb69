"""The lock that keeps two pipeline runs from overlapping."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from pipelines.errors import PipelineLockedError


@contextlib.contextmanager
def pipeline_lock(path: str | Path, *, what: str = "pipeline run") -> Iterator[None]:
    """Hold ``path`` for the block, or raise ``PipelineLockedError`` at once if it is held.

    The lock is an OS file lock: it is released when the holder exits, even when killed, so
    a crashed run never blocks the next one. The holder's host and pid are written beside it
    for the error message.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = path.with_name(path.name + ".holder")
    lock = FileLock(str(path), thread_local=False)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        who = holder.read_text().strip() if holder.is_file() else "another process"
        raise PipelineLockedError(
            f"another {what} is in progress ({who} holds {path}); two runs never overlap, "
            "try again when it has finished"
        ) from None
    try:
        holder.write_text(f"pid {os.getpid()} on {socket.gethostname()}")
        yield
    finally:
        with contextlib.suppress(OSError):
            holder.unlink()
        lock.release()


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this machine (another user's counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # no signal: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True
