"""Live settlement end to end, through a whole proxy in front of the fake: a client stream open
through the crash is told live, between the server's own events; one opened later gets the
state; an instance stream only its directory's. What the addon decides, one case at a time, is
in `test_live_hooks`."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from proxy.testing import idle
from tests.proxy.addons.live_streams import PART, V1, WRITING, WRITING_INFO, crash_with_part_open, events
from tests.proxy.conftest import (
    ProxyClient,
    crash,
    ends_with_nothing_more,
    injected,
    next_is_the_servers,
    publish,
)
from tests.proxy.fake_opencode import FakeOpencode


async def next_kinds(stream: AsyncIterator[Any], count: int) -> list[Any]:
    return [await anext(stream) for _ in range(count)]


async def test_a_stream_opened_after_the_crash_gets_the_settlement(
    live_proxy: ProxyClient, fake: FakeOpencode
) -> None:
    await crash_with_part_open(live_proxy, fake)
    await idle(live_proxy.app)  # the grace period and the confirmation
    response = await live_proxy.get("/global/event")
    stream = events(response)
    connected, message, part, status = await next_kinds(stream, 4)
    assert connected["payload"]["type"] == "server.connected"
    assert part["directory"] == "/cwd"
    assert part["payload"]["type"] == "message.part.updated"
    settled = part["payload"]["properties"]["part"]
    assert settled["id"] == PART["id"]
    assert settled["state"]["status"] == "error"
    assert settled["state"]["metadata"]["interrupted"] is True
    assert part["payload"]["id"].startswith("evt_")
    assert message["payload"]["properties"]["info"]["time"]["completed"] == settled["state"]["time"]["end"]
    assert status["payload"] == {
        **status["payload"],
        "type": "session.status",
        "properties": {"sessionID": V1, "status": {"type": "idle"}},
    }
    await next_is_the_servers(fake, stream)  # no "turn just ended" on a stream that was not there for it
    assert await injected(live_proxy) == 3


async def test_a_stream_open_through_the_crash_gets_it_live(
    live_proxy: ProxyClient, fake: FakeOpencode
) -> None:
    response = await live_proxy.get("/global/event")
    stream = events(response)
    assert (await anext(stream))["payload"]["type"] == "server.connected"
    fake.publish("message.part.updated", V1, part=PART, time=1)
    assert (await anext(stream))["payload"]["properties"]["part"]["state"]["status"] == "running"
    fake.publish("session.status", V1, status={"type": "idle"})  # went idle with the part open
    kinds = [event["payload"]["type"] for event in await next_kinds(stream, 5)]
    assert kinds == [
        "session.status",
        "message.part.updated",
        "message.updated",
        "session.status",
        "session.idle",
    ]


async def test_instance_streams_get_the_events_of_their_directory_only(
    live_proxy: ProxyClient, fake: FakeOpencode
) -> None:
    await crash_with_part_open(live_proxy, fake)
    await idle(live_proxy.app)
    elsewhere = await live_proxy.get("/event", params={"directory": "/elsewhere"})
    own = await live_proxy.get("/event", headers={"x-opencode-directory": "%2Fcwd"})
    connected, _, part = await next_kinds(events(own), 3)
    assert connected == {"type": "server.connected", "properties": {}}
    assert part["type"] == "message.part.updated"
    assert part["properties"]["part"]["id"] == PART["id"]
    assert await injected(live_proxy) == 3
    first = await asyncio.wait_for(elsewhere.content.readuntil(b"\n\n"), 5)
    assert first.startswith(b'data: {"type":"server.connected"')
    await ends_with_nothing_more(fake, elsewhere)
    assert await injected(live_proxy) == 3


async def crash_while_writing(live_proxy: ProxyClient, fake: FakeOpencode) -> None:
    fake.bodies[f"/session/{V1}/message/msg_writing"] = orjson.dumps(WRITING)
    await publish(live_proxy, fake, "session.status", V1, status={"type": "busy"})
    await publish(live_proxy, fake, "message.updated", V1, info=WRITING_INFO)
    await crash(live_proxy, fake)


async def test_a_turn_cut_before_any_tool_is_closed_in_streams_open_through_the_crash(
    live_proxy: ProxyClient, fake: FakeOpencode
) -> None:
    stream = events(await live_proxy.get("/event", params={"directory": "/cwd"}))  # outlives the fake's crash
    assert (await anext(stream))["type"] == "server.connected"
    await crash_while_writing(live_proxy, fake)
    message, status, idle = await next_kinds(stream, 3)
    assert message["type"] == "message.updated"
    info = message["properties"]["info"]
    assert info["id"] == "msg_writing"
    assert info["time"] == {
        "created": WRITING_INFO["time"]["created"],
        "completed": info["time"]["completed"],
    }
    assert info["error"]["name"] == "MessageAbortedError"
    assert status["properties"] == {"sessionID": V1, "status": {"type": "idle"}}
    assert idle == {**idle, "type": "session.idle", "properties": {"sessionID": V1}}
    later = events(await live_proxy.get("/global/event"))
    kinds = [event["payload"]["type"] for event in await next_kinds(later, 3)]
    assert kinds == ["server.connected", "message.updated", "session.status"]
    await next_is_the_servers(fake, later)
    assert await injected(live_proxy) == 5
