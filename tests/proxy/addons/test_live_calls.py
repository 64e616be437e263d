"""In front of 2.x (the stand-in, `tests/opencode2/`): the proxy follows `/api/event`, and a client of
`/api/event` that saw a call open when the server crashed is told, once it is back and the session
inactive, what 2.x would have said: `session.tool.failed` in 2.x's shape, then the execution's end."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from yarl import URL

from proxy.opencode.tracker import TRACKER, GlobalEvent, StreamState
from proxy.service.app import create_app
from proxy.service.config import Settings, basic_authorization
from tests.opencode2.stand_in import RunningCall, StandIn
from tests.proxy.conftest import ProxyClient

PASSWORD = "secret"
Client = Callable[[web.Application], Awaitable[ProxyClient]]


class Seen:
    """What the proxy's own follower of the stream heard (a positive signal to wait on)."""

    def __init__(self) -> None:
        self.events: list[GlobalEvent] = []
        self.followed = 0
        self.changed = asyncio.Event()

    def following(self) -> None:
        self.followed += 1
        self.changed.set()

    def event(self, event: GlobalEvent) -> None:
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
async def proxied(server: StandIn, aiohttp_client: Client) -> AsyncIterator[tuple[ProxyClient, Seen]]:
    settings = Settings(
        upstream=URL(server.url), grace=0, authorization=basic_authorization("opencode", PASSWORD)
    )
    seen = Seen()
    client: TestClient[web.Request, web.Application] = await aiohttp_client(create_app(settings))
    tracker = client.app[TRACKER]
    tracker.listeners.append(seen)
    await seen.until(lambda: tracker.state is StreamState.FOLLOWING)
    yield client, seen


def a_minute_ago(server: StandIn, session_id: str) -> None:
    """Every time of the session's messages a minute earlier: a reading taken within 2 s of a
    call's last sign of life vouches for nothing (`rules.liveness`)."""

    def earlier(value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                if key == "time" and isinstance(inner, dict):
                    value[key] = {name: at - 60_000 for name, at in inner.items()}
                else:
                    earlier(inner)
        elif isinstance(value, list):
            for inner in value:
                earlier(inner)

    earlier(server.messages(session_id))


class Said(logging.Handler):
    """Watches the proxy's log for a line holding `text` (its decision: a positive signal)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.said = text, asyncio.Event()
        logging.getLogger("proxy").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.said.set()

    async def wait(self) -> None:
        try:
            async with asyncio.timeout(10):
                await self.said.wait()
        finally:
            logging.getLogger("proxy").removeHandler(self)


def call_opened(server: StandIn, call: RunningCall, key: str = "id") -> None:
    data = {"sessionID": call.session_id, "assistantMessageID": call.message_id, key: call.call_id}
    server.publish("session.tool.called", data | {"name": "shell", "input": {}, "executed": False})
    a_minute_ago(server, call.session_id)


async def told(proxy: ProxyClient, server: StandIn, session_id: str) -> list[dict[str, Any]]:
    """Open `/api/event` through the proxy, and read it until the execution is said to be over."""
    got: list[dict[str, Any]] = []
    async with asyncio.timeout(15):
        while True:
            response = await proxy.get("/api/event", headers=server.headers)
            if response.status != 200:
                response.release()
                await asyncio.sleep(0.05)
                continue
            async for event in frames(response):
                if event["data"].get("sessionID") == session_id:
                    got.append(event)
                if event["type"] == "session.execution.interrupted":
                    return got


@pytest.mark.parametrize("key", ["id", "callID"])
async def test_a_client_of_api_event_is_told_the_crashed_call_failed_as_2x_says_it(
    aiohttp_client: Client, key: str
) -> None:
    async with StandIn(password=PASSWORD, call_key=key) as server:
        session = server.add_session()
        call = server.add_running_call(session, "shell", {"command": "sleep 600"})
        async with proxied(server, aiohttp_client) as (proxy, seen):
            call_opened(server, call, key)
            await seen.until(lambda: any(e.kind == "session.tool.called" for e in seen.events))
            await server.crash()
            await server.restart()
            events = await told(proxy, server, session)
    failed, ended = events
    assert failed["type"] == "session.tool.failed"
    assert failed["data"] == {
        "sessionID": session,
        "assistantMessageID": call.message_id,
        key: call.call_id,
        "error": {"type": "aborted", "message": "Tool execution interrupted: shell"},
        "executed": False,
    }
    assert failed["id"].startswith("evt_")
    assert "durable" not in failed
    assert ended["type"] == "session.execution.interrupted"
    assert ended["data"] == {"sessionID": session, "reason": "shutdown"}
    # Nothing was written: the stored call is still running until 2.x's own drain settles it.
    assert server.messages(session)[-1]["content"][0]["state"]["status"] == "running"


async def test_a_call_of_a_session_active_after_the_restart_is_left_alone(
    aiohttp_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with StandIn(password=PASSWORD) as server:
        session = server.add_session()
        call = server.add_running_call(session)
        async with proxied(server, aiohttp_client) as (proxy, seen):
            call_opened(server, call)
            await seen.until(lambda: any(e.kind == "session.tool.called" for e in seen.events))
            active = Said("nothing said, the session is active")
            await server.crash()
            server.store.active.add(session)
            await server.restart()
            await active.wait()
            response = await proxy.get("/api/event", headers=server.headers)
            first = await anext(frames(response))
            response.close()
    assert first["type"] == "server.connected"
    assert "orphaned call" not in caplog.text


async def test_news_of_the_session_on_the_stream_stops_the_replay_to_later_clients(
    aiohttp_client: Client,
) -> None:
    async with StandIn(password=PASSWORD) as server:
        session = server.add_session()
        call = server.add_running_call(session)
        async with proxied(server, aiohttp_client) as (proxy, seen):
            call_opened(server, call)
            await seen.until(lambda: any(e.kind == "session.tool.called" for e in seen.events))
            await server.crash()
            await server.restart()
            assert [e["type"] for e in await told(proxy, server, session)][
                -1
            ] == "session.execution.interrupted"
            server.publish("session.execution.started", {"sessionID": session})
            await seen.until(lambda: seen.events[-1].kind == "session.execution.started")
            response = await proxy.get("/api/event", headers=server.headers)
            connected = await anext(frames(response))
            server.publish("session.execution.succeeded", {"sessionID": session})
            after = await anext(frames(response))
            response.close()
    assert connected["type"] == "server.connected"
    assert after["type"] == "session.execution.succeeded"
