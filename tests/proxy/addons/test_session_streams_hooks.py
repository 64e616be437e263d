"""The session-stream-settle addon's hooks, a client's stream at a time through `proxy.testing`."""

import orjson
import pytest

from proxy import testing
from proxy.addons.context import SettleContext
from proxy.addons.session_streams import SessionStreamSettle
from proxy.opencode.client import UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.vocabulary import TOOL_FAILED
from proxy.service.metrics import Metrics
from tests.fixtures import compact
from tests.proxy.fake_opencode import FakeOpencode

V2 = "ses_dd6bd0f33ffejRStwdnQDIkDom"
STREAM = f"/api/session/{V2}/event"
SSE = {"Content-Type": "text/event-stream"}


@pytest.fixture
def addon(upstream_api: UpstreamApi, fake: FakeOpencode) -> SessionStreamSettle:
    fake.bodies[f"/api/session/{V2}/message"] = compact("v2-message-stale-running.json")
    ctx = SettleContext(LivenessProbe(upstream_api), upstream_api, Metrics(), grace=0)
    return SessionStreamSettle(ctx)


async def test_a_stale_sessions_stream_is_told_its_call_failed_once(addon: SessionStreamSettle) -> None:
    async with testing.streaming(addon, testing.flow("GET", STREAM, response_headers=SSE)) as flow:
        assert flow.injected is not None
        await addon.idle()
        frame = flow.injected.get_nowait()
        event = orjson.loads(frame.removeprefix(b"data: "))
        assert event["type"] == TOOL_FAILED
        assert event["data"]["callID"] == "call_mock_1"
        addon.following()  # the followed stream came back: confirmed again, told nothing new
        await addon.idle()
        assert flow.injected.empty()


async def test_a_busy_sessions_stream_is_told_nothing(addon: SessionStreamSettle, fake: FakeOpencode) -> None:
    fake.v2_active.add(V2)
    async with testing.streaming(addon, testing.flow("GET", STREAM, response_headers=SSE)) as flow:
        await addon.idle()
        assert flow.injected is not None
        assert flow.injected.empty()


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
    assert not addon.busy


async def test_closing_cancels_the_pending_confirmations(upstream_api: UpstreamApi) -> None:
    addon = SessionStreamSettle(
        SettleContext(LivenessProbe(upstream_api), upstream_api, Metrics(), grace=3600)
    )
    async with testing.streaming(addon, testing.flow("GET", STREAM, response_headers=SSE)):
        assert addon.busy
        await addon.close()  # KeyedTasks' close, listed before Addon's no-op among the bases
        assert not addon.busy
