"""A client on an event stream, as the TUI and the web UI are: it reconnects whenever its stream
ends or is cut, and keeps every event it heard with the connection it came on, so that what it
was told after a crash can be told apart from what it heard before.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import orjson

from proxy.demo.client import EVERY_S, Client
from proxy.demo.lines import Call, Line

ANSWER_S = 5.0
_UNTIMED = aiohttp.ClientTimeout(total=None)


class Listener:
    """One subscriber to `origin`'s event stream of `line`."""

    def __init__(self, client: Client, origin: str, line: Line) -> None:
        self._client, self._url, self._line = client, origin + line.events, line
        self.connections = 0
        """Streams the server answered 200 so far."""
        self._heard: list[tuple[int, object]] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name=f"demo-listener {self._url}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def last_word(self, call_id: str, *, after: int = 0, before: int | None = None) -> Call | None:
        """The last thing the stream said of the call on a connection numbered past `after` (and
        up to `before`), if it said anything."""
        said = None
        for connection, frame in self._heard:
            if connection > after and (before is None or connection <= before):
                said = self._line.call_event(frame, call_id) or said
        return said

    async def _follow(self) -> None:
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                await self._read()
            await asyncio.sleep(EVERY_S)

    async def _read(self) -> None:
        """One stream, read to its end. Its answer is timed (a 1.18.33 that has just opened its port
        can take a stream and answer nothing for 40 s), its events never: quiet is normal there."""
        headers = {"Accept": "text/event-stream"}
        async with asyncio.timeout(ANSWER_S):
            stream = await self._client.http.get(self._url, headers=headers, timeout=_UNTIMED)
        async with stream:
            if stream.status != 200:
                return
            self.connections += 1
            connection = self.connections
            async for line in stream.content:
                if line.startswith(b"data:"):
                    self._heard.append((connection, orjson.loads(line[5:])))
