"""A closed-loop HTTP/1.1 load generator with almost no client-side cost.

Each of `concurrency` keep-alive connections sends a pre-encoded request, reads the whole
response, records the latency and sends the next, for a fixed duration. Raw asyncio streams
instead of an HTTP client library, so the client (sharing the machine's cores with the
servers) costs microseconds per request, the same for every server measured.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LoadResult:
    concurrency: int
    seconds: float
    requests: int
    errors: int
    throughput: float  # successful requests per second
    p50_ms: float
    p95_ms: float
    p99_ms: float

    def as_dict(self) -> dict:
        return self.__dict__.copy()


def encode_request(host: str, port: int, path: str, body: bytes, content_type: str) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n"
    )
    return head.encode() + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = None
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif length:
        await reader.readexactly(length)
    return status


async def _worker(host, port, request, stop_at, latencies, errors):
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            writer.write(request)
            status = await _read_response(reader)
            elapsed = time.perf_counter() - start
            if status == 200:
                latencies.append(elapsed)
            else:
                errors.append(status)
    finally:
        writer.close()


async def _run(host, port, request, concurrency, seconds):
    latencies: list[float] = []
    errors: list[int] = []
    start = time.perf_counter()
    stop_at = start + seconds
    await asyncio.gather(
        *(_worker(host, port, request, stop_at, latencies, errors) for _ in range(concurrency))
    )
    return latencies, errors, time.perf_counter() - start


def run_load(host: str, port: int, request: bytes, concurrency: int, seconds: float) -> LoadResult:
    latencies, errors, elapsed = asyncio.run(_run(host, port, request, concurrency, seconds))
    ms = np.asarray(latencies) * 1000 if latencies else np.asarray([np.nan])
    return LoadResult(
        concurrency=concurrency,
        seconds=round(elapsed, 2),
        requests=len(latencies),
        errors=len(errors),
        throughput=len(latencies) / elapsed,
        p50_ms=float(np.percentile(ms, 50)),
        p95_ms=float(np.percentile(ms, 95)),
        p99_ms=float(np.percentile(ms, 99)),
    )
