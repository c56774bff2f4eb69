"""The micro-batcher: concurrent submissions share a batch; a lone one does not wait."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

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


def test_a_batch_is_filled_exactly_to_the_size_limit():
    """Requests that together make exactly `max_batch_size` series share one forward pass."""

    async def main():
        batcher, seen = _batcher(max_batch_size=4)
        tasks = [asyncio.ensure_future(batcher.submit(i, 2)) for i in (1, 2, 3, 4)]
        await asyncio.sleep(0)
        batcher.start()
        results = await asyncio.gather(*tasks)
        await batcher.stop()
        return results, seen

    results, seen = asyncio.run(main())
    assert results == [10, 20, 30, 40]
    assert seen == [[1, 2], [3, 4]]


def test_an_item_of_no_series_still_counts_as_one_toward_the_size_limit():
    """Otherwise a flood of empty items would all join one unbounded batch."""

    async def main():
        batcher, seen = _batcher(max_batch_size=2)
        tasks = [asyncio.ensure_future(batcher.submit(i, 0)) for i in (1, 2, 3, 4, 5)]
        await asyncio.sleep(0)
        batcher.start()
        results = await asyncio.gather(*tasks)
        await batcher.stop()
        return results, seen

    results, seen = asyncio.run(main())
    assert results == [10, 20, 30, 40, 50]
    assert seen == [[1, 2], [3, 4], [5]]


def test_a_timed_out_request_behind_the_first_takes_no_room_and_is_not_forecast():
    async def main():
        batcher, seen = _batcher(max_batch_size=2)
        first = asyncio.ensure_future(batcher.submit(1, 1))
        doomed = asyncio.ensure_future(batcher.submit(2, 1))
        last = asyncio.ensure_future(batcher.submit(3, 1))
        await asyncio.sleep(0)
        doomed.cancel()
        batcher.start()
        results = await asyncio.gather(first, last)
        await batcher.stop()
        return results, seen

    results, seen = asyncio.run(main())
    assert results == [10, 30]
    assert seen == [[1, 3]]


def test_a_full_batch_is_not_held_back_for_requests_still_arriving():
    """Waiting is for filling a batch: one already full runs at once, however long the
    batching window and however many requests are on their way."""

    async def main():
        batcher, seen = _batcher(max_batch_size=2, max_wait_s=60.0)
        batcher.start()
        batcher.arrival_started()  # on its way, and would fit no more
        results = await asyncio.wait_for(
            asyncio.gather(batcher.submit(1, 1), batcher.submit(2, 1)), 10
        )
        batcher.arrival_ended()
        await batcher.stop()
        return results, seen

    results, seen = asyncio.run(main())
    assert results == [10, 20]
    assert seen == [[1, 2]]


def test_an_arrival_that_gives_up_ends_the_wait_for_it():
    """A request that arrived but never submits (refused while its body was read) must not
    keep a batch waiting out the whole batching window."""

    async def main():
        batcher, seen = _batcher(max_wait_s=60.0)
        batcher.arrival_started()
        waiting = asyncio.ensure_future(batcher.submit(1, 1))
        await asyncio.sleep(0)
        batcher.start()
        while batcher.queue_depth:  # until the collector has taken it, to wait for the arrival
            await asyncio.sleep(0)
        batcher.arrival_ended()  # without submitting
        result = await asyncio.wait_for(waiting, 10)
        await batcher.stop()
        return result, seen

    result, seen = asyncio.run(main())
    assert result == 10 and seen == [[1]]


def test_a_batch_that_fails_as_a_whole_fails_each_of_its_callers_and_the_next_batch_runs():
    def process(items):
        if "boom" in items:
            raise RuntimeError("the model fell over")
        return [f"forecast {i}" for i in items]

    async def main():
        batcher = MicroBatcher(process, max_batch_size=8, max_wait_s=0.05, metrics=ServiceMetrics())
        failed = [asyncio.ensure_future(batcher.submit(i, 1)) for i in ("a", "boom")]
        await asyncio.sleep(0)
        batcher.start()
        errors = await asyncio.wait_for(asyncio.gather(*failed, return_exceptions=True), 10)
        after = await asyncio.wait_for(batcher.submit("b", 1), 10)
        await batcher.stop()
        return errors, after

    errors, after = asyncio.run(main())
    assert [type(e) for e in errors] == [RuntimeError, RuntimeError]
    assert all("the model fell over" in str(e) for e in errors)
    assert after == "forecast b"


def _held_batcher() -> tuple[MicroBatcher, threading.Event, threading.Event]:
    """A batcher whose forward pass sets `started` and then waits for `release`."""
    started, release = threading.Event(), threading.Event()

    def process(items):
        started.set()
        release.wait(10)
        return [i * 10 for i in items]

    batcher = MicroBatcher(process, max_batch_size=8, max_wait_s=0.05, metrics=ServiceMetrics())
    return batcher, started, release


def test_a_caller_that_times_out_while_its_batch_runs_spoils_nothing_for_the_others():
    """A request past its timeout stops waiting while the forward pass holding it finishes;
    the other callers in that batch still get their results, and the batcher goes on."""
    batcher, started, release = _held_batcher()

    async def main():
        doomed = asyncio.ensure_future(batcher.submit(1, 1))
        kept = asyncio.ensure_future(batcher.submit(2, 1))
        await asyncio.sleep(0)
        batcher.start()
        await asyncio.to_thread(started.wait, 10)
        doomed.cancel()
        release.set()
        kept_result = await asyncio.wait_for(kept, 10)
        after = await asyncio.wait_for(batcher.submit(3, 1), 10)
        await batcher.stop()
        return doomed.cancelled(), kept_result, after

    assert asyncio.run(main()) == (True, 20, 30)


def test_stopping_answers_every_queued_request_with_a_shutdown_error():
    """Requests still queued at shutdown are told so instead of waiting forever, and ones that
    already gave up are skipped."""

    async def main():
        batcher, seen = _batcher()
        gave_up = asyncio.ensure_future(batcher.submit(1, 1))
        queued = asyncio.ensure_future(batcher.submit(2, 1))
        await asyncio.sleep(0)
        gave_up.cancel()
        await batcher.stop()
        with pytest.raises(RuntimeError, match="shutting down"):
            await asyncio.wait_for(queued, 10)
        return seen

    assert asyncio.run(main()) == []


def test_the_queue_depth_gauge_falls_back_to_zero_once_the_queue_drains():
    async def main():
        batcher, _ = _batcher(max_batch_size=8)
        tasks = [asyncio.ensure_future(batcher.submit(i, 1)) for i in range(5)]
        await asyncio.sleep(0)
        queued = batcher.metrics.registry.get_sample_value("forecaster_queue_depth")
        batcher.start()
        await asyncio.gather(*tasks)
        drained = batcher.metrics.registry.get_sample_value("forecaster_queue_depth")
        await batcher.stop()
        return queued, drained

    assert asyncio.run(main()) == (5, 0)


def test_the_batch_histograms_count_series_and_requests_per_forward_pass():
    async def main():
        batcher, _ = _batcher(max_batch_size=8)
        tasks = [asyncio.ensure_future(batcher.submit(i, 3)) for i in (1, 2)]
        await asyncio.sleep(0)
        batcher.start()
        await asyncio.gather(*tasks)
        await batcher.stop()
        value = batcher.metrics.registry.get_sample_value
        return value("forecaster_batch_series_sum"), value("forecaster_batch_requests_sum")

    assert asyncio.run(main()) == (6, 2)


def test_a_request_that_would_overflow_the_batch_waits_for_the_next_one():
    """Requests are taken in order until the next would pass the limit; that one leads the
    next batch rather than growing this one past `max_batch_size` series."""

    async def main():
        batcher, seen = _batcher(max_batch_size=4)
        tasks = [asyncio.ensure_future(batcher.submit(i, i)) for i in (3, 2, 1)]
        await asyncio.sleep(0)
        batcher.start()
        results = await asyncio.gather(*tasks)
        await batcher.stop()
        return results, seen

    results, seen = asyncio.run(main())
    assert results == [30, 20, 10]
    assert seen == [[3], [2, 1]]


def test_stopping_while_a_batch_runs_answers_its_callers_with_their_forecasts():
    """The service's shutdown cancels the collector, possibly in the middle of a forward pass:
    that pass is finished and its callers get their results, not an endless wait."""
    batcher, started, release = _held_batcher()

    async def main():
        in_flight = [asyncio.ensure_future(batcher.submit(i, 1)) for i in (1, 2)]
        await asyncio.sleep(0)
        batcher.start()
        await asyncio.to_thread(started.wait, 10)
        stopping = asyncio.ensure_future(batcher.stop())
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.wait_for(stopping, 10)
        return await asyncio.wait_for(asyncio.gather(*in_flight), 1)

    assert asyncio.run(main()) == [10, 20]
