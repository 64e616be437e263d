"""After a lost `/api/event`, what the stream missed is read from 2.x's durable session log before the
follower says it follows (`proxy.opencode.durable_log`), against each log the stand-in answers
(`tests.opencode2.session_log`): the events, the marker alone (the `v2` build @2092350c), no route."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from proxy.opencode.tracker import LivenessTracker
from proxy.service.app import ASSEMBLY
from rules import Api
from tests.opencode2.proxied import PASSWORD, Client, Seen, proxied
from tests.opencode2.session_log import Log
from tests.opencode2.stand_in import StandIn

CATCH_UP_LOG = "proxy.opencode.durable_log"
NO_LOG = "the server keeps no durable session log the proxy can read"


def call(session_id: str, message_id: str = "msg_1", call_id: str = "call_1") -> dict[str, Any]:
    return {"sessionID": session_id, "assistantMessageID": message_id, "id": call_id}


async def heard(seen: Seen, kind: str, count: int = 1) -> None:
    await seen.until(lambda: sum(event.kind == kind for event in seen.events) >= count)


async def lose_stream(server: StandIn, seen: Seen, *, meanwhile: Any = None) -> None:
    """A SIGKILL and a restart of the server; `meanwhile()` publishes while no stream is open; returns
    once the follower follows again."""
    followed = seen.followed
    await server.crash()
    if meanwhile is not None:
        meanwhile()
    await server.restart()
    await seen.until(lambda: seen.followed > followed)


def kinds(seen: Seen, session_id: str) -> list[str]:
    return [event.kind for event in seen.events if event.session_id == session_id]


def tracker_of(proxy: Any) -> LivenessTracker:
    tracker: LivenessTracker = proxy.app[ASSEMBLY].started.tracker
    return tracker


async def test_what_the_stream_missed_is_learned_from_the_log_before_following(
    aiohttp_client: Client,
) -> None:
    async with StandIn(password=PASSWORD, session_log=Log.EVENTS) as server:
        session_id = server.add_session()
        async with proxied(server, aiohttp_client) as (proxy, seen):
            server.publish("session.execution.started", {"sessionID": session_id})
            await heard(seen, "session.execution.started")

            def meanwhile() -> None:  # a call that opened and closed, and the turn's end, unseen
                server.publish("session.tool.called", call(session_id) | {"name": "shell", "input": {}})
                server.publish("session.tool.success", call(session_id))
                server.publish("session.execution.succeeded", {"sessionID": session_id})

            await lose_stream(server, seen, meanwhile=meanwhile)
            reading = tracker_of(proxy).cached(Api.V2, session_id)
    assert kinds(seen, session_id) == [
        "session.execution.started",
        "session.tool.called",
        "session.tool.success",
        "session.execution.succeeded",
    ]
    assert reading is not None
    assert reading.liveness.active is False


async def test_a_frame_the_log_delivered_is_not_handed_on_twice(aiohttp_client: Client) -> None:
    async with StandIn(password=PASSWORD, session_log=Log.EVENTS) as server:
        session_id = server.add_session()

        async def published_while_read() -> None:  # on the new stream and in the log both
            server.process.before_log = None
            server.publish("session.execution.succeeded", {"sessionID": session_id})

        async with proxied(server, aiohttp_client) as (_, seen):
            server.publish("session.execution.started", {"sessionID": session_id})
            await heard(seen, "session.execution.started")
            server.process.before_log = published_while_read
            await lose_stream(server, seen)
            server.publish("session.status", {"sessionID": session_id, "status": {"type": "idle"}})
            await heard(seen, "session.status")
    assert kinds(seen, session_id) == [
        "session.execution.started",
        "session.execution.succeeded",
        "session.status",
    ]


@pytest.mark.parametrize(
    ("server", "why"),
    [
        (lambda: StandIn(password=PASSWORD), "gave back no event, only its head, seq 1, though the stream"),
        (lambda: StandIn.from_source(password=PASSWORD), "holds nothing but the stream showed seq 1"),
        (
            lambda: StandIn(password=PASSWORD, session_log=Log.ABSENT),
            "HTTP 404 on /api/experimental/session/",
        ),
    ],
    ids=["2.1.2-head-only", "marker-only", "no-route"],
)
async def test_a_log_that_gives_nothing_back_is_said_once_and_the_stream_followed(
    aiohttp_client: Client, caplog: pytest.LogCaptureFixture, server: Any, why: str
) -> None:
    caplog.set_level(logging.INFO, "proxy")
    async with server() as stand_in:
        session_id = stand_in.add_session()
        async with proxied(stand_in, aiohttp_client) as (_, seen):
            stand_in.publish("session.execution.started", {"sessionID": session_id})
            await heard(seen, "session.execution.started")
            for _ in range(2):
                await lose_stream(stand_in, seen)
            stand_in.publish("session.execution.succeeded", {"sessionID": session_id})
            await heard(seen, "session.execution.succeeded")
    said = [record for record in caplog.records if record.name == CATCH_UP_LOG]
    assert [record.levelno for record in said] == [logging.INFO]
    assert NO_LOG in said[0].getMessage()
    assert why in said[0].getMessage()
    assert kinds(seen, session_id) == ["session.execution.started", "session.execution.succeeded"]


async def test_a_session_the_log_does_not_know_is_forgotten_not_taken_for_a_missing_log(
    aiohttp_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "proxy")
    async with StandIn(password=PASSWORD, session_log=Log.EVENTS) as server:
        gone, kept = server.add_session(), server.add_session()
        async with proxied(server, aiohttp_client) as (_, seen):
            server.publish("session.execution.started", {"sessionID": kept})
            server.publish("session.execution.started", {"sessionID": gone})
            await heard(seen, "session.execution.started", 2)

            def meanwhile() -> None:
                del server.store.sessions[gone]
                server.publish("session.execution.succeeded", {"sessionID": kept})

            await lose_stream(server, seen, meanwhile=meanwhile)
    assert kinds(seen, kept) == ["session.execution.started", "session.execution.succeeded"]
    assert not [record for record in caplog.records if record.name == CATCH_UP_LOG]


@pytest.mark.parametrize("fault", ["hangs", "fails"])
async def test_a_log_read_that_hangs_or_fails_is_bounded_and_following_goes_on(
    aiohttp_client: Client, caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    caplog.set_level(logging.INFO, "proxy")
    never = asyncio.Event()

    async def broken() -> None:
        if fault == "hangs":
            await never.wait()
        raise ConnectionResetError("the log's read failed")

    async with StandIn(password=PASSWORD, session_log=Log.EVENTS) as server:
        session_id = server.add_session()
        async with proxied(server, aiohttp_client, connect_timeout=0.5) as (_, seen):
            server.publish("session.execution.started", {"sessionID": session_id})
            await heard(seen, "session.execution.started")
            server.process.before_log = broken
            await lose_stream(server, seen)
            server.publish("session.execution.succeeded", {"sessionID": session_id})
            await heard(seen, "session.execution.succeeded")
            never.set()
    said = [record.getMessage() for record in caplog.records if record.name == CATCH_UP_LOG]
    assert len(said) == 1
    assert (
        said[0].startswith(f"reading the durable log of {session_id} failed: ")
        or "answered HTTP 500" in said[0]
    )
    assert "the stream is followed" in said[0]
