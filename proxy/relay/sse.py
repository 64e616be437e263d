"""Server-sent events: relaying a stream while slipping extra events in between its own.

An injected event must never land inside one of the upstream's events, so the relay knows
where each upstream event ends (a blank line) and holds an injected one until the stream
is at such a boundary. It also waits for the upstream's first event (opencode's
`server.connected`), so a client always sees the stream open the way the server opens it.
Upstream bytes go out as soon as an event is complete; nothing else is buffered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from proxy.relay.answers import UpstreamError, UpstreamResponse

_BOUNDARIES = (b"\n\n", b"\r\n\r\n", b"\r\r")


def complete_events_end(data: bytes) -> int:
    """How many leading bytes of `data` are whole events (0 when not one has ended)."""
    return max((data.rfind(mark) + len(mark) for mark in _BOUNDARIES if data.rfind(mark) >= 0), default=0)


Opened = Callable[[bytes], Awaitable[None] | None]
"""Handed a stream's first event as it goes out; what it returns is awaited before anything else
goes (what the injector must slip in first)."""


def first_event_end(data: bytes) -> int:
    """How many leading bytes of `data` are its first whole event (0 when it has not ended)."""
    return min((data.find(mark) + len(mark) for mark in _BOUNDARIES if data.find(mark) >= 0), default=0)


async def relay_with_injection(
    response: web.StreamResponse,
    upstream: UpstreamResponse,
    injected: asyncio.Queue[bytes],
    opened: Opened | None = None,
) -> None:
    """Copy the upstream's events to `response`, writing queued events between them."""
    between = _Between(response)
    if opened is not None:
        rest = await _opening(response, upstream, injected, opened)
        if rest is None:
            return
        between.pending, between.started = rest, True
    reading: asyncio.Task[bytes] | None = None
    waiting: asyncio.Task[bytes] | None = None
    try:
        while True:
            reading = reading or asyncio.create_task(upstream.content.readany())
            waiting = waiting or asyncio.create_task(injected.get())
            done, _ = await asyncio.wait((reading, waiting), return_when=asyncio.FIRST_COMPLETED)
            if waiting in done:
                between.held.append(waiting.result())
                waiting = None
            if reading in done:
                chunk, reading = reading.result(), None
                if not chunk:
                    break
                await between.upstream_said(chunk)
            await between.write_held()
        if between.pending:
            await response.write(between.pending)
    finally:
        await _cancelled(reading, waiting)


@dataclass
class _Between:
    """Where a relaying stream stands between two reads: the start of an upstream event not yet
    whole (`pending`), the queued events held until the stream is between two of its own
    (`held`), and whether the stream has started (nothing is slipped in before it has)."""

    response: web.StreamResponse
    pending: bytes = b""
    started: bool = False
    held: deque[bytes] = field(default_factory=deque)

    async def upstream_said(self, chunk: bytes) -> None:
        """Write the whole events `chunk` completes; keep the start of the next one."""
        data = self.pending + chunk
        cut = complete_events_end(data)
        if cut:
            await self.response.write(data[:cut])
            self.started = True
        self.pending = data[cut:]

    async def write_held(self) -> None:
        """Write the held events, if the stream is between two of its own."""
        while self.started and not self.pending and self.held:
            await self.response.write(self.held.popleft())


async def _cancelled(*tasks: asyncio.Task[bytes] | None) -> None:
    for task in tasks:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, UpstreamError):
                await task


async def _opening(
    response: web.StreamResponse, upstream: UpstreamResponse, injected: asyncio.Queue[bytes], opened: Opened
) -> bytes | None:
    """The stream's first event, then all that is queued once `opened` is done with it, then the
    whole events read past the first; what is left of an event (None: the stream ended)."""
    data = b""
    while not (end := first_event_end(data)):
        chunk = await upstream.content.readany()
        if not chunk:
            if data:
                await response.write(data)
            return None
        data += chunk
    slipping_in = opened(data[:end])
    await response.write(data[:end])
    if slipping_in is not None:
        await slipping_in
    while not injected.empty():
        await response.write(injected.get_nowait())
    rest = data[end:]
    cut = complete_events_end(rest)
    if cut:
        await response.write(rest[:cut])
    return rest[cut:]
