"""A confirmation another process on the database held back (`opencode export`, a sqlite3 shell,
a second opencode that opened it before the call) is made again once that process exits: a
client stream open through the crash is then told, on 1.18's `/global/event` and on 2.x's
`/api/event`, and the log says both decisions."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy import testing
from proxy.addons.context import SettleContext
from proxy.addons.live import held as live_held
from proxy.addons.live.addon import LiveSettle
from proxy.addons.live.held import Holds
from proxy.addons.live.session_streams import SessionStreamSettle
from proxy.opencode import other_processes as processes
from proxy.opencode import surveys
from proxy.opencode.client import UpstreamApi
from proxy.opencode.dialects import LINE_2X
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.server_line import KnownServer, ServerLine
from proxy.opencode.tracker import FollowedEvent
from proxy.relay.hooks import Flow
from proxy.service.metrics import Metrics
from rules import Liveness
from tests.fixtures import compact
from tests.fixtures.opencode2 import load
from tests.proxy.addons import test_live_hooks as hooks
from tests.proxy.addons.live_streams import GRACE_S, MESSAGE, V1
from tests.proxy.fake_opencode import FakeOpencode
from tests.proxy.system.fake_proc import BOOT_S, DB, FakeProc

HOLDER = 200
V1_CREATED = 1795988598698
"""When the assistant message of the stale v1 fixture was created."""
V2 = "ses_dd6bd0f33ffejRStwdnQDIkDom"
V2_LAST_ALIVE = 1795988584703
"""The latest time in `v2-message-stale-running.json` (its tool's `ran`), after the holder started."""
LINE_2 = ServerLine.told(KnownServer("2.0.0", LINE_2X, True, "(told)"))


@pytest.fixture
def holder(proc: FakeProc, upstream: TestServer, monkeypatch: pytest.MonkeyPatch) -> FakeProc:
    """The fake upstream listening and holding DB, and another process holding it since before
    the call; `proc.root / "200"` removed, that process has exited."""
    assert upstream.port is not None
    proc.listen(upstream.port, "555")
    proc.process(100, "socket:[555]", DB, started_at=BOOT_S * 1000)
    proc.process(HOLDER, DB, started_at=V1_CREATED - 60_000, comm="sqlite3")  # after the boot
    monkeypatch.setattr(processes, "PROC", proc.root)
    monkeypatch.setattr(surveys, "MAX_AGE_S", 0.0)
    monkeypatch.setattr(live_held, "PAUSES_S", (0.01,))
    return proc


@pytest.fixture
async def bounded(upstream: TestServer, upstream_api: UpstreamApi) -> AsyncIterator[LivenessProbe]:
    """Readings bounded by the other holders of the fake's database."""
    elsewhere = surveys.OtherProcesses(URL(str(upstream.make_url("/"))))
    try:
        yield LivenessProbe(upstream_api, elsewhere=elsewhere)
    finally:
        await elsewhere.close()


def live_settle(
    probe: LivenessProbe, upstream_api: UpstreamApi, server: ServerLine | None = None
) -> LiveSettle:
    return LiveSettle(SettleContext(probe, upstream_api, Metrics(), grace=GRACE_S), server=server)


async def next_kinds(flow: Flow, count: int) -> list[str]:
    """The kinds of the next `count` events queued for a client stream, as they come."""
    assert flow.injected is not None
    kinds = []
    async with asyncio.timeout(testing.WAIT_S):
        for _ in range(count):
            event = orjson.loads((await flow.injected.get()).removeprefix(b"data: "))
            kinds.append(event.get("payload", event)["type"])
    return kinds


async def test_a_v1_part_held_back_by_a_holder_is_told_once_it_exits(
    holder: FakeProc,
    bounded: LivenessProbe,
    upstream_api: UpstreamApi,
    fake: FakeOpencode,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    fake.bodies[f"/session/{V1}/message/{MESSAGE['info']['id']}"] = orjson.dumps(MESSAGE)
    live = live_settle(bounded, upstream_api)
    stream = testing.flow("GET", "/global/event", response_headers=hooks.SSE)
    async with testing.streaming(live, stream) as flow:
        hooks.crash_with_part_open(live)
        await live.tasks.idle()
        assert flow.injected is not None
        assert flow.injected.empty()
        assert "open parts left open, another process on the server's database" in caplog.text
        shutil.rmtree(holder.root / str(HOLDER))  # the sqlite3 shell exits
        told = await next_kinds(flow, 4)
        await live.close()
    assert told == ["message.part.updated", "message.updated", "session.status", "session.idle"]
    assert "the process that held it back is gone; confirming again" in caplog.text


async def test_a_2x_call_held_back_by_a_holder_is_told_once_it_exits(
    holder: FakeProc, bounded: LivenessProbe, upstream_api: UpstreamApi, fake: FakeOpencode
) -> None:
    message: dict[str, Any] = load("assistant-tool-running.json")
    message["time"] = {"created": V1_CREATED}  # alive after the holder started, as the v1 one
    message["content"][0]["time"] = {"created": V1_CREATED + 50, "ran": V1_CREATED + 61}
    session, call = "ses_2x", message["content"][0]["id"]
    fake.bodies[f"/api/session/{session}/message/{message['id']}"] = orjson.dumps({"data": message})
    live = live_settle(bounded, upstream_api, LINE_2)
    stream = testing.flow("GET", "/api/event", response_headers=hooks.SSE)
    async with testing.streaming(live, stream) as flow:
        opened = {"sessionID": session, "assistantMessageID": message["id"], "id": call, "name": "shell"}
        live.event(FollowedEvent(None, None, "session.tool.called", opened, line_2x=True))
        live.following()
        await live.tasks.idle()
        assert flow.injected is not None
        assert flow.injected.empty()
        shutil.rmtree(holder.root / str(HOLDER))
        told = await next_kinds(flow, 2)
        await live.close()
    assert told == ["session.tool.failed", "session.execution.interrupted"]


async def test_a_1_18_v2_call_held_back_by_a_holder_is_told_on_its_session_stream_once_it_exits(
    holder: FakeProc, bounded: LivenessProbe, upstream_api: UpstreamApi, fake: FakeOpencode
) -> None:
    assert V2_LAST_ALIVE > V1_CREATED - 60_000  # the holder started before the call
    fake.bodies[f"/api/session/{V2}/message"] = compact("v2-message-stale-running.json")
    streams = SessionStreamSettle(SettleContext(bounded, upstream_api, Metrics(), grace=GRACE_S))
    stream = testing.flow("GET", f"/api/session/{V2}/event", response_headers=hooks.SSE)
    async with testing.streaming(streams, stream) as flow:
        await streams.tasks.idle()
        assert flow.injected is not None
        assert flow.injected.empty()
        shutil.rmtree(holder.root / str(HOLDER))
        told = await next_kinds(flow, 1)
        await streams.close()
    assert told == ["session.next.tool.failed"]


def alive_at(message: dict[str, Any], last_alive: int) -> dict[str, Any]:
    """`message` with its times moved so that the last of them is `last_alive`."""
    moved: dict[str, Any] = orjson.loads(orjson.dumps(message))
    shift = last_alive - moved["parts"][1]["state"]["time"]["start"]
    moved["info"]["time"]["created"] += shift
    moved["parts"][1]["state"]["time"]["start"] += shift
    return moved


async def test_a_v1_part_alive_too_shortly_before_the_reading_is_told_once_the_margin_passed(
    upstream_api: UpstreamApi, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    """A short grace can make the first reading after a restart too recent to vouch for a part;
    nothing else would ask again, so the part is confirmed again once the margin has passed."""
    caplog.set_level(logging.INFO)
    message = alive_at(MESSAGE, int(time.time() * 1000) - 1000)
    fake.bodies[f"/session/{V1}/message/{MESSAGE['info']['id']}"] = orjson.dumps(message)
    live = live_settle(LivenessProbe(upstream_api), upstream_api)
    stream = testing.flow("GET", "/global/event", response_headers=hooks.SSE)
    async with testing.streaming(live, stream) as flow:
        hooks.crash_with_part_open(live)
        told = await next_kinds(flow, 4)
        await live.close()
    assert told == ["message.part.updated", "message.updated", "session.status", "session.idle"]
    assert "open parts left open, alive too shortly before the reading; confirmed again" in caplog.text


def test_holds_say_what_left_each_call_open() -> None:
    """The bound holds what only it holds, however recent; recency what a later reading settles."""
    alive = {"recent": 10_000, "elsewhere": 10_500, "old": 1_000}

    def settles(reading: Liveness) -> set[str]:
        return {call for call, last in alive.items() if reading.vouches_for(last)}

    reading = Liveness("ses", active=False, taken_at=11_000, elsewhere_since=10_200)
    assert Holds.of(settles, reading) == Holds(frozenset({"elsewhere"}), frozenset({"recent"}))
    assert Holds.of(settles, dataclasses.replace(reading, active=True)) == Holds(frozenset(), frozenset())
