"""What the addons keep per session, part and call is bounded, however many a peer names."""

from __future__ import annotations

import aiohttp
import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter
from yarl import URL

from proxy import testing
from proxy.addons import settle
from proxy.addons.context import SettleContext
from proxy.addons.live import replay as live_replay
from proxy.addons.live import session_streams
from proxy.addons.live.addon import LiveSettle
from proxy.addons.live.clients import ClientStreams, Telling
from proxy.addons.live.memory import Place
from proxy.addons.live.session_streams import SessionStreamSettle
from proxy.addons.settle import Settle
from proxy.opencode.client import UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.routes import MessageRoute
from proxy.opencode.tracker import FollowedEvent, LivenessTracker
from proxy.opencode.vocabulary import CALL_STARTED, PART_UPDATED, message_updated
from proxy.service.metrics import Metrics
from rules import Api
from tests.proxy.addons.live_streams import MESSAGE, V1
from tests.proxy.addons.test_live_comeback import prompt_and_answer
from tests.proxy.fake_opencode import FakeOpencode


def orphan(session_id: str, message_id: str = "msg_1") -> Telling:
    return Telling(
        Place(session_id, message_id, "/cwd", None), state=[message_updated(session_id, {"id": message_id})]
    )


def test_replayed_orphans_are_kept_for_a_bounded_number_of_sessions_and_parts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(live_replay, "REMEMBERED", 3)
    monkeypatch.setattr(live_replay, "REPLAYED_PER_SESSION", 2)
    streams = ClientStreams(Counter("injected", "", registry=CollectorRegistry()))
    for number in range(10):
        streams.publish(f"msg_{number}", orphan(f"ses_{number}"))
    for number in range(10):
        streams.publish(f"msg_many_{number}", orphan("ses_9", f"msg_many_{number}"))
    kept = streams.replays.sessions
    assert list(kept) == ["ses_7", "ses_8", "ses_9"]
    assert list(kept["ses_9"]) == ["message:msg_many_8", "message:msg_many_9"]


def test_user_messages_replayed_after_a_settlement_are_a_few_per_session() -> None:
    streams = ClientStreams(Counter("injected", "", registry=CollectorRegistry()))
    streams.publish("msg_1", orphan("ses_1"))
    for number in range(6):
        info = {"id": f"msg_user_{number}", "sessionID": "ses_1", "role": "user"}
        streams.heard(FollowedEvent("/cwd", None, "message.updated", {"sessionID": "ses_1", "info": info}))
    users = [subject for subject in streams.replays.sessions["ses_1"] if "user" in subject]
    assert users == [f"message:msg_user_{number}" for number in range(live_replay.USER_MESSAGES_PER_SESSION)]


async def test_calls_seen_open_are_kept_for_a_bounded_number_of_sessions_and_calls(
    monkeypatch: pytest.MonkeyPatch, upstream_api: UpstreamApi
) -> None:
    monkeypatch.setattr(session_streams, "_REMEMBERED", 3)
    monkeypatch.setattr(session_streams, "_CALLS_PER_SESSION", 2)
    addon = SessionStreamSettle(SettleContext(LivenessProbe(upstream_api), upstream_api, Metrics(), grace=0))
    for number in range(10):
        addon.event(FollowedEvent("/cwd", None, CALL_STARTED, {"sessionID": f"ses_{number}", "callID": "c"}))
    for number in range(10):
        addon.event(FollowedEvent("/cwd", None, CALL_STARTED, {"sessionID": "ses_9", "callID": f"c{number}"}))
    assert list(addon._open) == ["ses_7", "ses_8", "ses_9"]
    assert list(addon._open["ses_9"]) == ["c8", "c9"]


async def test_problems_said_once_are_remembered_for_a_bounded_number_of_sessions(
    monkeypatch: pytest.MonkeyPatch, upstream_api: UpstreamApi
) -> None:
    monkeypatch.setattr(settle, "REPORTED", 5)
    ctx = SettleContext(LivenessProbe(upstream_api), upstream_api, Metrics(), grace=0)
    async with aiohttp.ClientSession() as session:
        addon = Settle(ctx, tracker=LivenessTracker(session, URL("http://127.0.0.1:1")))
        for number in range(50):
            addon._report_once(MessageRoute(Api.V1, f"ses_{number}", single=False), "body is not JSON")
    assert len(addon._reported) == 5


def big_orphan(session_id: str, size: int) -> Telling:
    info = {"id": "msg_1", "sessionID": session_id, "summary": {"body": "x" * size}}
    return Telling(Place(session_id, "msg_1", "/cwd", None), state=[message_updated(session_id, info)])


def test_replays_are_kept_within_a_byte_budget_the_oldest_sessions_first() -> None:
    streams = ClientStreams(Counter("injected", "", registry=CollectorRegistry()))
    for number in range(100):
        streams.publish(f"msg_{number}", big_orphan(f"ses_{number}", 100_000))
    replays = streams.replays
    assert replays.size <= live_replay.REPLAYED_BYTES == 2 * 2**20
    assert replays.size == sum(r.size for kept in replays.sessions.values() for r in kept.values())
    assert "ses_99" in replays.sessions
    assert "ses_0" not in replays.sessions


def test_the_replays_bytes_are_given_back_as_their_events_go() -> None:
    streams = ClientStreams(Counter("injected", "", registry=CollectorRegistry()))
    streams.publish("msg_1", big_orphan("ses_1", 1_000))
    streams.publish("msg_1", big_orphan("ses_1", 5_000))  # the same message, told again
    replays = streams.replays
    assert 5_000 < replays.size < 6_000
    replays.withdraw("ses_1", "message:msg_1")
    assert replays.size == 0
    assert list(replays.sessions["ses_1"]) == []


async def settle_and_resume(live: LiveSettle, fake: FakeOpencode, number: int) -> None:
    """A session's call shown open, the server crashed and back, the call settled and told, then
    the server's write-back of it and a resumed turn, as the tracker hands them on."""
    session_id = f"ses_{number:04d}"
    raw = orjson.dumps(MESSAGE).replace(V1.encode(), session_id.encode())
    message = orjson.loads(raw.replace(MESSAGE["info"]["id"].encode(), f"msg_{number:04d}".encode()))
    fake.bodies[f"/session/{session_id}/message/{message['info']['id']}"] = orjson.dumps(message)
    part = message["parts"][1]
    live.event(FollowedEvent("/cwd", "prj", PART_UPDATED, {"sessionID": session_id, "part": part, "time": 1}))
    live.following()
    await live.tasks.idle()
    settled = {**part, "state": {**part["state"], "status": "error"}}
    for kind, properties in [(PART_UPDATED, {"part": settled, "time": 2}), *prompt_and_answer()]:
        said = orjson.loads(orjson.dumps(properties).replace(V1.encode(), session_id.encode()))
        live.event(FollowedEvent("/cwd", "prj", kind, {**said, "sessionID": session_id}))


async def test_sessions_settled_and_resumed_one_after_another_leave_the_replays_within_their_budget(
    monkeypatch: pytest.MonkeyPatch, upstream_api: UpstreamApi, fake: FakeOpencode
) -> None:
    monkeypatch.setattr(live_replay, "REPLAYED_BYTES", 20_000)
    live = LiveSettle(SettleContext(LivenessProbe(upstream_api), upstream_api, Metrics(), grace=0))
    for number in range(30):
        await settle_and_resume(live, fake, number)
    replays = live._clients.replays
    assert replays.size <= 20_000
    assert 1 < len(replays.sessions) < 30
    assert "ses_0029" in replays.sessions
    flow = testing.flow("GET", "/global/event", response_headers={"Content-Type": "text/event-stream"})
    async with testing.streaming(live, flow):
        assert flow.injected is not None
        told = [
            orjson.loads(flow.injected.get_nowait().removeprefix(b"data: "))
            for _ in range(flow.injected.qsize())
        ]
    sessions = {frame["payload"]["properties"].get("sessionID") for frame in told}
    assert "ses_0029" in sessions
    assert "ses_0000" not in sessions
