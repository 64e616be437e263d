"""Client event streams for live settle: who is told what, now and when they connect later."""

import asyncio
import logging
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter

from proxy import testing
from proxy.addons.live.clients import ClientStreams, Telling
from proxy.addons.live.memory import Place
from proxy.opencode.tracker import FollowedEvent
from proxy.opencode.vocabulary import idle_status

SSE = {"Content-Type": "text/event-stream"}
ORPHAN = Telling(
    Place("ses_a", "msg_1", "/cwd", "prj"),
    state=[{"type": "message.updated", "properties": {"sessionID": "ses_a"}}],
    moment=[{"type": "session.idle", "properties": {"sessionID": "ses_a"}}],
)


def drained(queue: asyncio.Queue[bytes] | None) -> list[Any]:
    assert queue is not None
    frames = []
    while not queue.empty():
        frames.append(orjson.loads(queue.get_nowait().removeprefix(b"data: ")))
    return frames


def clients() -> ClientStreams:
    return ClientStreams(Counter("injected", "events", registry=CollectorRegistry()))


async def test_open_streams_are_told_now_and_later_ones_get_the_state() -> None:
    streams = clients()
    async with testing.streaming([], testing.flow("GET", "/global/event", response_headers=SSE)) as early:
        streams.subscribe(early, by="test")
        streams.publish("prt_1", ORPHAN)
        envelope = {"directory": "/cwd", "project": "prj"}
        assert drained(early.injected) == [
            {**envelope, "payload": event} for event in ORPHAN.state + ORPHAN.moment
        ]
        async with testing.streaming([], testing.flow("GET", "/global/event", response_headers=SSE)) as late:
            streams.subscribe(late, by="test")
            assert drained(late.injected) == [{**envelope, "payload": event} for event in ORPHAN.state]
        streams.unsubscribe(early)
        streams.publish("prt_2", ORPHAN)
        assert drained(early.injected) == []


async def test_an_instance_stream_gets_its_directorys_events_unwrapped() -> None:
    streams = clients()
    streams.publish("prt_1", ORPHAN)
    own = testing.flow("GET", "/event", headers={"x-opencode-directory": "%2Fcwd"}, response_headers=SSE)
    other = testing.flow("GET", "/event?directory=/elsewhere", response_headers=SSE)
    async with testing.streaming([], own), testing.streaming([], other):
        streams.subscribe(own, by="test")
        streams.subscribe(other, by="test")
        assert drained(own.injected) == ORPHAN.state
        assert drained(other.injected) == []


async def test_news_of_what_is_replayed_ends_its_replay() -> None:
    streams = clients()
    streams.publish("prt_1", ORPHAN)
    streams.publish("status", Telling(ORPHAN.place, state=[idle_status("ses_a")]))
    streams.heard(
        FollowedEvent("/cwd", "prj", "session.status", {"sessionID": "ses_a", "status": {"type": "busy"}})
    )
    async with testing.streaming(
        [], testing.flow("GET", "/event?directory=/cwd", response_headers=SSE)
    ) as flow:
        streams.subscribe(flow, by="test")
        assert drained(flow.injected) == ORPHAN.state  # the session busy ends its idle status, not the rest


async def test_what_is_not_a_client_event_stream_is_not_taken() -> None:
    streams = clients()
    for flow in (
        testing.flow("GET", "/global/event"),  # JSON, not a stream
        testing.flow("GET", "/api/session/ses_a/event", response_headers=SSE),
    ):
        async with testing.streaming([], flow):
            streams.subscribe(flow, by="test")
            assert flow.injected is None


async def test_a_plain_instance_stream_is_the_default_directorys() -> None:
    streams = clients()
    streams.default_directory = "/cwd"
    streams.publish("prt_1", ORPHAN)
    async with testing.streaming([], testing.flow("GET", "/event", response_headers=SSE)) as plain:
        streams.subscribe(plain, by="test")
        assert drained(plain.injected) == ORPHAN.state


async def test_a_plain_instance_stream_waits_for_the_default_directory_then_catches_up() -> None:
    streams = clients()
    streams.publish("prt_1", ORPHAN)
    async with testing.streaming([], testing.flow("GET", "/event", response_headers=SSE)) as plain:
        subscriber = streams.subscribe(plain, by="test")
        assert subscriber is not None
        assert subscriber.directory is None
        streams.publish("prt_2", ORPHAN)
        assert drained(plain.injected) == []  # not a guess: told nothing while the default is unknown
        streams.learned_default("/cwd")
        assert drained(plain.injected) == ORPHAN.state * 2  # the state (of both), as a stream opening now
        streams.publish("prt_3", ORPHAN)
        assert drained(plain.injected) == ORPHAN.state + ORPHAN.moment


async def test_a_plain_instance_stream_of_another_default_directory_is_not_told() -> None:
    streams = clients()
    streams.publish("prt_1", ORPHAN)
    async with testing.streaming([], testing.flow("GET", "/event", response_headers=SSE)) as plain:
        streams.subscribe(plain, by="test")
        streams.learned_default("/elsewhere")
        streams.publish("prt_2", ORPHAN)
        assert drained(plain.injected) == []


async def test_a_stream_back_after_the_server_was_lost_is_said_with_what_it_is_replayed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    streams = clients()
    streams.publish("prt_1", ORPHAN)
    caplog.set_level(logging.INFO, logger="proxy.addons.live.clients")
    async with testing.streaming([], testing.flow("GET", "/global/event", response_headers=SSE)) as first:
        streams.subscribe(first, by="test")
    assert not caplog.records, "a stream opening before any loss is no client coming back"
    streams.lost = True
    async with testing.streaming([], testing.flow("GET", "/global/event", response_headers=SSE)) as back:
        streams.subscribe(back, by="test")
    [record] = caplog.records
    assert record.getMessage() == (
        "client stream /global/event opened after the server was lost: "
        "replayed 1 event(s): message.updated of ses_a"
    )
    assert record.fields == {  # type: ignore[attr-defined]
        "route": "/global/event",
        "directory": "every",
        "replayed": 1,
        "decision": "replayed",
    }
