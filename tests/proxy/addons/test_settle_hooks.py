"""The settle addon's hooks, one flow at a time through `proxy.testing.cycle` (no proxy in front)."""

from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest
from aiohttp import web
from yarl import URL

from proxy import testing
from proxy.addons.context import SettleContext
from proxy.addons.settle import SETTLED_HEADER, Settle
from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.tracker import KeptReading, LivenessTracker, StreamState
from proxy.service.metrics import Metrics
from rules import Api, Liveness
from tests.fixtures import compact
from tests.proxy.fake_opencode import FakeOpencode

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
VIEW = f"/session/{V1}/message"
STALE = compact("v1-message-stale-running.json")
CLEAN = compact("v1-message-after-patch.json").replace(
    b'"created":1795988598698}', b'"created":1,"completed":2}'
)
LONG_AFTER = 1_900_000_000_000
"""A reading's time (epoch ms) well after everything in `STALE`."""


async def test_a_stale_view_of_an_idle_session_is_settled(settle: Settle) -> None:
    flow = await testing.cycle(settle, testing.flow("GET", VIEW, body=STALE))
    assert flow.reads_whole
    assert flow.response_headers[SETTLED_HEADER] == "1"
    assert orjson.loads(flow.body)[1]["parts"][1]["state"]["status"] == "error"


async def test_a_message_view_is_asked_for_uncompressed(settle: Settle) -> None:
    flow = testing.flow("GET", VIEW, headers={"Accept-Encoding": "gzip, br"}, body=STALE)
    await testing.cycle(settle, flow)
    assert flow.upstream_headers["Accept-Encoding"] == "identity"
    other = await testing.cycle(settle, testing.flow("GET", "/config", headers={"Accept-Encoding": "gzip"}))
    assert other.upstream_headers["Accept-Encoding"] == "gzip"
    assert not other.reads_whole


async def test_a_busy_session_keeps_its_view(settle: Settle, fake: FakeOpencode) -> None:
    fake.v1_busy["/cwd"] = {V1}
    flow = await testing.cycle(settle, testing.flow("GET", VIEW, body=STALE))
    assert flow.body == STALE
    assert SETTLED_HEADER not in flow.response_headers


async def test_unknown_liveness_passes_the_view_unchanged(settle: Settle, fake: FakeOpencode) -> None:
    fake.liveness_fails = True
    flow = await testing.cycle(settle, testing.flow("GET", VIEW, body=STALE))
    assert flow.body == STALE
    assert SETTLED_HEADER not in flow.response_headers


@pytest.mark.parametrize(
    ("status", "content_type"), [(404, "application/json"), (200, "text/html"), (200, "text/event-stream")]
)
async def test_only_a_json_answer_of_200_is_read(settle: Settle, status: int, content_type: str) -> None:
    flow = testing.flow(
        "GET", VIEW, status=status, response_headers={"Content-Type": content_type}, body=STALE
    )
    await testing.cycle(settle, flow)
    assert not flow.reads_whole
    assert flow.body == STALE


class _CountedCredentials(LivenessProbe):
    """A probe that counts how often a request's credentials are worked out."""

    worked_out = 0

    def credentials(self, request: web.Request) -> Credentials:
        self.worked_out += 1
        return super().credentials(request)


async def test_a_view_settled_by_a_kept_reading_works_out_no_credentials(upstream_api: UpstreamApi) -> None:
    probe = _CountedCredentials(upstream_api)
    async with aiohttp.ClientSession() as session:
        tracker = LivenessTracker(session, URL("http://127.0.0.1:1"))
        tracker.state = StreamState.FOLLOWING
        tracker.store(Api.V1, Liveness(V1, active=False, taken_at=LONG_AFTER))
        settle = Settle(SettleContext(probe, upstream_api, Metrics(), grace=0), tracker=tracker)
        flow = await testing.cycle(settle, testing.flow("GET", VIEW, body=STALE))
    assert flow.response_headers[SETTLED_HEADER] == "1"
    assert probe.worked_out == 0, "nothing was asked and no write-back scheduled: none were needed"


class CountingTracker(LivenessTracker):
    """A tracker that says how often the view path asked it for a kept reading."""

    lookups = 0

    def cached(self, api: Api, session_id: str) -> KeptReading | None:
        self.lookups += 1
        return super().cached(api, session_id)


@pytest.fixture
async def counted(upstream_api: UpstreamApi) -> AsyncIterator[tuple[Settle, CountingTracker]]:
    async with aiohttp.ClientSession() as session:
        tracker = CountingTracker(session, URL("http://127.0.0.1:1"))
        ctx = SettleContext(LivenessProbe(upstream_api), upstream_api, Metrics(), grace=0)
        yield Settle(ctx, tracker=tracker), tracker


@pytest.mark.parametrize("body", [STALE, CLEAN])
async def test_one_view_request_asks_for_the_kept_reading_once(
    counted: tuple[Settle, CountingTracker], body: bytes
) -> None:
    """Asked with the headers, whether the body is read, and settled by that same word."""
    settle, tracker = counted
    flow = await testing.cycle(settle, testing.flow("GET", VIEW, body=body))
    assert flow.reads_whole
    assert (SETTLED_HEADER in flow.response_headers) is (body is STALE)
    assert orjson.loads(flow.body)
    assert tracker.lookups == 1


@pytest.mark.parametrize("length", [None, 100, 2**21])
async def test_a_view_known_clean_is_relayed_unread_whatever_its_size(
    counted: tuple[Settle, CountingTracker], length: int | None
) -> None:
    """Nothing in it to check: its pieces go out as they arrive, unheld."""
    settle, tracker = counted
    tracker.state = StreamState.FOLLOWING
    tracker.mark_clean(V1, VIEW)
    flow = testing.flow("GET", VIEW, body=STALE)
    flow.content_length = length
    flow = await testing.cycle(settle, flow)
    assert not flow.reads_whole
    assert flow.body == STALE
    assert tracker.lookups == 1


async def test_a_view_answered_other_than_200_asks_nothing(counted: tuple[Settle, CountingTracker]) -> None:
    settle, tracker = counted
    flow = await testing.cycle(settle, testing.flow("GET", VIEW, status=404, body=STALE))
    assert not flow.reads_whole
    assert tracker.lookups == 0
