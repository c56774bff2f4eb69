"""SIGTERM ends a pipeline cleanly, but never in the middle of a write to the tracking store.

A scheduler, systemd or ``docker stop`` ends a pipeline with SIGTERM. The handler raises
``SystemExit`` so the run unwinds normally: the MLflow run is marked KILLED and the pipeline
lock is released. Raised inside a SQLAlchemy call, though, the exit can strand a SQLite
transaction; the store then stays locked against this very process and the run cannot be
marked. So while the main thread is inside SQLAlchemy or a function marked
:func:`uninterruptible`, the handler re-sends the signal to the process a moment later
instead of raising, for at most ``MAX_DEFER_SECONDS``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from types import CodeType, FrameType
from typing import TypeVar

# Packages whose calls hold database transactions; an HTTP request to a tracking server is
# safe to abandon (the server owns the transaction), so mlflow's client code is not listed.
_TRANSACTIONAL_PACKAGES = frozenset({"sqlalchemy"})
RETRY_SECONDS = 0.05
# A store that stays busy (a SQLite lock held by another process) must not keep the process
# alive past a supervisor's patience; docker stop waits 10 s before SIGKILL.
MAX_DEFER_SECONDS = 8.0

_uninterruptible: set[CodeType] = set()
_deferred_since: float | None = None

F = TypeVar("F", bound=Callable)


def uninterruptible(func: F) -> F:
    """Mark ``func``: a SIGTERM that arrives while it runs takes effect after it returns."""
    _uninterruptible.add(func.__code__)
    return func


def exit_on_sigterm() -> None:
    """Install the handler (main thread only, as for any signal handler)."""
    signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _deferred_since
    now = time.monotonic()
    if _deferred_since is None:
        _deferred_since = now
    if now - _deferred_since < MAX_DEFER_SECONDS and _in_critical_section(frame):
        timer = threading.Timer(RETRY_SECONDS, os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()
        return
    _deferred_since = None
    raise SystemExit(128 + signum)


def _in_critical_section(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code in _uninterruptible:
            return True
        package = str(frame.f_globals.get("__name__", "")).partition(".")[0]
        if package in _TRANSACTIONAL_PACKAGES:
            return True
        frame = frame.f_back
    return False
