"""The live-settle addon at its interfaces, through `proxy.testing`: the followed stream's events
handed to it as the tracker hands them, a client stream a flow, the upstream the fake. What it
decides to tell a client stream is what is queued for that flow once its confirmations are over."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from proxy import testing
from proxy.addons.live.addon import LiveSettle
from proxy.opencode.tracker import FollowedEvent
from proxy.service.metrics import Metrics
from tests.fixtures import js_json
from tests.proxy.addons.live_streams import MESSAGE, PART, V1, WRITING_INFO
from tests.proxy.fake_opencode import FakeOpencode

SSE = {"Content-Type": "text/event-stream"}


def heard(live: LiveSettle, kind: str, **properties: Any) -> None:
    live.event(FollowedEvent("/cwd", "prj", kind, {"sessionID": V1, **properties}))


def crash_with_part_open(live: LiveSettle) -> None:
    heard(live, "message.part.updated", part=PART, time=1)
    live.following()  # the followed stream is back after a loss


def crash_while_writing(live: LiveSettle) -> None:
    heard(live, "session.status", status={"type": "busy"})
    heard(live, "message.updated", info=WRITING_INFO)
    live.following()


async def told_a_new_stream(live: LiveSettle) -> list[bytes]:
    """Once every confirmation is over, what a client stream opened then is told."""
    await live.tasks.idle()
    async with testing.streaming(live, testing.flow("GET", "/global/event", response_headers=SSE)) as flow:
        assert flow.injected is not None
        return [flow.injected.get_nowait() for _ in range(flow.injected.qsize())]


async def test_a_new_stream_is_told_the_settled_part(live: LiveSettle) -> None:
    """The premise of the cases below: the same steps with an orphan do tell."""
    crash_with_part_open(live)
    kinds = [
        orjson.loads(frame.removeprefix(b"data: "))["payload"]["type"]
        for frame in await told_a_new_stream(live)
    ]
    assert kinds == ["message.updated", "message.part.updated", "session.status"]


async def test_a_part_the_server_settles_while_it_is_confirmed_is_told_as_the_server_has_it(
    live: LiveSettle, fake: FakeOpencode, metrics: Metrics
) -> None:
    """Another client's fetch wrote the part back meanwhile: the clients open then heard the
    server, but one that connects later (the TUI never fetches again) must be told, and the
    session's idle status is for every client (the write-back does not announce it)."""
    written = {**PART, "state": {**PART["state"], "status": "error", "error": "Tool execution aborted"}}
    fake.bodies[f"/session/{V1}/message/{MESSAGE['info']['id']}"] = orjson.dumps(
        {**MESSAGE, "parts": [*MESSAGE["parts"][:1], written]}
    )
    crash_with_part_open(live)
    heard(live, "message.part.updated", part=written, time=2)  # within the grace period
    _, part, status = payloads(await told_a_new_stream(live))
    assert part["properties"]["part"] == written
    assert status["properties"]["status"] == {"type": "idle"}
    assert metrics.withdrawn_confirmations.labels("open parts")._value.get() == 0


async def test_nothing_is_said_of_a_part_the_server_settled_before_the_stream_was_lost(
    live: LiveSettle, fake: FakeOpencode
) -> None:
    heard(live, "message.part.updated", part=PART, time=1)
    heard(live, "message.part.updated", part={**PART, "state": {**PART["state"], "status": "completed"}})
    live.following()
    assert await told_a_new_stream(live) == []
    assert not [r for r in fake.seen if "/message/" in r.path], "nothing left to confirm"


async def test_nothing_is_said_while_the_session_is_busy(live: LiveSettle, fake: FakeOpencode) -> None:
    fake.v1_busy["/cwd"] = {V1}
    crash_with_part_open(live)
    assert await told_a_new_stream(live) == []
    assert fake.liveness_requests >= 1, "the addon asked before it decided"


async def test_nothing_is_said_of_a_turn_still_running_after_the_stream_came_back(
    live: LiveSettle, fake: FakeOpencode
) -> None:
    fake.v1_busy["/cwd"] = {V1}
    crash_while_writing(live)
    assert await told_a_new_stream(live) == []
    assert fake.liveness_requests >= 1, "the addon asked before it decided"


async def test_nothing_is_said_of_a_turn_the_stream_saw_end(live: LiveSettle, fake: FakeOpencode) -> None:
    heard(live, "session.status", status={"type": "busy"})
    heard(live, "message.updated", info=WRITING_INFO)
    heard(live, "message.updated", info={**WRITING_INFO, "time": {**WRITING_INFO["time"], "completed": 2}})
    heard(live, "session.status", status={"type": "idle"})
    live.following()
    assert await told_a_new_stream(live) == []
    assert not [r for r in fake.seen if r.path.endswith("/msg_writing")]


async def test_news_handed_over_with_the_reconnect_withdraws_the_confirmation(
    live: LiveSettle, metrics: Metrics
) -> None:
    """The tracker hands the listeners the events that came in the same chunk as the reconnect
    before any confirmation's task runs: they are news all the same."""
    heard(live, "message.part.updated", part=PART, time=1)
    live.following()
    heard(live, "session.status", status={"type": "busy"})  # a turn started: the client was told
    assert await told_a_new_stream(live) == []
    assert metrics.withdrawn_confirmations.labels("open parts")._value.get() == 1


def payloads(frames: list[bytes]) -> list[Any]:
    return [orjson.loads(frame.removeprefix(b"data: "))["payload"] for frame in frames]


async def test_a_part_the_server_settled_unseen_is_told_as_it_is(
    live: LiveSettle, fake: FakeOpencode
) -> None:
    done = {
        **MESSAGE,
        "parts": [*MESSAGE["parts"][:1], {**PART, "state": {**PART["state"], "status": "completed"}}],
    }
    fake.bodies[f"/session/{V1}/message/{MESSAGE['info']['id']}"] = orjson.dumps(done)
    crash_with_part_open(live)
    message, part, status = payloads(await told_a_new_stream(live))
    assert part["properties"]["part"] == done["parts"][1]
    info = message["properties"]["info"]  # closed by `unfinished-message`, as a view shows it
    assert info == {**MESSAGE["info"], "time": info["time"], "error": info["error"]}
    assert info["time"]["completed"] >= MESSAGE["info"]["time"]["created"]
    assert info["error"]["name"] == "MessageAbortedError"
    assert status["properties"]["status"] == {"type": "idle"}


async def test_a_part_cut_inside_an_emoji_is_settled_live(live: LiveSettle, fake: FakeOpencode) -> None:
    message = copy.deepcopy(MESSAGE)
    message["parts"][1]["state"]["metadata"]["output"] = "hello \ud83d"
    fake.bodies[f"/session/{V1}/message/{MESSAGE['info']['id']}"] = js_json(message)
    heard(live, "message.part.updated", part=message["parts"][1], time=1)
    live.following()
    part = next(frame for frame in await told_a_new_stream(live) if b"message.part.updated" in frame)
    assert b'"output":"hello \\ud83d"' in part
    settled = json.loads(part.removeprefix(b"data: "))["payload"]["properties"]["part"]
    assert settled["state"]["status"] == "error"
    assert settled["state"]["metadata"] == {"output": "hello \ud83d", "interrupted": True}


def kinds(frames: list[bytes]) -> list[str]:
    return [payload["type"] for payload in payloads(frames)]


RUNNING_AGAIN = {**PART, "state": {**PART["state"], "status": "running"}}


@pytest.mark.parametrize(
    ("kind", "properties", "still_replayed"),
    [
        ("session.status", {"status": {"type": "busy"}}, ["message.updated", "message.part.updated"]),
        (
            "session.status",
            {"status": {"type": "idle"}},
            ["message.updated", "message.part.updated", "session.status"],
        ),
        (
            "message.updated",
            {"info": {**MESSAGE["info"], "id": "msg_newer"}},
            ["message.updated", "message.part.updated", "session.status"],
        ),
        (
            "session.updated",
            {"info": {"id": V1, "title": "renamed"}},
            ["message.updated", "message.part.updated", "session.status"],
        ),
        ("message.updated", {"info": MESSAGE["info"]}, ["message.part.updated", "session.status"]),
        ("message.part.updated", {"part": RUNNING_AGAIN, "time": 2}, ["session.status"]),
        (
            "message.part.updated",
            {"part": {**MESSAGE["parts"][0], "id": "prt_new"}, "time": 2},
            ["message.part.updated", "session.status"],
        ),
    ],
)
async def test_news_of_a_thing_ends_only_its_own_replay(
    live: LiveSettle, metrics: Metrics, kind: str, properties: dict[str, Any], still_replayed: list[str]
) -> None:
    """Only news of a part, a message or the status ends the replay of that same thing: the
    session busy ends the replayed idle status, the message written on (or its part open again)
    ends the replayed message (and part); news of another message or of the session as a whole
    (a resumed turn) says nothing of the settled call, and a client back after it still needs it.
    Idle news agrees with the replayed status."""
    crash_with_part_open(live)
    await live.tasks.idle()
    assert metrics.injected_events._value.get() == 0  # no client stream yet: nothing sent
    heard(live, kind, **properties)
    assert kinds(await told_a_new_stream(live)) == still_replayed


async def test_the_servers_write_back_of_the_settled_part_keeps_the_replay(live: LiveSettle) -> None:
    """Under write-back the server announces the part settled, as the replay shows it: a TUI that
    reconnects after that (it never fetches again) must still be told, as the server said it. A part
    of the same message the server changes later is news of the message: its replay ends."""
    crash_with_part_open(live)
    replayed = payloads(await told_a_new_stream(live))
    part = replayed[1]["properties"]["part"]
    heard(live, "message.part.updated", part=part, time=2)
    after = payloads(await told_a_new_stream(live))
    assert [p["type"] for p in after] == ["message.updated", "session.status", "message.part.updated"]
    assert after[2]["properties"] == {"sessionID": V1, "part": part, "time": 2}
    done = {
        "status": "completed",
        "input": {},
        "output": "ok",
        "title": "",
        "metadata": {},
        "time": {"start": 1, "end": 2},
    }
    other = {**part, "id": "prt_other", "state": done}
    heard(live, "message.part.updated", part=other, time=3)
    assert kinds(await told_a_new_stream(live)) == ["session.status", "message.part.updated"]


async def test_news_of_the_session_while_a_turn_is_confirmed_withdraws_it(
    live: LiveSettle, metrics: Metrics
) -> None:
    """A new turn announced while the turn is being confirmed: whatever the reading says, the
    stream knows better, and nothing is said."""
    crash_while_writing(live)
    heard(live, "session.status", status={"type": "busy"})  # within the grace period
    assert await told_a_new_stream(live) == []
    assert metrics.withdrawn_confirmations.labels("dead turns")._value.get() == 1


@pytest.mark.parametrize(
    ("crash", "settled"),
    [
        (crash_with_part_open, lambda told: told[1]["properties"]["part"]["state"]["status"] == "error"),
        (crash_while_writing, lambda told: "completed" in told[0]["properties"]["info"]["time"]),
    ],
    ids=["open part", "turn cut short"],
)
async def test_a_reading_that_fails_after_the_restart_is_asked_again(
    live: LiveSettle,
    fake: FakeOpencode,
    crash: Callable[[LiveSettle], None],
    settled: Callable[[list[Any]], bool],
) -> None:
    """A server that has just restarted may not answer the first look-up; the settlement still comes."""
    fake.liveness_fails = True
    fake.on_serve["/session/status"] = [lambda: None, lambda: setattr(fake, "liveness_fails", False)]
    crash(live)
    told = payloads(await told_a_new_stream(live))
    assert settled(told)
    assert told[-1]["properties"]["status"] == {"type": "idle"}
    assert fake.liveness_requests == 2
