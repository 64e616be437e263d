"""The session-stream-settle addon's hooks, a client's stream at a time through `proxy.testing`."""

import logging

import orjson
import pytest

from proxy import testing
from proxy.addons.context import SettleContext
from proxy.addons.live.addon import LiveSettle
from proxy.addons.live.session_streams import SessionStreamSettle
from proxy.addons.routing import Routing
from proxy.opencode.client import UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.tracker import FollowedEvent
from proxy.opencode.vocabulary import TOOL_FAILED
from proxy.relay.hooks import Addons, Flow
from proxy.service.metrics import Metrics
from tests.fixtures import compact, load
from tests.proxy.fake_opencode import FakeOpencode

V2 = "ses_dd6bd0f33ffejRStwdnQDIkDom"
STREAM = f"/api/session/{V2}/event"
SSE = {"Content-Type": "text/event-stream"}
V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
V1_PART = load("v1-message-stale-running.json")[1]["parts"][1]


@pytest.fixture
def addon(upstream_api: UpstreamApi, fake: FakeOpencode) -> SessionStreamSettle:
    fake.bodies[f"/api/session/{V2}/message"] = compact("v2-message-stale-running.json")
    ctx = SettleContext(LivenessProbe(upstream_api), upstream_api, Metrics(), grace=0)
    return SessionStreamSettle(ctx)


async def test_a_stale_sessions_stream_is_told_its_call_failed_once(addon: SessionStreamSettle) -> None:
    async with testing.streaming(addon, testing.flow("GET", STREAM, response_headers=SSE)) as flow:
        assert flow.injected is not None
        await addon.tasks.idle()
        frame = flow.injected.get_nowait()
        event = orjson.loads(frame.removeprefix(b"data: "))
        assert event["type"] == TOOL_FAILED
        assert event["data"]["callID"] == "call_mock_1"
        addon.following()  # the followed stream came back: confirmed again, told nothing new
        await addon.tasks.idle()
        assert flow.injected.empty()


async def test_a_busy_sessions_stream_is_told_nothing(addon: SessionStreamSettle, fake: FakeOpencode) -> None:
    fake.v2_active.add(V2)
    async with testing.streaming(addon, testing.flow("GET", STREAM, response_headers=SSE)) as flow:
        await addon.tasks.idle()
        assert flow.injected is not None
        assert flow.injected.empty()
    assert fake.liveness_requests >= 1, "the proxy asked before it decided"


async def test_a_stream_opened_while_a_confirmation_is_under_way_gets_one_after_it(
    addon: SessionStreamSettle, fake: FakeOpencode
) -> None:
    """The SDK's stream reconnects while the proxy confirms the session (it came back after a
    crash): that confirmation may have read too early to tell it, so another runs after it."""
    fake.v2_active.add(V2)
    fake.on_serve["/api/session/active"] = [lambda: None, lambda: fake.v2_active.discard(V2)]
    first = testing.streaming(addon, testing.flow("GET", STREAM, response_headers=SSE))
    second = testing.streaming(addon, testing.flow("GET", STREAM, response_headers=SSE))
    async with first as one, second as other:
        await addon.tasks.idle()
        assert [call_ids(flow) for flow in (one, other)] == [["call_mock_1"], ["call_mock_1"]]
    assert fake.liveness_requests == 2, "the first confirmation found the session active"


async def test_a_reading_that_fails_after_the_restart_is_asked_again(
    addon: SessionStreamSettle, fake: FakeOpencode
) -> None:
    """The server that has just restarted may not answer the first look-up; the stream is told all the same."""
    fake.liveness_fails = True
    fake.on_serve["/api/session/active"] = [lambda: None, lambda: setattr(fake, "liveness_fails", False)]
    async with testing.streaming(addon, testing.flow("GET", STREAM, response_headers=SSE)) as flow:
        await addon.tasks.idle()
        assert call_ids(flow) == ["call_mock_1"]
    assert fake.liveness_requests == 2


async def test_each_stream_is_told_once(addon: SessionStreamSettle) -> None:
    first = testing.streaming(addon, testing.flow("GET", STREAM, response_headers=SSE))
    second = testing.streaming(addon, testing.flow("GET", STREAM, response_headers=SSE))
    async with first as one:
        await addon.tasks.idle()
        async with second as other:
            await addon.tasks.idle()
            assert [call_ids(flow) for flow in (one, other)] == [["call_mock_1"], ["call_mock_1"]]


async def test_a_dry_run_tells_no_stream(
    upstream_api: UpstreamApi, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="proxy.addons.live.session_streams")
    fake.bodies[f"/api/session/{V2}/message"] = compact("v2-message-stale-running.json")
    ctx = SettleContext(LivenessProbe(upstream_api), upstream_api, Metrics(), grace=0, dry_run=True)
    addon = SessionStreamSettle(ctx)
    async with testing.streaming(addon, testing.flow("GET", STREAM, response_headers=SSE)) as flow:
        await addon.tasks.idle()
        assert call_ids(flow) == []
    assert "would settle orphaned call in session streams" in caplog.text  # decided, and told nothing


def call_ids(flow: Flow) -> list[str]:
    """The calls the flow's stream was told failed, in order (what is queued for it, taken)."""
    assert flow.injected is not None
    frames = [flow.injected.get_nowait() for _ in range(flow.injected.qsize())]
    return [orjson.loads(frame.removeprefix(b"data: "))["data"]["callID"] for frame in frames]


@pytest.mark.parametrize(
    ("method", "path", "status", "headers"),
    [
        ("GET", STREAM, 200, {"Content-Type": "application/json"}),
        ("GET", STREAM, 404, SSE),
        ("POST", STREAM, 200, SSE),
        ("GET", "/global/event", 200, SSE),
    ],
)
async def test_only_a_session_stream_gets_injections(
    addon: SessionStreamSettle, method: str, path: str, status: int, headers: dict[str, str]
) -> None:
    flow = await testing.cycle(addon, testing.flow(method, path, status=status, response_headers=headers))
    assert flow.injected is None
    assert not addon.tasks.busy


@pytest.mark.parametrize("owner", ["session-stream-settle", "live-settle"])
async def test_closing_the_addons_cancels_their_pending_confirmations(
    upstream_api: UpstreamApi, fake: FakeOpencode, owner: str
) -> None:
    """Application cleanup closes the addons through their dispatcher: a confirmation still in its
    grace period is cancelled and never reads the server, however the addon holds its tasks."""
    ctx = SettleContext(LivenessProbe(upstream_api), upstream_api, Metrics(), grace=3600)
    streams, live = SessionStreamSettle(ctx), LiveSettle(ctx)
    live.event(FollowedEvent("/cwd", "prj", "message.part.updated", {"part": V1_PART, "time": 1}))
    live.event(FollowedEvent("/cwd", "prj", "session.status", {"sessionID": V1, "status": {"type": "idle"}}))
    dispatcher = Addons([Routing(), streams, live], Metrics().addon_errors)
    closing = streams if owner == "session-stream-settle" else live
    async with testing.streaming([Routing(), streams], testing.flow("GET", STREAM, response_headers=SSE)):
        assert closing.tasks.busy
        asked = len(fake.seen)
        await dispatcher.close()
        assert not closing.tasks.busy
    assert fake.seen[asked:] == []
