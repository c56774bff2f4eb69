"""The micro-batcher: concurrent submissions share a batch; a lone one does not wait."""

from __future__ import annotations

import asyncio
import time

from service.batcher import MicroBatcher
from service.metrics import ServiceMetrics


def _batcher(max_batch_size=64, max_wait_s=0.05):
    seen: list[list[int]] = []

    def process(items):
        seen.append(list(items))
        return [i * 10 if i >= 0 else ValueError(f"bad item {i}") for i in items]

    batcher = MicroBatcher(
        process, max_batch_size=max_batch_size, max_wait_s=max_wait_s, metrics=ServiceMetrics()
    )
    return batcher, seen


def test_arriving_requests_are_waited_for_and_merged():
    async def main():
        batcher, seen = _batcher()
        batcher.start()
        for _ in range(5):
            batcher.arrival_started()

        async def one(i):
            await asyncio.sleep(0.002 * i)
            batcher.arrival_ended()
            return await batcher.submit(i, 1)

        results = await asyncio.gather(*(one(i) for i in range(5)))
        await batcher.stop()
        return results, seen

    results, seen = asyncio.run(main())
    assert results == [0, 10, 20, 30, 40]
    assert seen == [[0, 1, 2, 3, 4]]


def test_a_lone_request_is_not_delayed():
    async def main():
        batcher, seen = _batcher(max_wait_s=1.0)
        batcher.start()
        start = time.perf_counter()
        result = await batcher.submit(7, 1)
        elapsed = time.perf_counter() - start
        await batcher.stop()
        return result, elapsed

    result, elapsed = asyncio.run(main())
    assert result == 70
    assert elapsed < 0.5  # nobody else was arriving: no reason to wait the full second


def test_batches_respect_the_size_limit_and_errors_stay_with_their_item():
    async def main():
        batcher, seen = _batcher(max_batch_size=4, max_wait_s=0.05)
        tasks = [asyncio.ensure_future(batcher.submit(i, 2)) for i in (1, -2, 3, 4, 5)]
        await asyncio.sleep(0)
        batcher.start()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await batcher.stop()
        return results, seen

    results, seen = asyncio.run(main())
    assert results[0] == 10 and isinstance(results[1], ValueError) and results[4] == 50
    assert all(sum(2 for _ in batch) <= 4 for batch in seen)
    assert [i for batch in seen for i in batch] == [1, -2, 3, 4, 5]


def test_a_timed_out_request_is_dropped_from_the_queue():
    async def main():
        batcher, seen = _batcher()
        doomed = asyncio.ensure_future(batcher.submit(1, 1))
        await asyncio.sleep(0)
        doomed.cancel()
        ok = asyncio.ensure_future(batcher.submit(2, 1))
        batcher.start()
        result = await ok
        await batcher.stop()
        return result, seen

    result, seen = asyncio.run(main())
    assert result == 20 and seen == [[2]]


def test_the_chunks_of_a_request_keep_its_place_in_line():
    """Two large requests arriving together: the first is answered whole before the second's
    chunks run. Taking turns chunk by chunk, overload answered no request before the timeout
    (100 requests of 1,000 series, every one a 504) though the work for half of them was done."""

    async def main():
        batcher, seen = _batcher(max_batch_size=1)
        batcher.start()

        async def request(chunks):
            ticket = batcher.ticket()
            return [await batcher.submit(c, 1, ticket) for c in chunks]

        # Under a timeout, as `service.online` runs them.
        first, second = await asyncio.gather(
            asyncio.wait_for(request([1, 2, 3]), 10), asyncio.wait_for(request([4, 5, 6]), 10)
        )
        await batcher.stop()
        return first, second, seen

    first, second, seen = asyncio.run(main())
    assert (first, second) == ([10, 20, 30], [40, 50, 60])
    assert seen == [[1], [2], [3], [4], [5], [6]]
