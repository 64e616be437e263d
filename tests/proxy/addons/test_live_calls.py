"""In front of 2.x (the stand-in, `tests/opencode2/`): the proxy follows `/api/event`, and a client of
`/api/event` that saw a call open when the server crashed is told, once it is back and the session
inactive, what 2.x would have said: `session.tool.failed` in 2.x's shape, then the execution's end."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest

from proxy import testing
from proxy.addons.context import SettleContext
from proxy.addons.live.addon import LiveSettle
from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.dialects import LINE_2X
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.runtimes import V2_HTTP
from proxy.opencode.server_line import KnownServer, ServerLine
from proxy.opencode.tracker import FollowedEvent
from proxy.service.metrics import Metrics
from rules import V2_ERROR, Api
from tests.fixtures.opencode2 import load
from tests.opencode2.proxied import PASSWORD, Client, Said, Seen, call_opened, frames, proxied
from tests.opencode2.stand_in import VARIANTS, RunningCall, StandIn
from tests.proxy.conftest import ProxyClient
from tests.proxy.fake_opencode import FakeOpencode


@asynccontextmanager
async def followed_call(
    aiohttp_client: Client,
) -> AsyncIterator[tuple[StandIn, RunningCall, ProxyClient, Seen]]:
    """A stand-in with a running call, and the proxy in front of it once its stream showed the
    call open."""
    async with StandIn(password=PASSWORD) as server:
        call = server.add_running_call(server.add_session())
        async with proxied(server, aiohttp_client) as (proxy, seen):
            call_opened(server, call)
            await seen.until(lambda: any(e.kind == "session.tool.called" for e in seen.events))
            yield server, call, proxy, seen


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


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("key", ["id", "callID"])
async def test_a_client_of_api_event_is_told_the_crashed_call_failed_as_2x_says_it(
    aiohttp_client: Client, key: str, variant: str
) -> None:
    """On a release, on a from-source build (version `local`, only `/api/health`), and on one that
    compresses what a client accepts compressed (aiohttp's client accepts gzip): the stream the
    proxy slips the news into is asked uncompressed."""
    async with StandIn(password=PASSWORD, call_key=key, **VARIANTS[variant]) as server:
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
    async with followed_call(aiohttp_client) as (server, call, proxy, _):
        session = call.session_id
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
    async with followed_call(aiohttp_client) as (server, call, proxy, seen):
        session = call.session_id
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


async def crashed_with_a_call_open(
    upstream_api: UpstreamApi, fake: FakeOpencode, line: ServerLine
) -> list[Any]:
    """The live-settle addon in front of the server `line` says: the followed stream showed a 2.x
    call open, then came back after a loss; what a client of `/api/event` opened after the
    confirmation is told."""
    context = SettleContext(LivenessProbe(upstream_api), upstream_api, Metrics(), grace=0)
    live = LiveSettle(context, server=line)
    message = load("assistant-tool-running.json")
    session, call = "ses_2x", message["content"][0]["id"]
    fake.bodies[f"/api/session/{session}/message/{message['id']}"] = orjson.dumps({"data": message})
    opened = {"sessionID": session, "assistantMessageID": message["id"], "id": call, "name": "shell"}
    live.event(FollowedEvent(None, None, "session.tool.called", opened, line_2x=True))
    live.following()  # the followed stream is back after a loss
    await live.tasks.idle()
    sse = {"Content-Type": "text/event-stream"}
    async with testing.streaming(live, testing.flow("GET", "/api/event", response_headers=sse)) as flow:
        assert flow.injected is not None
        frames = [flow.injected.get_nowait() for _ in range(flow.injected.qsize())]
    return [orjson.loads(frame.removeprefix(b"data: ")) for frame in frames]


async def test_a_call_is_read_and_settled_as_the_dialect_of_the_server_says(
    upstream_api: UpstreamApi, fake: FakeOpencode
) -> None:
    """Where a call's message is and how its settle reads are the dialect's of the server the line
    detected, not 2.x's newest assumed: here a line whose calls settle with 1.18's v2 `unknown`
    error (as 2.x's source did before 2.0)."""
    older = KnownServer("2.0.0", dataclasses.replace(LINE_2X, runtimes={Api.V2: V2_HTTP}), True, "(told)")
    told = await crashed_with_a_call_open(upstream_api, fake, ServerLine.told(older))
    assert [event["type"] for event in told] == ["session.tool.failed", "session.execution.interrupted"]
    assert told[0]["data"]["error"] == V2_ERROR


async def test_a_call_is_not_told_while_the_server_cannot_say_which_it_is(
    upstream_api: UpstreamApi, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    fake.web_app = True  # its health routes answer HTML: which server it is stays unknown
    told = await crashed_with_a_call_open(upstream_api, fake, ServerLine(upstream_api, Credentials()))
    assert told == []
    assert (
        "live settle of ses_2x: not confirmed (the upstream's opencode server is not known: " in caplog.text
    )


async def later_client(proxy: ProxyClient, server: StandIn, seen: Any) -> list[str]:
    """What a client of `/api/event` that opens now is sent up to a marker the server publishes
    after it opened (its replay comes first): the kinds of every frame."""
    response = await proxy.get("/api/event", headers=server.headers)
    later = frames(response)
    kinds = [(await anext(later))["type"]]  # `server.connected`: the stream is open
    server.publish("session.execution.started", {"sessionID": "ses_marker"})
    async with asyncio.timeout(10):
        while kinds[-1] != "session.execution.started":
            kinds.append((await anext(later))["type"])
    response.close()
    return kinds


async def test_what_the_server_stored_itself_is_never_replayed_as_a_copy(aiohttp_client: Client) -> None:
    """The proxy told its settlement; then the server's own drain settled the call and ended the
    execution (durable events), and the server restarted cleanly: a client back after that is
    not sent copies (new ids, no `durable`) of what the server said and stored itself."""
    async with followed_call(aiohttp_client) as (server, call, proxy, seen):
        session = call.session_id
        await server.crash()
        await server.restart()
        assert next(e["type"] for e in await told(proxy, server, session)) == "session.tool.failed"
        server.store.settle_stale(session)  # the next prompt's drain
        server.publish("session.execution.succeeded", {"sessionID": session})
        await seen.until(lambda: seen.events[-1].kind == "session.execution.succeeded")
        followed = seen.followed
        await server.stop()
        await server.restart()
        await seen.until(lambda: seen.followed > followed)
        kinds = await later_client(proxy, server, seen)
    assert kinds == ["server.connected", "session.execution.started"]


async def test_a_call_the_server_settled_itself_while_the_stream_was_down_is_not_repeated(
    aiohttp_client: Client,
) -> None:
    async with followed_call(aiohttp_client) as (server, call, proxy, seen):
        session = call.session_id
        decided = Said("the server settled it itself; not repeated")
        await server.crash()
        server.store.settle_stale(session)  # as `serve --service` does at boot
        await server.restart()
        await decided.wait()
        kinds = await later_client(proxy, server, seen)
    assert server.messages(session)[-1]["content"][0]["state"]["status"] == "error"
    assert kinds == ["server.connected", "session.execution.started"]
