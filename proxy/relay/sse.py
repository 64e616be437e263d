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

from aiohttp import web

from proxy.relay.answers import UpstreamError, UpstreamResponse

_BOUNDARIES = (b"\n\n", b"\r\n\r\n", b"\r\r")


def complete_events_end(data: bytes) -> int:
    """How many leading bytes of `data` are whole events (0 when not one has ended)."""
    return max((data.rfind(mark) + len(mark) for mark in _BOUNDARIES if data.rfind(mark) >= 0), default=0)


async def relay_with_injection(
    response: web.StreamResponse, upstream: UpstreamResponse, injected: asyncio.Queue[bytes]
) -> None:
    """Copy the upstream's events to `response`, writing queued events between them."""
    pending, held = b"", deque[bytes]()
    started = False
    reading: asyncio.Task[bytes] | None = None
    waiting: asyncio.Task[bytes] | None = None
    try:
        while True:
            reading = reading or asyncio.create_task(upstream.content.readany())
            waiting = waiting or asyncio.create_task(injected.get())
            done, _ = await asyncio.wait((reading, waiting), return_when=asyncio.FIRST_COMPLETED)
            if waiting in done:
                held.append(waiting.result())
                waiting = None
            if reading in done:
                chunk, reading = reading.result(), None
                if not chunk:
                    break
                data = pending + chunk
                cut = complete_events_end(data)
                if cut:
                    await response.write(data[:cut])
                    started = True
                pending = data[cut:]
            while started and not pending and held:
                await response.write(held.popleft())
        if pending:
            await response.write(pending)
    finally:
        for task in (reading, waiting):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, UpstreamError):
                    await task
