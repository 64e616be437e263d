"""v2 session streams, end to end: a client following a stale session's events gets the history
as the server replays it, then is told its call failed (the addon's decisions, a stream at a
time, are in `test_session_streams_hooks.py`)."""

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.service.app import create_app
from proxy.service.config import Settings
from proxy.testing import idle
from tests.fixtures import compact, raw
from tests.proxy.addons.live_streams import events
from tests.proxy.conftest import ProxyClient, injected
from tests.proxy.fake_opencode import FakeOpencode

V2 = "ses_dd6bd0f33ffejRStwdnQDIkDom"
STREAM = f"/api/session/{V2}/event"
HISTORY = [line for line in raw("sse-v2-session-events-busy.txt").splitlines() if line.startswith(b"{")]
GRACE_S = 0.05
ClientFactory = Callable[[web.Application], Awaitable[ProxyClient]]


@pytest.fixture
async def proxy(upstream: TestServer, aiohttp_client: ClientFactory, fake: FakeOpencode) -> ProxyClient:
    fake.bodies[f"/api/session/{V2}/message"] = compact("v2-message-stale-running.json")
    fake.session_history[V2] = HISTORY
    settings = Settings(upstream=URL(str(upstream.make_url("/"))), grace=GRACE_S)
    return await aiohttp_client(create_app(settings))


async def history_then(response: aiohttp.ClientResponse) -> AsyncIterator[Any]:
    """The events after the replayed history, which must come first and unchanged."""
    stream = events(response)
    assert [await anext(stream) for _ in HISTORY] == [orjson.loads(line) for line in HISTORY]
    async for event in stream:
        yield event


async def told_nothing_more(proxy: ProxyClient, fake: FakeOpencode, stream: AsyncIterator[Any]) -> None:
    """Once the proxy's confirmations are over, one event was injected in all, and the stream, ended
    by the server, brings nothing more: positive signals, where a quiet pause could be too short."""
    await idle(proxy.app)
    assert await injected(proxy) == 1
    fake.release.set()
    assert [event async for event in stream] == []


async def test_a_stale_sessions_stream_is_told_its_call_failed(
    proxy: ProxyClient, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="proxy.addons.live.session_streams")
    response = await proxy.get(STREAM)
    stream = history_then(response)
    event = await anext(stream)
    assert event["type"] == "session.next.tool.failed"
    assert event["id"].startswith("evt_")
    assert "durable" not in event, "a sequence number is the server's to give"
    data = event["data"]
    assert {key: data[key] for key in ("sessionID", "assistantMessageID", "callID", "provider")} == {
        "sessionID": V2,
        "assistantMessageID": "msg_22942f8cd001S0O0R7RZWGCalD",
        "callID": "call_mock_1",
        "provider": {"executed": False},
    }
    assert data["error"] == {"type": "unknown", "message": "Tool execution interrupted"}
    assert data["timestamp"] >= 1795988584703, "not before the call was last seen running"
    await told_nothing_more(proxy, fake, stream)
    [logged] = [record.fields for record in caplog.records if hasattr(record, "fields")]
    assert logged["tool"] == "bash"
    assert logged["rule"] == "orphaned-tool"
    assert (logged["session"], logged["part"]) == (V2, "call_mock_1")
