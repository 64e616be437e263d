"""In front of 2.x (the stand-in, `tests/opencode2/`): the proxy follows `/api/event`, and a client of
`/api/event` that saw a call open when the server crashed is told, once it is back and the session
inactive, what 2.x would have said: `session.tool.failed` in 2.x's shape, then the execution's end."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from tests.opencode2.proxied import PASSWORD, Client, Said, call_opened, frames, proxied
from tests.opencode2.stand_in import StandIn
from tests.proxy.conftest import ProxyClient


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


async def test_a_later_client_is_replayed_each_thing_until_news_of_that_same_thing(
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
            told_first = [e["type"] for e in await told(proxy, server, session)]
            # News of the execution (a new turn) ends the replay of its end, not of the call's failure.
            server.publish("session.execution.started", {"sessionID": session})
            await seen.until(lambda: seen.events[-1].kind == "session.execution.started")
            response = await proxy.get("/api/event", headers=server.headers)
            later = frames(response)
            replayed = [await anext(later), await anext(later)]
            server.publish("session.execution.succeeded", {"sessionID": session})
            after = await anext(later)
            response.close()
    assert told_first == ["session.tool.failed", "session.execution.interrupted"]
    assert sorted(event["type"] for event in replayed) == ["server.connected", "session.tool.failed"]
    assert after["type"] == "session.execution.succeeded"
