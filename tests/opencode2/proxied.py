"""Helpers for a test of the proxy in front of the 2.x stand-in: the proxy in process, what its
follower of `/api/event` heard, and its decision lines (positive signals to wait on)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient
from yarl import URL

from proxy.opencode.tracker import FollowedEvent, StreamState
from proxy.service.app import ASSEMBLY, create_app
from proxy.service.config import Settings, basic_authorization
from tests.opencode2.shapes import earlier
from tests.opencode2.stand_in import RunningCall, StandIn
from tests.proxy.conftest import ProxyClient

PASSWORD = "secret"
Client = Callable[[web.Application], Awaitable[ProxyClient]]


class Seen:
    """What the proxy's own follower of the stream heard (a positive signal to wait on)."""

    def __init__(self) -> None:
        self.events: list[FollowedEvent] = []
        self.followed = 0
        self.changed = asyncio.Event()

    def following(self) -> None:
        self.followed += 1
        self.changed.set()

    def event(self, event: FollowedEvent) -> None:
        self.events.append(event)
        self.changed.set()

    async def until(self, check: Callable[[], bool]) -> None:
        async with asyncio.timeout(10):
            while not check():
                self.changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.05):
                        await self.changed.wait()


async def frames(response: Any) -> AsyncIterator[dict[str, Any]]:
    async for line in response.content:
        if line.startswith(b"data: "):
            yield orjson.loads(line[6:])


@asynccontextmanager
async def proxied(
    server: StandIn, aiohttp_client: Client, *, username: str = "opencode", **more: Any
) -> AsyncIterator[tuple[ProxyClient, Seen]]:
    """The proxy in front of `server` (grace 0, the server's password configured under `username`,
    as OPENCODE_SERVER_USERNAME would name it; `more` settings), once it follows `/api/event`."""
    authorization = basic_authorization(username, PASSWORD)
    settings = Settings(upstream=URL(server.url), grace=0, authorization=authorization, **more)
    seen = Seen()
    client: TestClient[web.Request, web.Application] = await aiohttp_client(create_app(settings))
    tracker = client.app[ASSEMBLY].started.tracker
    tracker.listeners.append(seen)
    await seen.until(lambda: tracker.state is StreamState.FOLLOWING)
    yield client, seen


def a_minute_ago(server: StandIn, session_id: str) -> None:
    """Every time of the session's messages a minute earlier: a reading taken within 2 s of a
    call's last sign of life vouches for nothing (`rules.liveness`)."""
    earlier(server.messages(session_id), 60_000)


class Said(logging.Handler):
    """Watches the proxy's log for a line holding each of `texts` (its decision: a positive signal)."""

    def __init__(self, *texts: str) -> None:
        super().__init__()
        self.texts, self.said, self.line = texts, asyncio.Event(), ""
        self.fields: dict[str, Any] = {}
        proxy = logging.getLogger("proxy")
        self.level = proxy.level
        proxy.addHandler(self)
        proxy.setLevel(logging.INFO)

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if all(text in message for text in self.texts) and not self.said.is_set():
            self.line, self.fields = message, getattr(record, "fields", {})
            self.said.set()

    async def wait(self) -> None:
        try:
            async with asyncio.timeout(30):
                await self.said.wait()
        finally:
            logging.getLogger("proxy").removeHandler(self)
            logging.getLogger("proxy").setLevel(self.level)


def call_opened(server: StandIn, call: RunningCall, key: str = "id") -> None:
    data = {"sessionID": call.session_id, "assistantMessageID": call.message_id, key: call.call_id}
    server.publish("session.tool.called", data | {"name": "shell", "input": {}, "executed": False})
    a_minute_ago(server, call.session_id)
