"""Running an online request through the micro-batcher, in chunks when it is large.

A request of more than `max_batch_size` series is split into chunks queued one after the
other, each at the request's place in line, so that no single forward pass grows without
bound and requests are answered in the order they came. A request past `request_timeout_s`
stops: the chunk in flight finishes, the rest never runs. Only a request answered with its
forecast hands it to `on_served` (the forecast log): one answered 504, or whose response
could not be rendered, was never served.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from fastapi import Request

from service.batcher import MicroBatcher
from service.errors import InferenceTimeoutError
from service.inference import ItemForecast, OnlineItem
from service.middleware import end_arrival


async def run_online(
    request: Request,
    batcher: MicroBatcher,
    chunks: Sequence[OnlineItem],
    render: Callable[[ItemForecast], bytes],
    timeout_s: float,
    on_served: Callable[[ItemForecast], None],
    spent_s: float = 0.0,
) -> bytes:
    """The encoded response of a request queued as ``chunks`` (rendered once, in order),
    within what is left of ``timeout_s`` after ``spent_s`` already spent on the request
    (reading its body into columns)."""
    end_arrival(request.scope, batcher)
    try:
        content = await asyncio.wait_for(_run(batcher, chunks, render), timeout_s - spent_s)
    except TimeoutError:
        raise timeout_error(timeout_s) from None
    for chunk in chunks:
        assert chunk.forecast is not None, "a chunk answered without its forecast"
        on_served(chunk.forecast)
    return content


def timeout_error(timeout_s: float) -> InferenceTimeoutError:
    return InferenceTimeoutError(
        f"the forecast took longer than {timeout_s:g} s (setting request_timeout_s)"
    )


async def _run(
    batcher: MicroBatcher, chunks: Sequence[OnlineItem], render: Callable[[ItemForecast], bytes]
) -> bytes:
    if len(chunks) == 1:  # the common case: rendered in the inference thread, as part of it
        chunks[0].render = render
        return await batcher.submit(chunks[0], chunks[0].n_series)
    ticket = batcher.ticket()  # every chunk keeps the request's place in line
    forecasts = [await batcher.submit(chunk, chunk.n_series, ticket) for chunk in chunks]
    return await asyncio.to_thread(render, ItemForecast.concat(forecasts))
