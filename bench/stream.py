"""Streaming measurements wrk cannot make: SSE delivery latency and a large download.

Both use an aiohttp client in the runner's own process, which is pinned with the load
generator, so the client's cost is the same whichever target it reads through.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass

import aiohttp

from bench import shapes

SSE_GRACE_S = 30.0
READ_CHUNK = 1 << 20


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (NaN when empty)."""
    if not sorted_values:
        return math.nan
    return sorted_values[min(len(sorted_values) - 1, math.ceil(q / 100 * len(sorted_values)) - 1)]


@dataclass(frozen=True, slots=True)
class SseResult:
    """Per-event latency from the upstream's write to the client's read, in ms, ascending."""

    expected: int
    latencies_ms: list[float]

    @property
    def lost(self) -> int:
        return self.expected - len(self.latencies_ms)


def measure_sse(base_url: str, rate: int, seconds: int) -> SseResult:
    count = rate * seconds
    url = f"{base_url}{shapes.EVENT_PATH}?rate={rate}&count={count}"
    latencies = asyncio.run(_read_events(url, timeout_s=seconds + SSE_GRACE_S))
    return SseResult(count, sorted(latencies))


async def _read_events(url: str, timeout_s: float) -> list[float]:
    """Stamp each `data:` line on arrival, before parsing, and subtract its send stamp."""
    latencies: list[float] = []
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as response:
        response.raise_for_status()
        async for line in response.content:
            if not line.startswith(b"data:"):
                continue
            received = time.monotonic_ns()
            sent = shapes.sent_ns(json.loads(line[5:]))
            if sent is not None:
                latencies.append((received - sent) / 1e6)
    return latencies


@dataclass(frozen=True, slots=True)
class DownloadResult:
    size: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.size / self.seconds / 1e6


def measure_download(base_url: str, size: int) -> DownloadResult:
    return asyncio.run(_download(f"{base_url}{shapes.BLOB_PATH}?bytes={size}"))


async def _download(url: str) -> DownloadResult:
    """Time from request to last byte; a short body means the intermediary cut the stream."""
    received = 0
    async with aiohttp.ClientSession() as session:
        start = time.perf_counter()
        async with session.get(url) as response:
            response.raise_for_status()
            async for chunk in response.content.iter_chunked(READ_CHUNK):
                received += len(chunk)
        return DownloadResult(received, time.perf_counter() - start)
