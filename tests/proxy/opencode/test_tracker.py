"""Liveness kept from the event stream: no extra upstream request once warm, never a guess."""

import time

import orjson
import pytest

from proxy.opencode.followed_events import UnreadableEvent
from proxy.opencode.readings import CLEAN_SESSIONS, CLEAN_VIEWS, KEPT_SESSIONS
from proxy.opencode.sessions import SessionEvent
from proxy.opencode.tracker import liveness_meaning, parse_event
from proxy.service.app import ASSEMBLY
from rules import Api
from tests.fixtures import OPENCODE, compact
from tests.proxy.conftest import ProxyClient, crash, following, publish
from tests.proxy.fake_opencode import FakeOpencode

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
V2 = "ses_dd6bd0f33ffejRStwdnQDIkDom"


async def settled_count(proxy: ProxyClient, path: str) -> str | None:
    response = await proxy.get(path)
    await response.read()
    return response.headers.get("X-Settle-Settled")


async def test_steady_state_needs_no_liveness_request(proxy: ProxyClient, fake: FakeOpencode) -> None:
    await following(proxy)
    fake.bodies[f"/api/session/{V2}/message"] = compact("v2-message-stale-running.json")
    for _ in range(5):
        assert await settled_count(proxy, f"/api/session/{V2}/message") == "1"
    assert fake.liveness_requests == 1


async def test_an_event_about_the_session_sends_the_proxy_back_to_asking(
    proxy: ProxyClient, fake: FakeOpencode
) -> None:
    await following(proxy)
    fake.bodies[f"/api/session/{V2}/message"] = compact("v2-message-stale-running.json")
    assert await settled_count(proxy, f"/api/session/{V2}/message") == "1"
    fake.v2_active.add(V2)
    await publish(proxy, fake, "session.next.prompt.admitted", V2)
    assert await settled_count(proxy, f"/api/session/{V2}/message") is None
    assert fake.liveness_requests == 2


async def test_v1_status_events_are_readings(proxy: ProxyClient, fake: FakeOpencode) -> None:
    await following(proxy)
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    await publish(proxy, fake, "session.status", V1, status={"type": "busy"})
    assert await settled_count(proxy, f"/session/{V1}/message") is None
    await publish(proxy, fake, "session.status", V1, status={"type": "idle"})
    # The part started long ago (fixture), so the kept "idle" is trusted without asking.
    assert await settled_count(proxy, f"/session/{V1}/message") == "1"
    assert fake.liveness_requests == 0


async def test_a_tool_alive_moments_ago_gets_a_fresh_reading(proxy: ProxyClient, fake: FakeOpencode) -> None:
    await following(proxy)
    messages = orjson.loads(compact("v1-message-stale-running.json"))
    messages[1]["parts"][1]["state"]["time"]["start"] = int(time.time() * 1000)
    fake.bodies[f"/session/{V1}/message"] = orjson.dumps(messages)
    await publish(proxy, fake, "session.status", V1, status={"type": "idle"})
    fake.v1_busy["/cwd"] = {V1}  # the upstream knows better than the kept reading
    assert await settled_count(proxy, f"/session/{V1}/message") is None
    assert fake.liveness_requests == 1


async def test_a_lost_stream_drops_every_reading(proxy: ProxyClient, fake: FakeOpencode) -> None:
    await following(proxy)
    fake.bodies[f"/api/session/{V2}/message"] = compact("v2-message-stale-running.json")
    await settled_count(proxy, f"/api/session/{V2}/message")
    await crash(proxy, fake)
    await settled_count(proxy, f"/api/session/{V2}/message")
    assert fake.liveness_requests == 2
    assert fake.subscribers == 2


@pytest.mark.parametrize(
    ("line", "meaning"),
    [
        (
            '{"payload":{"type":"session.status","properties":{"sessionID":"s","status":{"type":"busy"}}}}',
            (Api.V1, True),
        ),
        (
            '{"payload":{"type":"session.status","properties":{"sessionID":"s","status":{"type":"retry"}}}}',
            (Api.V1, True),
        ),
        (
            '{"payload":{"type":"session.status","properties":{"sessionID":"s","status":{"type":"idle"}}}}',
            (Api.V1, False),
        ),
        ('{"payload":{"type":"session.idle","properties":{"sessionID":"s"}}}', (Api.V1, False)),
        ('{"payload":{"type":"session.next.tool.called","properties":{"sessionID":"s"}}}', (Api.V2, None)),
        ('{"payload":{"type":"server.heartbeat","properties":{}}}', None),
        ('{"payload":{"type":"sync","syncEvent":{}}}', None),
        (
            '{"payload":{"type":"session.status","properties":{"sessionID":"s","status":{"type":"compacting"}}}}',
            (Api.V1, None),
        ),
        (
            '{"payload":{"type":"session.status","properties":{"sessionID":"s","status":"busy"}}}',
            (Api.V1, None),
        ),
    ],
)
def test_parse_event(line: str, meaning: tuple[Api, bool | None] | None) -> None:
    event = parse_event(line.encode())
    found = None if event is None else liveness_meaning(event)
    assert (None if found is None else (found.api, found.busy)) == meaning


@pytest.mark.parametrize("line", ["not json", '{"a":' * 2000 + "1" + "}" * 2000])
def test_what_the_decoder_refuses_is_unreadable(line: str) -> None:
    with pytest.raises(UnreadableEvent):
        parse_event(line.encode())


def test_every_status_event_in_a_real_capture_is_understood() -> None:
    lines = (OPENCODE / "sse-global-event-run1.txt").read_text().splitlines()
    events = [
        parse_event(line.removeprefix("data:").encode()) for line in lines if '"session.status"' in line
    ]
    meanings = [liveness_meaning(event) for event in events if event is not None]
    assert len(meanings) == len(events) > 0
    assert all(meaning is not None and meaning.api is Api.V1 for meaning in meanings)


async def test_a_clean_view_streams_through_unread_until_its_session_moves(
    proxy: ProxyClient, fake: FakeOpencode
) -> None:
    await following(proxy)
    path = f"/api/session/{V2}/message"
    tracker = proxy.app[ASSEMBLY].started.tracker
    fake.bodies[path] = compact("v2-message-interrupted.json")
    await settled_count(proxy, path)
    assert tracker.known_clean(V2, path)
    fake.bodies[path] = compact("v2-message-stale-running.json")  # changed without an event: not believable,
    assert (
        await settled_count(proxy, path) is None
    )  # so a stale mark may only skip a settlement, never invent one
    await publish(proxy, fake, "session.next.prompt.admitted", V2)
    assert not tracker.known_clean(V2, path)
    assert await settled_count(proxy, path) == "1"


async def test_a_status_unknown_here_keeps_no_reading(proxy: ProxyClient, fake: FakeOpencode) -> None:
    await following(proxy)
    tracker = proxy.app[ASSEMBLY].started.tracker
    await publish(proxy, fake, "session.status", V1, status={"type": "idle"})
    assert tracker.cached(Api.V1, V1) is not None
    await publish(proxy, fake, "session.status", V1, status={"type": "compacting"})
    assert tracker.cached(Api.V1, V1) is None, "unknown is not inactive: the proxy asks"
    fake.bodies[f"/session/{V1}/message"] = compact("v1-message-stale-running.json")
    assert await settled_count(proxy, f"/session/{V1}/message") == "1"
    assert fake.liveness_requests == 1


async def test_cache_busting_queries_leave_a_bounded_number_of_clean_marks(
    proxy: ProxyClient, fake: FakeOpencode
) -> None:
    await following(proxy)
    path = f"/api/session/{V2}/message"
    fake.bodies[path] = compact("v2-message-interrupted.json")
    for poll in range(3000):
        await settled_count(proxy, f"{path}?_={poll}")
    tracker = proxy.app[ASSEMBLY].started.tracker
    assert tracker.known_clean(V2, f"{path}?_=2999")
    assert not tracker.known_clean(V2, f"{path}?_=0")
    assert len(tracker.kept._clean[V2]) == CLEAN_VIEWS
    for number in range(CLEAN_SESSIONS + 50):
        tracker.mark_clean(f"ses_{number}", path)
    assert len(tracker.kept._clean) == CLEAN_SESSIONS


async def test_readings_are_kept_for_a_bounded_number_of_sessions(proxy: ProxyClient) -> None:
    await following(proxy)
    tracker = proxy.app[ASSEMBLY].started.tracker
    for number in range(KEPT_SESSIONS + 50):
        tracker.kept.apply(SessionEvent(f"ses_{number}", Api.V1, False))
    assert len(tracker.kept._readings) == KEPT_SESSIONS
    assert tracker.cached(Api.V1, "ses_0") is None
    assert tracker.cached(Api.V1, f"ses_{KEPT_SESSIONS + 49}") is not None
