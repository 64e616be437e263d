"""A part settled as interrupted that this process never saw open (the write-back of a proxy that
started after the one that saw the call crashed with it) ends its turn in client streams too: the
server announces the part, never the session idle nor the message closed, and a TUI that kept its
state across the proxy's crash would keep its busy bar. Never for a session the server says is
busy, and never twice for a session told idle already."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy import testing
from proxy.addons.live.addon import LiveSettle
from proxy.addons.settle import SETTLED_HEADER
from proxy.relay.hooks import Flow
from rules import Api, Liveness, settle_view
from tests.fixtures import compact
from tests.proxy.addons import test_live_hooks as hooks
from tests.proxy.addons.live_streams import MESSAGE, PART, V1, events
from tests.proxy.addons.test_live_default import TOLD
from tests.proxy.conftest import ProxyClient
from tests.proxy.fake_opencode import FakeOpencode

PATH = f"/session/{V1}/message/{MESSAGE['info']['id']}"


@pytest.fixture
def written(fake: FakeOpencode) -> dict[str, Any]:
    """The part as a write-back wrote it (the API cannot close the message: it stays unfinished)."""
    view = settle_view(MESSAGE, Api.V1, Liveness(V1, active=False), single=True)
    assert view is not None
    part = next(part for part in view.document["parts"] if part["id"] == PART["id"])
    fake.bodies[PATH] = orjson.dumps({**MESSAGE, "parts": [*MESSAGE["parts"][:1], part]})
    return dict(part)


async def next_events(stream: Any, count: int) -> list[Any]:
    return [await anext(stream) for _ in range(count)]


def payloads(flow: Flow) -> list[dict[str, Any]]:
    assert flow.injected is not None
    frames = [flow.injected.get_nowait() for _ in range(flow.injected.qsize())]
    return [orjson.loads(frame.removeprefix(b"data: "))["payload"] for frame in frames]


async def told(live: LiveSettle, *steps: dict[str, Any]) -> list[dict[str, Any]]:
    """What a `/global/event` client open from the start is told once the stream said `steps`."""
    async with testing.streaming(
        live, testing.flow("GET", "/global/event", response_headers=hooks.SSE)
    ) as flow:
        for step in steps:
            hooks.heard(live, "message.part.updated", part=step, time=2)
            await live.tasks.idle()
        return payloads(flow)


async def test_a_part_written_back_unseen_closes_the_message_and_tells_the_session_idle(
    live: LiveSettle, written: dict[str, Any]
) -> None:
    live.following()  # a new proxy follows the restarted server; the stream never showed the call
    message, status, idle = await told(live, written)
    assert message["type"] == "message.updated"
    assert message["properties"]["info"]["id"] == MESSAGE["info"]["id"]
    assert "completed" in message["properties"]["info"]["time"]
    assert status == {**status, "type": "session.status"}
    assert status["properties"] == {"sessionID": V1, "status": {"type": "idle"}}
    assert idle["type"] == "session.idle"


async def test_nothing_is_told_of_a_session_the_server_says_is_busy(
    live: LiveSettle, written: dict[str, Any], fake: FakeOpencode
) -> None:
    fake.v1_busy["/cwd"] = {V1}  # a turn runs again (a resume, a person's prompt)
    live.following()
    assert await told(live, written) == []


async def test_a_session_told_idle_by_its_own_confirmation_is_not_told_again(
    live: LiveSettle, written: dict[str, Any]
) -> None:
    """The proxy saw the call open and told the settlement; the write-back's own announcement
    that follows says nothing new."""
    async with testing.streaming(
        live, testing.flow("GET", "/global/event", response_headers=hooks.SSE)
    ) as flow:
        hooks.crash_with_part_open(live)
        await live.tasks.idle()
        hooks.heard(live, "message.part.updated", part=written, time=2)
        await live.tasks.idle()
        kinds = [payload["type"] for payload in payloads(flow)]
    assert kinds == ["message.part.updated", "message.updated", "session.status", "session.idle"]


async def test_a_view_settled_for_another_client_is_told_to_a_stream_that_never_saw_the_call(
    live_proxy: ProxyClient, fake: FakeOpencode
) -> None:
    """No write-back: a client's fetch settles the view only; the TUI on `/global/event`, which
    kept the call running across the proxy's own crash and never fetches, is told it all."""
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    stream = events(await live_proxy.get("/global/event"))
    assert (await anext(stream))["payload"]["type"] == "server.connected"
    view = await live_proxy.get(f"/session/{V1}/message")
    assert view.headers[SETTLED_HEADER] == "1"
    told = [event["payload"] for event in await next_events(stream, 4)]
    assert [event["type"] for event in told] == TOLD
    assert told[0]["properties"]["part"]["state"]["status"] == "error"
    assert "completed" in told[1]["properties"]["info"]["time"]
