"""Write-back through the API against the fake upstream: what is sent, and when nothing is. The
settle addon, through `proxy.testing`, schedules it as a view goes out; once, a whole proxy does
it for what the stream it follows left open."""

import copy
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest

from proxy import testing
from proxy.addons.settle import Settle
from proxy.testing import idle
from proxy.writeback.scheduler import WriteBack
from tests.fixtures import compact, js_json, load
from tests.proxy.conftest import ProxyClient, crash, following
from tests.proxy.fake_opencode import FakeOpencode

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
V2 = "ses_dd6bd0f33ffejRStwdnQDIkDom"
CALL = "call_mock_1"
Show = Callable[[str], Awaitable[Any]]


def v2_log(fake: FakeOpencode) -> None:
    kinds = [
        "prompt.admitted",
        "prompted",
        "step.started",
        "tool.input.started",
        "tool.input.ended",
        "tool.called",
    ]
    fake.events = [
        {
            "aggregate_id": V2,
            "seq": seq,
            "type": f"session.next.{kind}.1",
            "data": {"callID": CALL} if "tool" in kind else {},
        }
        for seq, kind in enumerate(kinds, start=1)
    ]
    fake.bodies[f"/api/session/{V2}/message"] = compact("v2-message-stale-running.json")


async def test_v1_settled_part_is_patched(shown: Show, fake: FakeOpencode) -> None:
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    document = await shown(f"/session/{V1}/message")
    ((path, part),) = fake.patches
    assert path == f"/session/{V1}/message/msg_229432faa0010ifWjJPo42f8Zo/part/prt_229433856001UdZM6dtgAYZqVe"
    assert part == document[1]["parts"][1]
    assert orjson.loads(fake.bodies[f"/session/{V1}/message"])[1]["parts"][1]["state"]["status"] == "error"


async def test_v1_part_cut_inside_an_emoji_is_patched_keeping_it(shown: Show, fake: FakeOpencode) -> None:
    messages = load("v1-message-stale-running.json")
    messages[1]["parts"][1]["state"]["metadata"]["output"] = "hello \ud83d"
    fake.bodies[f"/session/{V1}/message"] = js_json(messages)
    await shown(f"/session/{V1}/message")
    ((_, part),) = fake.patches
    assert part["state"]["metadata"] == {"output": "hello \ud83d", "interrupted": True}
    assert json.loads(fake.bodies[f"/session/{V1}/message"])[1]["parts"][1]["state"]["status"] == "error"


async def test_v2_failure_is_replayed_at_the_next_seq(shown: Show, fake: FakeOpencode) -> None:
    v2_log(fake)
    document = await shown(f"/api/session/{V2}/message")
    ((seq, event),) = fake.replays
    assert seq == 7
    assert event["type"] == "session.next.tool.failed.1"
    assert event["data"]["callID"] == CALL
    assert event["data"]["timestamp"] == document["data"][0]["content"][0]["time"]["completed"]
    assert event["data"]["error"] == {"type": "unknown", "message": "Tool execution interrupted"}


async def test_v2_concurrent_append_is_retried_without_gap(shown: Show, fake: FakeOpencode) -> None:
    v2_log(fake)
    fake.before_replay = [{"aggregate_id": V2, "seq": 7, "type": "session.updated.1", "data": {}}]
    await shown(f"/api/session/{V2}/message")
    assert [seq for seq, _ in fake.replays] == [7, 8]
    assert [e["seq"] for e in fake.events] == list(range(1, 9))
    assert [e["type"] for e in fake.events].count("session.next.tool.failed.1") == 1


async def test_v2_call_settled_by_the_server_meanwhile_is_not_duplicated(
    shown: Show, fake: FakeOpencode
) -> None:
    v2_log(fake)
    fake.before_replay = [
        {"aggregate_id": V2, "seq": 7, "type": "session.next.tool.failed.1", "data": {"callID": CALL}}
    ]
    await shown(f"/api/session/{V2}/message")
    assert [seq for seq, _ in fake.replays] == [7]
    assert [e["type"] for e in fake.events].count("session.next.tool.failed.1") == 1


async def test_nothing_is_written_when_the_second_reading_finds_the_session_active(
    asking: Settle, write_back: WriteBack, fake: FakeOpencode
) -> None:
    path = f"/session/{V1}/message"
    fake.bodies[path] = compact("v1-message-stale-running.json")
    flow = await testing.cycle(asking, testing.flow("GET", path, body=fake.bodies[path]))
    assert orjson.loads(flow.body)[1]["parts"][1]["state"]["status"] == "error"
    fake.v1_busy["/cwd"] = {V1}
    await write_back.tasks.idle()
    assert fake.patches == []
    assert fake.liveness_requests == 2, "premise: the write-back took its own reading"


async def test_active_session_schedules_nothing(shown: Show, fake: FakeOpencode) -> None:
    busy = next(iter(load("v2-active-busy.json")["data"]))
    fake.v2_active.add(busy)
    fake.bodies[f"/api/session/{busy}/message"] = compact("v2-message-busy-running.json")
    await shown(f"/api/session/{busy}/message")
    assert fake.replays == []


NEW_MESSAGE = "msg_ffffffffffffnewturnmessage"
NEW_PART = "prt_ffffffffffffnewturnpart01"
NEW_CALL = "call_new_turn"


def now_ms() -> int:
    return int(time.time() * 1000)


def v1_with_new_turn() -> bytes:
    """The stale history, and a turn that has just started: a new message with a running tool."""
    messages = load("v1-message-stale-running.json")
    turn = copy.deepcopy(messages[1])
    turn["info"] |= {"id": NEW_MESSAGE, "time": {"created": now_ms()}}
    for part in turn["parts"]:
        part["messageID"] = NEW_MESSAGE
    turn["parts"][0]["id"] = "prt_ffffffffffffnewturnstep01"
    turn["parts"][1] |= {"id": NEW_PART, "callID": NEW_CALL}
    turn["parts"][1]["state"]["time"] = {"start": now_ms()}
    return orjson.dumps([*messages, turn])


def v2_with_new_turn(fake: FakeOpencode) -> None:
    """The same for v2: a newer assistant message with a running call, and its events."""
    document = load("v2-message-stale-running.json")
    turn = copy.deepcopy(document["data"][0])
    turn |= {"id": NEW_MESSAGE, "time": {"created": now_ms()}}
    turn["content"][0] |= {"id": NEW_CALL, "time": {"created": now_ms(), "ran": now_ms()}}
    document["data"].insert(0, turn)
    fake.bodies[f"/api/session/{V2}/message"] = orjson.dumps(document)
    last = fake.events[-1]["seq"]
    fake.events += [
        {"aggregate_id": V2, "seq": last + n, "type": f"session.next.{kind}.1", "data": data}
        for n, (kind, data) in enumerate(
            [("prompt.admitted", {}), ("tool.called", {"callID": NEW_CALL})], start=1
        )
    ]


@pytest.mark.parametrize("busy", [True, False], ids=["busy", "not-yet-busy"])
async def test_v1_turn_started_before_the_write_is_left_alone(
    shown: Show, fake: FakeOpencode, busy: bool
) -> None:
    """A turn starts between the fetch and the write-back's re-read. Busy by then, nothing is
    written (the reading is taken after the re-read); not yet busy, only the part the fetch
    settled is."""
    path = f"/session/{V1}/message"
    fake.bodies[path] = compact("v1-message-stale-running.json")

    def new_turn() -> None:
        fake.bodies[path] = v1_with_new_turn()
        if busy:
            fake.v1_busy["/cwd"] = {V1}

    fake.on_serve[path] = [new_turn]  # before the write-back reads the view again
    await shown(path)
    patched = [part["id"] for _, part in fake.patches]
    assert patched == ([] if busy else ["prt_229433856001UdZM6dtgAYZqVe"])
    assert orjson.loads(fake.bodies[path])[2]["parts"][1]["state"]["status"] == "running"


@pytest.mark.parametrize("busy", [True, False], ids=["busy", "not-yet-busy"])
async def test_v2_turn_started_before_the_write_is_left_alone(
    shown: Show, fake: FakeOpencode, busy: bool
) -> None:
    """As for v1: a call of a turn that started after the fetch is never written."""
    v2_log(fake)
    path = f"/api/session/{V2}/message"

    def new_turn() -> None:
        v2_with_new_turn(fake)
        if busy:
            fake.v2_active.add(V2)

    fake.on_serve[path] = [new_turn]  # before the write-back reads the view again
    await shown(path)
    # The new turn's prompt leaves the old call to the server; the new call was never named.
    assert fake.replays == []


async def test_calls_the_followed_stream_left_open_are_written_once_it_is_back(
    write_back_proxy: ProxyClient, fake: FakeOpencode
) -> None:
    """After a crash the proxy confirms and writes what it saw open, before any client fetches."""
    v2_log(fake)
    await following(write_back_proxy)
    # One queue carries both: the event reaches the proxy before the stream ends.
    fake.publish("session.next.tool.called", V2, callID=CALL, tool="bash", input={"command": "sleep 600"})
    await crash(write_back_proxy, fake)
    await idle(write_back_proxy.app)
    ((seq, event),) = fake.replays
    assert (seq, event["type"], event["data"]["callID"]) == (7, "session.next.tool.failed.1", CALL)
