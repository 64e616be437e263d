"""The message views on their own: a body and the readings a stream and a probe give in, what
goes out and what is left open out; and the last rewrite of each view."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import aiohttp
import orjson
import pytest
from yarl import URL

from proxy import testing
from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.routes import MessageRoute
from proxy.opencode.tracker import LivenessTracker, StreamState
from proxy.views.message_views import (
    REMEMBERED_VIEWS,
    REWRITES_BYTES,
    Held,
    MessageViews,
    Reason,
    RecentRewrites,
    Settled,
    Unchanged,
)
from proxy.views.rewrite import Rewritten, rewrite
from rules import DEFAULT_RULES, Api, Doubt, Liveness
from tests.fixtures import compact
from tests.proxy.views.test_rewrite import INACTIVE, V2_LIST, v2_history

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
VIEW = f"/session/{V1}/message"
STALE = compact("v1-message-stale-running.json")
CLEAN = compact("v1-message-after-patch.json").replace(
    b'"created":1795988598698}', b'"created":1,"completed":2}'
)
ROUTE = MessageRoute(Api.V1, V1, single=False)
IDLE = Liveness(V1, active=False, taken_at=2**62)


def _settled_by_idle(body: bytes) -> Rewritten:
    rewritten = rewrite(body, ROUTE, IDLE)
    assert rewritten is not None
    return rewritten


SETTLED = _settled_by_idle(STALE)
LAST_ALIVE = SETTLED.messages.last_alive
TOO_CLOSE = Liveness(V1, active=False, taken_at=LAST_ALIVE)


class AnsweringProbe(LivenessProbe):
    """A probe whose fresh readings are `answers`, in order; it counts how often it is asked."""

    def __init__(self, upstream: UpstreamApi, answers: Sequence[Liveness]) -> None:
        super().__init__(upstream)
        self.answers = list(answers)
        self.asked = 0

    async def read(self, api: Api, session_id: str, credentials: Credentials) -> Liveness:
        self.asked += 1
        return self.answers.pop(0)


@pytest.fixture
async def tracker() -> AsyncIterator[LivenessTracker]:
    """A tracker that follows its stream (none is run: what it keeps is what a test stores)."""
    async with aiohttp.ClientSession() as session:
        tracker = LivenessTracker(session, URL("http://127.0.0.1:1"))
        tracker.state = StreamState.FOLLOWING
        yield tracker


async def settled(
    tracker: LivenessTracker, probe: LivenessProbe, body: bytes, kept: Liveness | None = None
) -> Settled:
    """What views over `tracker` and `probe` make of `body`, with `kept` the reading kept."""
    if kept is not None:
        tracker.store(Api.V1, kept)
    views = MessageViews(tracker, probe)
    request = testing.flow("GET", VIEW).request
    return await views.settle(views.stream_word(ROUTE, VIEW), ROUTE, body, request)


async def test_a_body_without_a_trigger_is_clean_before_any_reading(
    tracker: LivenessTracker, upstream_api: UpstreamApi
) -> None:
    probe = AnsweringProbe(upstream_api, [IDLE])
    assert await settled(tracker, probe, CLEAN) == Settled(Unchanged(Reason.CLEAN))
    assert probe.asked == 0
    assert MessageViews(tracker, probe).stream_word(ROUTE, VIEW).unchanged, "the view is known clean"


async def test_a_stale_body_is_settled_by_a_kept_reading_as_rewrite_settles_it(
    tracker: LivenessTracker, upstream_api: UpstreamApi
) -> None:
    probe = AnsweringProbe(upstream_api, [])
    assert await settled(tracker, probe, STALE, kept=IDLE) == Settled(SETTLED)


async def test_an_active_session_leaves_it_unchanged(
    tracker: LivenessTracker, upstream_api: UpstreamApi
) -> None:
    probe = AnsweringProbe(upstream_api, [Liveness(V1, active=True)])
    assert await settled(tracker, probe, STALE) == Settled(Unchanged(Reason.ACTIVE))
    views = MessageViews(tracker, probe)
    assert views.stream_word(ROUTE, VIEW).unchanged, "the active reading asked is kept"


async def test_a_body_of_another_shape_is_unchanged_with_what_is_wrong(
    tracker: LivenessTracker, upstream_api: UpstreamApi
) -> None:
    outcome = (
        await settled(tracker, AnsweringProbe(upstream_api, []), b'{"status":"running"}', IDLE)
    ).outcome
    assert isinstance(outcome, Unchanged)
    assert outcome.reason is Reason.UNEXPECTED_SHAPE
    assert "v1" in outcome.detail


async def test_a_kept_reading_too_close_gives_way_to_a_fresh_one(
    tracker: LivenessTracker, upstream_api: UpstreamApi
) -> None:
    probe = AnsweringProbe(upstream_api, [IDLE])
    assert await settled(tracker, probe, STALE, kept=TOO_CLOSE) == Settled(SETTLED)
    assert probe.asked == 1


@pytest.mark.parametrize(
    ("fresh", "doubt", "reason"),
    [
        (Liveness(V1, active=False, taken_at=0), Doubt.TOO_RECENT, Reason.CONSISTENT),
        (Liveness(V1, active=False, taken_at=2**62, elsewhere_since=0), Doubt.ELSEWHERE, Reason.CONSISTENT),
        (Liveness(V1, active=True), Doubt.ACTIVE, Reason.ACTIVE),
    ],
)
async def test_what_a_reading_holds_back_is_said_with_why(
    tracker: LivenessTracker, upstream_api: UpstreamApi, fresh: Liveness, doubt: Doubt, reason: Reason
) -> None:
    probe = AnsweringProbe(upstream_api, [fresh])
    outcome = await settled(tracker, probe, STALE, kept=TOO_CLOSE)
    message = SETTLED.messages.changes[0].target.message
    assert outcome == Settled(Unchanged(reason), (Held(message, doubt, LAST_ALIVE),))


async def test_equal_bytes_are_repeated_from_the_last_rewrite(
    tracker: LivenessTracker, upstream_api: UpstreamApi
) -> None:
    tracker.store(Api.V1, IDLE)
    views = MessageViews(tracker, AnsweringProbe(upstream_api, []))
    request = testing.flow("GET", VIEW).request
    first = await views.settle(views.stream_word(ROUTE, VIEW), ROUTE, STALE, request)
    again = await views.settle(views.stream_word(ROUTE, VIEW), ROUTE, bytes(STALE), request)
    assert isinstance(first.outcome, Rewritten)
    assert (first.repeated, again.repeated) == (False, True)
    assert again.outcome is first.outcome


def test_recent_rewrites_reuse_the_same_bytes_only() -> None:
    recent = RecentRewrites(budget=10 * 2**20)
    body = orjson.dumps(v2_history({1}))
    assert recent.repeated("ses_x", "/v", body) is None
    first = recent.rewrite("/v", body, V2_LIST, INACTIVE, DEFAULT_RULES)
    assert first is not None
    assert recent.repeated("ses_x", "/v", bytes(body)) is first
    assert recent.repeated("ses_x", "/other", body) is None
    changed = orjson.dumps(v2_history({2}))
    assert recent.repeated("ses_x", "/v", changed) is None
    other = recent.rewrite("/v", changed, V2_LIST, INACTIVE, DEFAULT_RULES)
    assert other is not None
    assert other.body != first.body
    assert recent.repeated("ses_x", "/v", body) is None, "only the last body of a view is kept"


def test_recent_rewrites_stay_within_budget() -> None:
    body = orjson.dumps(v2_history({1}))
    recent = RecentRewrites(budget=3 * len(body))
    for view in ("/a", "/b", "/c"):
        recent.rewrite(view, body, V2_LIST, INACTIVE, DEFAULT_RULES)
    assert recent.repeated("ses_x", "/a", body) is None, (
        "the oldest entry was dropped to stay within the budget"
    )
    assert recent.repeated("ses_x", "/c", body) is not None


def test_cache_busting_queries_keep_a_bounded_number_of_rewrites() -> None:
    body = orjson.dumps(v2_history({1}))
    recent = RecentRewrites()
    for poll in range(3000):
        recent.rewrite(f"/v?_={poll}", body, V2_LIST, INACTIVE, DEFAULT_RULES)
    assert len(recent._entries) == REMEMBERED_VIEWS
    assert recent.repeated("ses_x", "/v?_=2999", body) is not None
    assert recent.repeated("ses_x", "/v?_=0", body) is None


def test_a_rewrite_forgotten_for_the_number_of_views_frees_its_bytes() -> None:
    body = orjson.dumps(v2_history({1}))
    rewritten = RecentRewrites().rewrite("/x", body, V2_LIST, INACTIVE, DEFAULT_RULES)
    assert rewritten is not None
    recent = RecentRewrites(budget=2 * (len(body) + len(rewritten.body)), views=2)
    for view in ("/a", "/b", "/c", "/d"):  # /a goes for the number of views, then /b for the bytes
        recent.rewrite(view, body, V2_LIST, INACTIVE, DEFAULT_RULES)
    kept = [view for view in ("/a", "/b", "/c", "/d") if recent.repeated("ses_x", view, body)]
    assert kept == ["/c", "/d"]


def test_the_rewrites_kept_by_default_stay_within_a_few_mib() -> None:
    body = orjson.dumps(v2_history({1}, size=300))
    assert len(body) > 100_000
    recent = RecentRewrites()
    for view in range(100):
        recent.rewrite(f"/v{view}", body, V2_LIST, INACTIVE, DEFAULT_RULES)
    assert recent._size <= REWRITES_BYTES == 4 * 2**20
    assert recent.repeated("ses_x", "/v99", body) is not None
