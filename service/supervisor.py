"""Supervision of the service's background loops (registry poller, micro-batcher, batch-job
workers, forecast-log flusher): a loop that dies of an unexpected error is logged once with its traceback and
restarted after a growing pause, and `/readyz` reports not ready while any loop is down."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)

FIRST_PAUSE_S, MAX_PAUSE_S = 0.5, 30.0


class Supervisor:
    """Keeps named coroutines running until `stop`."""

    def __init__(self, first_pause_s: float = FIRST_PAUSE_S, max_pause_s: float = MAX_PAUSE_S):
        self.first_pause_s = first_pause_s
        self.max_pause_s = max_pause_s
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._down: dict[str, str] = {}  # name -> the error it died of, while restarting
        self.restarts = 0

    def start(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        """Run `run()` under supervision; a normal return ends it for good."""
        self._tasks[name] = asyncio.create_task(self._keep(name, run), name=name)

    def down(self) -> dict[str, str]:
        """The loops not running right now, with the error each died of."""
        return dict(self._down)

    async def stop(self, *names: str, grace_s: float = 0.0) -> None:
        """Stop the named loops (every loop when none is named): wait up to `grace_s` for
        them to return by themselves (their owner asked them to), then cancel them."""
        tasks = {n: t for n, t in self._tasks.items() if not names or n in names}
        if grace_s > 0 and tasks:
            await asyncio.wait(tasks.values(), timeout=grace_s)
        for task in tasks.values():
            task.cancel()
        for name, task in tasks.items():
            with contextlib.suppress(asyncio.CancelledError):
                await task
            del self._tasks[name]

    async def _keep(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        pause = self.first_pause_s
        while True:
            try:
                await run()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._down[name] = f"{type(exc).__name__}: {exc}"
                self.restarts += 1
                logger.exception("background task %s died; restarting in %.1fs", name, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, self.max_pause_s)
            self._down.pop(name, None)
