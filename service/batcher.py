"""Dynamic micro-batching of online requests, in the manner of Triton's dynamic batcher.

Requests are queued; one collector takes the first, then keeps adding more up to
`max_batch_size` series, waiting at most `max_wait_s` for them, and hands the batch to a
single inference thread. It only waits while more requests are known to be on their way
(arrived at the server, body not yet parsed): a lone request is dispatched at once, so
batching costs no latency when there is nothing to batch with. While a batch runs, new
requests queue up and form the next batch, so under load batches grow by themselves.

The queue is in order of the requests' arrival, the chunks of a large request keeping its place
(`ticket`): when more arrives than the model can forecast within the request timeout, the
earliest requests are answered and the rest time out, instead of every request getting a share
of each round and all of them timing out together.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from service.metrics import ServiceMetrics

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(order=True)
class _Pending(Generic[T]):
    ticket: int  # the request's place in line (its chunks share it)
    sequence: int  # then first come, first served
    item: T = field(compare=False)
    size: int = field(compare=False)
    future: asyncio.Future[Any] = field(repr=False, compare=False)


class MicroBatcher(Generic[T]):
    """Queue of items processed in batches by `process` in one dedicated thread.

    `process(items)` returns one result per item, each a value or an Exception to raise in
    that item's caller only.
    """

    def __init__(
        self,
        process: Callable[[list[T]], list[Any]],
        *,
        max_batch_size: int,
        max_wait_s: float,
        metrics: ServiceMetrics,
        thread_name: str = "inference",
    ):
        self.process = process
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.metrics = metrics
        self._queue: list[_Pending[T]] = []  # a heap, by ticket
        self._tickets = itertools.count()
        self._sequence = itertools.count()
        self._wakeup = asyncio.Event()
        self._arriving = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Run the collector in a task of its own (`run` is for a supervisor to own instead)."""
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="micro-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for pending in self._queue:
            if not pending.future.done():
                pending.future.set_exception(RuntimeError("the service is shutting down"))
        self._queue.clear()
        self._executor.shutdown(wait=True, cancel_futures=True)

    # -- arrivals: requests that will submit soon ---------------------------------------------
    def arrival_started(self) -> None:
        self._arriving += 1

    def arrival_ended(self) -> None:
        self._arriving -= 1
        self._wakeup.set()

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    # -- submit -----------------------------------------------------------------------------
    def ticket(self) -> int:
        """A place in line, for the chunks of one request to share."""
        return next(self._tickets)

    async def submit(self, item: T, size: int, ticket: int | None = None) -> Any:
        """Queue `item` (`size` series) at `ticket`'s place (a new one by default) and wait for
        its result."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        place = self.ticket() if ticket is None else ticket
        heapq.heappush(
            self._queue, _Pending(place, next(self._sequence), item, max(1, size), future)
        )
        self.metrics.queue_depth.set(len(self._queue))
        self._wakeup.set()
        return await future

    # -- collector --------------------------------------------------------------------------
    def _take(self) -> _Pending[T] | None:
        while self._queue:
            pending = heapq.heappop(self._queue)
            if not pending.future.done():  # a caller that timed out has cancelled its future
                return pending
        return None

    async def run(self) -> None:
        """The collector loop: take batches off the queue and run them, until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            first = self._take()
            if first is None:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch = [first]
            size = first.size
            deadline = loop.time() + self.max_wait_s
            while size < self.max_batch_size:
                if self._queue:
                    nxt = self._queue[0]
                    if nxt.future.done():
                        heapq.heappop(self._queue)
                        continue
                    if size + nxt.size > self.max_batch_size:
                        break
                    heapq.heappop(self._queue)
                    batch.append(nxt)
                    size += nxt.size
                    continue
                remaining = deadline - loop.time()
                if self._arriving <= 0 or remaining <= 0:
                    break
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except TimeoutError:
                    break
            self.metrics.queue_depth.set(len(self._queue))
            await self._run(batch, size)
            # Let the callers just answered queue their requests' next chunks, at their place
            # in line, before the next batch is formed.
            await asyncio.sleep(0)

    async def _run(self, batch: list[_Pending[T]], size: int) -> None:
        self.metrics.batch_series.observe(size)
        self.metrics.batch_requests.observe(len(batch))
        items = [p.item for p in batch]
        running = asyncio.get_running_loop().run_in_executor(self._executor, self.process, items)
        try:
            with self.metrics.inference_seconds.time():
                results = await self._outcome(running, len(batch))
        except asyncio.CancelledError:
            # Stopping while the pass runs: its callers are still waiting, so the pass is
            # finished and answered before the collector ends.
            self._answer(batch, await self._outcome(running, len(batch)))
            raise
        self._answer(batch, results)

    @staticmethod
    async def _outcome(running: asyncio.Future[list[Any]], n: int) -> list[Any]:
        """The results of a forward pass, or its error once per item when it failed whole."""
        try:
            return await asyncio.shield(running)
        except Exception as exc:  # the batch as a whole failed: every caller gets the error
            logger.exception("inference batch of %d requests failed", n)
            return [exc] * n

    @staticmethod
    def _answer(batch: list[_Pending[T]], results: list[Any]) -> None:
        for pending, result in zip(batch, results, strict=True):
            if pending.future.done():
                continue
            if isinstance(result, BaseException):
                pending.future.set_exception(result)
            else:
                pending.future.set_result(result)
