"""What the addons keep per session, part and call is bounded, however many a peer names."""

from __future__ import annotations

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter
from yarl import URL

from proxy.addons import live_replay, session_streams, settle
from proxy.addons.context import SettleContext
from proxy.addons.live_clients import ClientStreams, Orphan
from proxy.addons.live_memory import Place
from proxy.addons.session_streams import SessionStreamSettle
from proxy.addons.settle import Settle
from proxy.opencode.client import UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.routes import MessageRoute
from proxy.opencode.tracker import GlobalEvent, LivenessTracker
from proxy.opencode.vocabulary import CALL_STARTED, message_updated
from proxy.service.metrics import Metrics
from rules import Api


def orphan(session_id: str, message_id: str = "msg_1") -> Orphan:
    return Orphan(
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
        streams.heard(GlobalEvent("/cwd", None, "message.updated", {"sessionID": "ses_1", "info": info}))
    users = [subject for subject in streams.replays.sessions["ses_1"] if "user" in subject]
    assert users == [f"message:msg_user_{number}" for number in range(live_replay.USER_MESSAGES_PER_SESSION)]


async def test_calls_seen_open_are_kept_for_a_bounded_number_of_sessions_and_calls(
    monkeypatch: pytest.MonkeyPatch, upstream_api: UpstreamApi
) -> None:
    monkeypatch.setattr(session_streams, "_REMEMBERED", 3)
    monkeypatch.setattr(session_streams, "_CALLS_PER_SESSION", 2)
    addon = SessionStreamSettle(SettleContext(LivenessProbe(upstream_api), upstream_api, Metrics(), grace=0))
    for number in range(10):
        addon.event(GlobalEvent("/cwd", None, CALL_STARTED, {"sessionID": f"ses_{number}", "callID": "c"}))
    for number in range(10):
        addon.event(GlobalEvent("/cwd", None, CALL_STARTED, {"sessionID": "ses_9", "callID": f"c{number}"}))
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


def big_orphan(session_id: str, size: int) -> Orphan:
    info = {"id": "msg_1", "sessionID": session_id, "summary": {"body": "x" * size}}
    return Orphan(Place(session_id, "msg_1", "/cwd", None), state=[message_updated(session_id, info)])


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
