"""The view rewriter on its own (bytes and a reading in, settled bytes or "unchanged, because"
out, nothing asked), and the settle addon asking each thing once per request."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest
from yarl import URL

from proxy import testing
from proxy.addons.context import SettleContext
from proxy.addons.settle import SETTLED_HEADER, Settle
from proxy.opencode.client import UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.routes import MessageRoute
from proxy.opencode.tracker import KeptReading, LivenessTracker
from proxy.service.metrics import Metrics
from proxy.views.rewrite import Rewritten, rewrite
from proxy.views.rewriter import Held, Reason, Scanned, Unchanged, ViewRewriter
from rules import Api, Doubt, Liveness
from tests.fixtures import compact

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
VIEW = f"/session/{V1}/message"
STALE = compact("v1-message-stale-running.json")
CLEAN = compact("v1-message-after-patch.json").replace(
    b'"created":1795988598698}', b'"created":1,"completed":2}'
)
ROUTE = MessageRoute(Api.V1, V1, single=False)
IDLE = Liveness(V1, active=False, taken_at=2**62)


def scanned(body: bytes) -> Scanned:
    found = ViewRewriter().scan(ROUTE, VIEW, body)
    assert isinstance(found, Scanned)
    return found


def test_a_body_without_a_trigger_is_unchanged_before_any_reading() -> None:
    assert ViewRewriter().scan(ROUTE, VIEW, CLEAN) == Unchanged(Reason.CLEAN)


def test_a_stale_body_is_settled_as_rewrite_settles_it() -> None:
    outcome = ViewRewriter().settle(scanned(STALE), IDLE)
    assert isinstance(outcome, Rewritten)
    assert outcome == rewrite(STALE, ROUTE, IDLE)


def test_an_active_session_leaves_it_unchanged() -> None:
    assert ViewRewriter().settle(scanned(STALE), Liveness(V1, active=True)) == Unchanged(Reason.ACTIVE)


def test_a_body_of_another_shape_is_unchanged_with_what_is_wrong() -> None:
    outcome = ViewRewriter().settle(scanned(b'{"status":"running"}'), IDLE)
    assert isinstance(outcome, Unchanged)
    assert outcome.reason is Reason.UNEXPECTED_SHAPE
    assert "v1" in outcome.detail


def test_a_reading_too_close_settles_exactly_what_it_vouches_for() -> None:
    rewriter = ViewRewriter()
    found = scanned(STALE)
    later = rewriter.settle(found, IDLE)
    assert isinstance(later, Rewritten)
    too_close = Liveness(V1, active=False, taken_at=later.messages.last_alive)
    assert rewriter.settle_exactly(found, too_close) == Unchanged(Reason.CONSISTENT)


@pytest.mark.parametrize(
    ("bound", "doubt"),
    [
        ({"taken_at": 0}, Doubt.TOO_RECENT),
        ({"taken_at": 2**62, "elsewhere_since": 0}, Doubt.ELSEWHERE),
    ],
)
def test_what_a_reading_holds_back_is_said_with_why(bound: dict[str, int], doubt: Doubt) -> None:
    rewriter = ViewRewriter()
    found = scanned(STALE)
    later = rewriter.settle(found, Liveness(V1, active=False, **bound))
    assert isinstance(later, Rewritten)
    held = Liveness(V1, active=False, **bound)
    exactly = rewriter.settle_exactly(found, held)
    assert exactly == Unchanged(Reason.CONSISTENT)
    message = later.messages.changes[0].target.message
    last_alive = later.messages.last_alive
    assert rewriter.held_back(later, exactly, held) == [Held(message, doubt, last_alive)]
    assert rewriter.held_back(later, later, IDLE) == []


def test_equal_bytes_are_known_from_the_last_rewrite() -> None:
    rewriter = ViewRewriter()
    first = rewriter.settle(scanned(STALE), IDLE)
    again = rewriter.scan(ROUTE, VIEW, STALE)
    assert isinstance(again, Scanned)
    assert again.known is first


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
    settle, tracker = counted
    flow = await testing.cycle(settle, testing.flow("GET", VIEW, body=body))
    assert flow.reads_whole
    assert (SETTLED_HEADER in flow.response_headers) is (body is STALE)
    assert orjson.loads(flow.body)
    assert tracker.lookups == 1
