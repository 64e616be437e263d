"""The live-settle addon at its interfaces, through `proxy.testing`: the followed stream's events
handed to it as the tracker hands them, a client stream a flow, the upstream the fake. What it
decides to tell a client stream is what is queued for that flow once its confirmations are over."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy import testing
from proxy.addons.context import SettleContext
from proxy.addons.live import LiveSettle
from proxy.opencode.client import UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.tracker import GlobalEvent
from proxy.service.metrics import Metrics
from tests.fixtures import load
from tests.proxy.fake_opencode import FakeOpencode

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
MESSAGE = load("v1-message-stale-running.json")[1]
PART = MESSAGE["parts"][1]
WRITING_INFO: dict[str, Any] = {**MESSAGE["info"], "id": "msg_writing"}
SSE = {"Content-Type": "text/event-stream"}


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def live(upstream_api: UpstreamApi, fake: FakeOpencode, metrics: Metrics) -> LiveSettle:
    fake.bodies[f"/session/{V1}/message/{MESSAGE['info']['id']}"] = orjson.dumps(MESSAGE)
    fake.bodies[f"/session/{V1}/message/msg_writing"] = orjson.dumps({"info": WRITING_INFO, "parts": []})
    return LiveSettle(SettleContext(LivenessProbe(upstream_api), upstream_api, metrics, grace=0.05))


def heard(live: LiveSettle, kind: str, **properties: Any) -> None:
    live.event(GlobalEvent("/cwd", "prj", kind, {"sessionID": V1, **properties}))


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
    assert kinds == ["message.part.updated", "message.updated", "session.status"]


async def test_nothing_is_said_of_a_part_the_server_settled_itself(live: LiveSettle) -> None:
    crash_with_part_open(live)
    heard(live, "message.part.updated", part={**PART, "state": {**PART["state"], "status": "completed"}})
    assert await told_a_new_stream(live) == []


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
