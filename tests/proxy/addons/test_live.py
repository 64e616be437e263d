"""Live settlement: a client stream that outlived the crash is told the part is settled."""

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from proxy.testing import idle
from tests.fixtures import js_json
from tests.proxy.addons.live_streams import MESSAGE, PART, V1, crash_with_part_open, events
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
    connected, part, message, status = await next_kinds(stream, 4)
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


async def injected_into_a_new_stream(live_proxy: ProxyClient) -> float:
    """`injected` once the background is idle and a client stream has connected: what it was told."""
    await idle(live_proxy.app)
    await live_proxy.get("/global/event")
    return await injected(live_proxy)


async def test_instance_streams_get_the_events_of_their_directory_only(
    live_proxy: ProxyClient, fake: FakeOpencode
) -> None:
    await crash_with_part_open(live_proxy, fake)
    await idle(live_proxy.app)
    elsewhere = await live_proxy.get("/event", params={"directory": "/elsewhere"})
    own = await live_proxy.get("/event", headers={"x-opencode-directory": "%2Fcwd"})
    connected, part = await next_kinds(events(own), 2)
    assert connected == {"type": "server.connected", "properties": {}}
    assert part["type"] == "message.part.updated"
    assert part["properties"]["part"]["id"] == PART["id"]
    assert await injected(live_proxy) == 3
    first = await asyncio.wait_for(elsewhere.content.readuntil(b"\n\n"), 5)
    assert first.startswith(b'data: {"type":"server.connected"')
    await ends_with_nothing_more(fake, elsewhere)
    assert await injected(live_proxy) == 3


async def test_a_part_the_server_settled_unseen_is_relayed_as_it_is(
    live_proxy: ProxyClient, fake: FakeOpencode
) -> None:
    done = {
        **MESSAGE,
        "parts": [*MESSAGE["parts"][:1], {**PART, "state": {**PART["state"], "status": "completed"}}],
    }
    fake.bodies[f"/session/{V1}/message/{MESSAGE['info']['id']}"] = orjson.dumps(done)
    await crash_with_part_open(live_proxy, fake)
    response = await live_proxy.get("/global/event")
    _, part, message, status = await next_kinds(events(response), 4)
    assert part["payload"]["properties"]["part"] == done["parts"][1]
    info = message["payload"]["properties"]["info"]  # closed by `unfinished-message`, as a view shows it
    assert info == {**MESSAGE["info"], "time": info["time"], "error": info["error"]}
    assert info["time"]["completed"] >= MESSAGE["info"]["time"]["created"]
    assert info["error"]["name"] == "MessageAbortedError"
    assert status["payload"]["properties"]["status"] == {"type": "idle"}


async def test_a_part_cut_inside_an_emoji_is_settled_live(
    live_proxy: ProxyClient, fake: FakeOpencode
) -> None:
    message = copy.deepcopy(MESSAGE)
    message["parts"][1]["state"]["metadata"]["output"] = "hello \ud83d"
    fake.bodies[f"/session/{V1}/message/{MESSAGE['info']['id']}"] = js_json(message)
    await publish(live_proxy, fake, "message.part.updated", V1, part=message["parts"][1], time=1)
    await crash(live_proxy, fake)
    await idle(live_proxy.app)
    response = await live_proxy.get("/global/event")
    lines = [await asyncio.wait_for(response.content.readline(), 5) for _ in range(4)]
    part = next(line for line in lines if b"message.part.updated" in line)
    assert b'"output":"hello \\ud83d"' in part
    settled = json.loads(part.removeprefix(b"data: "))["payload"]["properties"]["part"]
    assert settled["state"]["status"] == "error"
    assert settled["state"]["metadata"] == {"output": "hello \ud83d", "interrupted": True}


@pytest.mark.parametrize(
    ("kind", "properties"),
    [
        ("session.status", {"status": {"type": "busy"}}),
        ("session.status", {"status": {"type": "idle"}}),
        ("message.updated", {"info": {**MESSAGE["info"], "id": "msg_newer"}}),
    ],
)
async def test_the_replay_ends_when_the_stream_says_anything_newer_about_the_session(
    live_proxy: ProxyClient, fake: FakeOpencode, kind: str, properties: dict[str, Any]
) -> None:
    await crash_with_part_open(live_proxy, fake)
    await idle(live_proxy.app)
    assert await injected(live_proxy) == 0  # no client stream yet: nothing sent
    await publish(live_proxy, fake, kind, V1, **properties)  # e.g. a new turn: the session is busy again
    stream = events(await live_proxy.get("/global/event"))
    assert (await anext(stream))["payload"]["type"] == "server.connected"
    await next_is_the_servers(fake, stream)  # no "idle", no settled part: the server has newer news
    assert await injected(live_proxy) == 0


WRITING_INFO: dict[str, Any] = {**MESSAGE["info"], "id": "msg_writing"}
WRITING: dict[str, Any] = {"info": WRITING_INFO, "parts": []}
"""An assistant message the model was still writing when the server died: no tool, no completion."""


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


async def test_news_of_the_session_during_the_confirmation_withdraws_it(
    live_proxy: ProxyClient, fake: FakeOpencode
) -> None:
    """A new turn announced while the turn is being confirmed: whatever the reading says, the
    stream knows better, and nothing is said."""
    await crash_while_writing(live_proxy, fake)
    await publish(live_proxy, fake, "session.status", V1, status={"type": "busy"})  # within the grace period
    assert await injected_into_a_new_stream(live_proxy) == 0


async def test_a_reading_that_fails_after_the_restart_is_asked_again(
    live_proxy: ProxyClient, fake: FakeOpencode
) -> None:
    """A server that has just restarted may not answer the first look-up; the settlement still comes."""
    fake.liveness_fails = True
    fake.on_serve["/session/status"] = [lambda: None, lambda: setattr(fake, "liveness_fails", False)]
    await crash_with_part_open(live_proxy, fake)
    response = await live_proxy.get("/global/event")
    _, part, _, status = await next_kinds(events(response), 4)
    assert part["payload"]["properties"]["part"]["state"]["status"] == "error"
    assert status["payload"]["properties"]["status"] == {"type": "idle"}
    assert fake.liveness_requests >= 2
