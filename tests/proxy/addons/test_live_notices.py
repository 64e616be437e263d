"""Notices for a person: a waiting session is told in the client streams, now, to streams that open
later and after a view of its messages, and taken back when the wait ends."""

import asyncio
import logging
from typing import Any

import orjson
import pytest

from proxy import testing
from proxy.addons.context import SettleContext
from proxy.addons.live import notices as live_notices
from proxy.addons.live.addon import LiveSettle
from proxy.opencode.client import UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.service.app import ASSEMBLY
from proxy.service.metrics import Metrics
from proxy.testing import WAIT_S
from tests.proxy.addons.live_streams import MESSAGE, V1, events
from tests.proxy.addons.test_live_clients import SSE, drained
from tests.proxy.conftest import ProxyClient
from tests.proxy.fake_opencode import FakeOpencode

TITLE = "Waiting for you: bash was not continued"
SAID = "The server restarted while `rm -rf build` ran. Send a message to continue it."
TEXT = f"{TITLE}\n\n{SAID}"
NEWER_USER: dict[str, Any] = {"info": {"id": "msg_zz_user", "role": "user", "sessionID": V1}, "parts": []}
"""A person's message queued after the interrupted turn: newer, but not where the notice goes."""


def serving(fake: FakeOpencode, *messages: dict[str, Any]) -> None:
    fake.bodies[f"/session/{V1}/message"] = orjson.dumps(list(messages))
    fake.directories[V1] = "/cwd"


def global_stream() -> Any:
    return testing.flow("GET", "/global/event", response_headers=SSE)


async def told(live: LiveSettle) -> None:
    async with asyncio.timeout(WAIT_S):
        await live.notices.tasks.idle()


def notice_of(frames: list[Any]) -> dict[str, Any]:
    """The one notice part among `frames` (each a `/global/event` envelope)."""
    (part,) = [
        frame["payload"]["properties"]["part"]
        for frame in frames
        if frame["payload"]["type"] == "message.part.updated"
    ]
    assert frames[0]["directory"] == "/cwd"
    return dict(part)


async def test_open_streams_are_told_on_the_newest_assistant_message(
    live: LiveSettle, fake: FakeOpencode
) -> None:
    serving(fake, MESSAGE, NEWER_USER)
    async with testing.streaming(live, global_stream()) as stream:
        live.notices.waiting(V1, None, TITLE, SAID)
        await told(live)
        part = notice_of(drained(stream.injected))
    assert part["type"] == "text"
    assert part["text"] == TEXT
    assert part["messageID"] == MESSAGE["info"]["id"]
    assert part["sessionID"] == V1
    assert part["id"].startswith("prt_")
    assert "synthetic" not in part  # what the server would mark hidden from its own prompts
    asked = [request for request in fake.seen if request.path == f"/session/{V1}/message"]
    assert asked[-1].query["directory"] == "/cwd"  # learned from `GET /session/{id}`


async def test_a_stream_that_opens_while_it_waits_is_replayed_it_once(
    live: LiveSettle, fake: FakeOpencode
) -> None:
    serving(fake, MESSAGE)
    live.notices.waiting(V1, "/cwd", TITLE, SAID)
    await told(live)
    async with testing.streaming(live, global_stream()) as late:
        assert notice_of(drained(late.injected))["text"] == TEXT
        live.notices.waiting(V1, "/cwd", TITLE, "said anew")
        again = notice_of(drained(late.injected))
    assert again["text"] == f"{TITLE}\n\nsaid anew"


async def test_a_view_of_its_messages_is_followed_by_the_notice_again(
    live: LiveSettle, fake: FakeOpencode
) -> None:
    """The TUI fetches the transcript after its stream opened and keeps the fetched parts only."""
    serving(fake, MESSAGE)
    live.notices.waiting(V1, "/cwd", TITLE, SAID)
    await told(live)
    async with testing.streaming(live, global_stream()) as stream:
        first = notice_of(drained(stream.injected))
        await testing.cycle(live.notices, testing.flow("GET", f"/session/{V1}/message?limit=100"))
        again = notice_of(drained(stream.injected))
        assert (again["id"], again["text"], again["messageID"]) == (first["id"], TEXT, first["messageID"])
        await testing.cycle(live.notices, testing.flow("GET", "/session/ses_other/message"))
        await testing.cycle(live.notices, testing.flow("GET", f"/session/{V1}/message", status=500))
        assert drained(stream.injected) == []


async def test_ended_withdraws_it_from_open_streams_and_later_ones(
    live: LiveSettle, fake: FakeOpencode
) -> None:
    serving(fake, MESSAGE)
    async with testing.streaming(live, global_stream()) as stream:
        live.notices.waiting(V1, "/cwd", TITLE, SAID)
        await told(live)
        part = notice_of(drained(stream.injected))
        live.notices.ended(V1)
        (removed,) = drained(stream.injected)
    assert removed["payload"]["type"] == "message.part.removed"
    assert removed["payload"]["properties"] == {
        "sessionID": V1,
        "messageID": part["messageID"],
        "partID": part["id"],
    }
    async with testing.streaming(live, global_stream()) as late:
        await testing.cycle(live.notices, testing.flow("GET", f"/session/{V1}/message"))
        assert drained(late.injected) == []


async def test_ended_before_the_session_was_read_tells_nothing(live: LiveSettle, fake: FakeOpencode) -> None:
    serving(fake, MESSAGE)
    async with testing.streaming(live, global_stream()) as stream:
        live.notices.waiting(V1, "/cwd", TITLE, SAID)
        live.notices.ended(V1)
        await told(live)
        assert drained(stream.injected) == []


async def test_a_session_whose_messages_cannot_be_read_is_said_in_the_log(
    live: LiveSettle, fake: FakeOpencode, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live_notices, "PAUSES_S", (0.0, 0.0))
    async with testing.streaming(live, global_stream()) as stream:
        live.notices.waiting(V1, "/cwd", TITLE, SAID)  # the fake serves no messages: 404
        await told(live)
        assert drained(stream.injected) == []
    assert f"session {V1} waits for a person, but no client is told" in caplog.text


async def test_the_assemblys_announcer_tells_a_client_stream_through_the_proxy(
    live_proxy: ProxyClient, fake: FakeOpencode
) -> None:
    """What the resume is handed (`Assembly.notices`) is wired: its stream is the live addon's,
    and a view of the session's messages through the proxy is followed by the notice again."""
    serving(fake, MESSAGE)
    announcer = live_proxy.app[ASSEMBLY].notices
    assert announcer is not None
    stream = events(await live_proxy.get("/global/event"))
    assert (await anext(stream))["payload"]["type"] == "server.connected"
    announcer.waiting(V1, "/cwd", TITLE, SAID)
    told = await anext(stream)
    assert told["payload"]["properties"]["part"]["text"] == TEXT
    assert (await live_proxy.get(f"/session/{V1}/message")).status == 200
    again = await anext(stream)
    assert again["payload"]["properties"]["part"]["id"] == told["payload"]["properties"]["part"]["id"]
    announcer.ended(V1)
    assert (await anext(stream))["payload"]["type"] == "message.part.removed"


async def test_a_dry_run_tells_nothing_and_says_so(
    upstream_api: UpstreamApi, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    serving(fake, MESSAGE)
    ctx = SettleContext(LivenessProbe(upstream_api), upstream_api, Metrics(), grace=0, dry_run=True)
    live = LiveSettle(ctx)
    caplog.set_level(logging.INFO)
    async with testing.streaming(live, global_stream()) as stream:
        live.notices.waiting(V1, "/cwd", TITLE, SAID)
        await told(live)
        assert drained(stream.injected) == []
    assert f"session {V1} waits for a person: the client streams would be told (dry run)" in caplog.text


async def test_a_2x_stream_is_not_told_what_only_1_18_clients_draw(
    live: LiveSettle, fake: FakeOpencode
) -> None:
    serving(fake, MESSAGE)
    api = testing.flow("GET", "/api/event", response_headers=SSE)
    async with testing.streaming(live, api) as stream, testing.streaming(live, global_stream()) as other:
        live.notices.waiting(V1, "/cwd", TITLE, SAID)
        await told(live)
        assert drained(stream.injected) == []
        assert notice_of(drained(other.injected))["text"] == TEXT
