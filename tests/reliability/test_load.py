"""Load: 10 000 mixed requests at concurrency 50 through the proxy process, and nothing leaks.

The mix is what clients really send: small JSON, message lists that must be settled, passed
through after a look-up, or passed through without one, uploads, and event-stream subscribers
that read a few events and hang up. Every answer is checked, so "0 errors" means every byte
was right, not merely that every status was 200. Leaks are measured from outside the process:
file descriptors and RSS after the run against a baseline taken after a warm-up (which fills
the upstream connection pool and the allocator), and the upstream's count of event streams
it still serves (an abandoned stream must be closed upstream too).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import pytest
from yarl import URL

from proxy.addons.settle import SETTLED_HEADER
from tests.reliability.load_upstream import VIEWS, LoadUpstream, View
from tests.reliability.processes import eventually, open_fds, rss_bytes, steady_fds
from tests.reliability.servers import ProxySubprocess, proxy_subprocess, serve

pytestmark = pytest.mark.slow

REQUESTS = 10_000
WARM_UP = 1_000
CONCURRENCY = 50
SSE_EVERY = 40
"""One operation in this many is an event-stream subscriber that reads a few events and leaves."""
EVENTS_READ = 3
UPLOAD = bytes(range(256)) * 64
FD_SLACK = CONCURRENCY
"""The proxy's upstream pool may keep one idle connection per concurrent request until its
keep-alive expires, and how many it opened varies with scheduling (measured: up to +11 on a
busy machine). A leak grows with the requests instead: even 0.5 % of 10 000 is 50."""
RSS_SLACK_BYTES = 24 * 2**20
"""Python rarely returns freed memory, so RSS only has to stop growing: 10 000 leaked requests
would hold far more than this (each holds its request, response and buffers)."""
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=30)


@dataclass
class Tally:
    """What the run did and every way it went wrong, for the assertion and the report."""

    by_kind: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)


def _kind(index: int) -> str:
    if index % SSE_EVERY == 0:
        return "sse"
    kinds = ("small", "small", "upload", *(view.path for view in VIEWS))
    return kinds[index % len(kinds)]


async def _check_view(session: aiohttp.ClientSession, base: URL, view: View) -> None:
    async with session.get(base.with_path(view.path)) as response:
        body = await response.read()
        assert response.status == 200, f"HTTP {response.status}: {body[:200]!r}"
        if view.settled:
            assert response.headers.get(SETTLED_HEADER) == "1", "stale view not settled"
            assert orjson.loads(body) == view.expected, "settled view differs from rules.settle_view"
        else:
            assert SETTLED_HEADER not in response.headers, "live or finished view settled"
            assert body == view.served, "view not passed byte for byte"


async def _subscribe_and_leave(session: aiohttp.ClientSession, base: URL) -> None:
    async with session.get(base.with_path("/event")) as response:
        assert response.status == 200
        for _ in range(EVENTS_READ):
            assert (await response.content.readuntil(b"\n\n")).startswith(b"data: ")
        response.close()  # hang up mid-stream, as a closed browser tab does


async def _one(session: aiohttp.ClientSession, base: URL, kind: str) -> None:
    if kind == "sse":
        await _subscribe_and_leave(session, base)
    elif kind == "small":
        async with session.get(base.with_path("/small")) as response:
            assert response.status == 200
            assert await response.json() == {"healthy": True, "version": "1.18.33"}
    elif kind == "upload":
        async with session.post(base.with_path("/echo"), data=UPLOAD) as response:
            assert response.status == 200
            assert await response.read() == UPLOAD
    else:
        await _check_view(session, base, next(view for view in VIEWS if view.path == kind))


async def _run(base: URL, count: int, tally: Tally) -> None:
    """`count` operations from `CONCURRENCY` workers sharing one counter, over one client session."""
    indexes = itertools.count()
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector, timeout=REQUEST_TIMEOUT) as session:

        async def worker() -> None:
            while (index := next(indexes)) < count:
                kind = _kind(index)
                tally.by_kind[kind] += 1
                try:
                    await _one(session, base, kind)
                except Exception as error:  # every failure is counted, none ends the run
                    tally.errors.append(f"{kind}: {type(error).__name__}: {error}")

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


async def _open_streams(proxy: ProxySubprocess) -> float:
    async with (
        aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as session,
        session.get(proxy.url.with_path("/_settle/metrics")) as response,
    ):
        text = await response.text()
    return sum(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("settle_proxy_open_streams")
    )


async def test_ten_thousand_mixed_requests_no_error_no_leak(tmp_path: Path) -> None:
    fake = LoadUpstream()
    async with serve(fake.app()) as upstream, proxy_subprocess(upstream, tmp_path / "proxy.log") as proxy:
        warm_up = Tally()
        await _run(proxy.url, WARM_UP, warm_up)
        assert warm_up.errors == []
        await eventually(lambda: fake.in_flight == 0)
        fds, rss = await steady_fds(proxy.pid), rss_bytes(proxy.pid)

        tally = Tally()
        started = time.monotonic()
        await _run(proxy.url, REQUESTS, tally)
        elapsed = time.monotonic() - started

        assert proxy.alive(), "the proxy died under load"
        assert tally.errors == [], f"{len(tally.errors)} errors, first: {tally.errors[:5]}"
        assert await eventually(lambda: fake.in_flight == 0), (
            f"{fake.in_flight} upstream requests still open after their clients left"
        )
        assert await _open_streams(proxy) == 0
        assert await eventually(lambda: open_fds(proxy.pid) <= fds + FD_SLACK), (
            f"fds: {fds} before, {open_fds(proxy.pid)} after"
        )
        grown = rss_bytes(proxy.pid) - rss
        assert grown <= RSS_SLACK_BYTES, f"RSS grew by {grown / 2**20:.1f} MiB"
        print(
            f"\nload: {REQUESTS} requests ({dict(tally.by_kind)}) in {elapsed:.1f}s "
            f"({REQUESTS / elapsed:.0f}/s), {len(tally.errors)} errors; fds {fds} -> {open_fds(proxy.pid)}; "
            f"RSS {rss / 2**20:.1f} -> {rss_bytes(proxy.pid) / 2**20:.1f} MiB"
        )
