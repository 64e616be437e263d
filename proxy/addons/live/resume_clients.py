"""The `resume-clients` addon: the clients watching through the proxy's event streams, counted so
that a resume waits for them (`proxy.resume.clients_back.Clients` is what the resume sees of it).

The TUI and the web UI load a transcript once and then live on `/global/event`: an event sent
while their stream is down (a crash cuts it; they reconnect by themselves, after a pause of
their own) never reaches them, and they never fetch again. Measured with the 1.18.33 web UI: a
resume sent 0.5 s after the restart reached the page only from its answer on, the call still
drawn running and the resume's prompt missing. So the resume first waits until as many client
streams are open as were open from when the server was last heard until the crash cut them, for at
most `CLIENTS_BACK_S` (`proxy.resume.clients_back`). The server may say nothing for seconds (a tool
runs quietly, heartbeats are 10 s apart): a stream that opened after its last word was open at
the crash all the same, and counted only at that last word, a resume went ahead before it was
back (issue 28).
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import ClassVar

from proxy.addons.routing import event_stream, route_of
from proxy.opencode.routes import EventStream
from proxy.relay.hooks import Addon, Flow, FlowKey

__all__ = ["ResumeClients"]

_WATCHED = frozenset({EventStream.GLOBAL, EventStream.INSTANCE, EventStream.V2})
"""Streams a client lives on. A v2 session's own stream replays its history on every connection,
so a client of it misses nothing (and it opens only with its next event)."""
_HISTORY = 1024
_COUNTED = FlowKey[bool]("resume-client-stream")


class ResumeClients(Addon):
    """The `resume-clients` addon: counts open client event streams, and when the count changed."""

    name: ClassVar[str] = "resume-clients"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.scope = event_stream
        self._clock = clock
        self.open = 0
        self._history: deque[tuple[float, int]] = deque([(clock(), 0)], maxlen=_HISTORY)
        self._changed = asyncio.Event()

    async def response_headers(self, flow: Flow) -> None:
        if not flow.opened_event_stream:
            return
        if route_of(flow).stream in _WATCHED:
            flow[_COUNTED] = True
            self._count(+1)

    async def done(self, flow: Flow) -> None:
        if flow.get(_COUNTED):
            flow[_COUNTED] = False
            self._count(-1)

    def most_open_since(self, moment: float) -> int:
        """The most client streams open at any time from `moment` (a `time.monotonic()` reading) on."""
        index = max(bisect_right([at for at, _ in self._history], moment) - 1, 0)
        return max(count for _, count in islice(self._history, index, None))

    async def back(self, count: int) -> None:
        """Wait until at least `count` client streams are open (the caller bounds the wait)."""
        while self.open < count:
            self._changed.clear()
            await self._changed.wait()

    def _count(self, change: int) -> None:
        self.open += change
        self._history.append((self._clock(), self.open))
        self._changed.set()
