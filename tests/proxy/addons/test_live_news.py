"""News of a session during a confirmation withdraws it: nothing is announced, nothing written.

Every confirmation that ends in events slipped into client streams (open parts and dead turns on
`/global/event` and `/event`, failed calls on v2 session streams) reads the message, then takes a
reading, then announces. A turn can start at any point of that: the news (here `session.status`
busy, or a v2 step starting) is delivered through the followed stream at each point in turn,
deterministically, by interposing on the confirmation's own upstream calls.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.service.app import create_app
from proxy.service.config import Settings
from proxy.testing import hearing, idle
from proxy.writeback.modes import WriteBackMode
from rules import Api, Liveness
from tests.fixtures import compact, load, raw
from tests.proxy.addons.live_streams import WRITING_INFO, crash_with_part_open
from tests.proxy.conftest import ProxyClient, crash, following, publish
from tests.proxy.fake_opencode import FakeOpencode

V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
V2 = "ses_dd6bd0f33ffejRStwdnQDIkDom"
MESSAGES = load("v1-message-stale-running.json")
MESSAGE = MESSAGES[1]
PART = MESSAGE["parts"][1]
POINTS = ("before the read", "between the read and the reading", "after the reading")
ClientFactory = Callable[[web.Application], Awaitable[ProxyClient]]


@pytest.fixture
async def proxy(
    upstream: TestServer, aiohttp_client: ClientFactory, fake: FakeOpencode, tmp_path: Any
) -> ProxyClient:
    fake.bodies[f"/session/{V1}/message"] = orjson.dumps(MESSAGES)
    fake.bodies[f"/session/{V1}/message/{MESSAGE['info']['id']}"] = orjson.dumps(MESSAGE)
    fake.bodies[f"/session/{V1}/message/msg_writing"] = orjson.dumps({"info": WRITING_INFO, "parts": []})
    fake.bodies[f"/api/session/{V2}/message"] = compact("v2-message-stale-running.json")
    fake.session_history[V2] = [
        line for line in raw("sse-v2-session-events-busy.txt").splitlines() if line.startswith(b"{")
    ]
    fake.events = [  # the durable log the API writer appends after: the call opened, never closed
        {"aggregate_id": V2, "seq": seq, "type": f"session.next.{kind}.1", "data": data}
        for seq, (kind, data) in enumerate(
            [("prompt.admitted", {}), ("step.started", {}), ("tool.called", {"callID": "call_mock_1"})], 1
        )
    ]
    settings = Settings(
        upstream=URL(str(upstream.make_url("/"))), grace=0.05, write_back=WriteBackMode.API, lock_dir=tmp_path
    )
    client = await aiohttp_client(create_app(settings))
    await following(client)
    await client.get("/event", params={"directory": "/cwd"})  # a client stream that outlives a crash
    return client


@dataclass
class News:
    """An event about `session`, delivered through the proxy's followed stream when `arrive`d."""

    proxy: ProxyClient
    fake: FakeOpencode
    session: str
    kind: str
    properties: dict[str, Any] = field(default_factory=dict)
    arrived: bool = False

    async def arrive(self) -> None:
        async with hearing(self.proxy.app, self.kind, self.session):
            self.fake.publish(self.kind, self.session, **self.properties)
        self.arrived = True


def interpose(monkeypatch: pytest.MonkeyPatch, point: str, news: News, reads: str) -> None:
    """Deliver `news` at `point` of the first confirmation: before its first upstream read of a
    path starting with `reads`, or just before or just after its first liveness reading."""
    get, read = UpstreamApi.get, LivenessProbe.read

    async def get_after_news(self: UpstreamApi, path: str, credentials: Credentials, **params: str) -> Any:
        if point == "before the read" and not news.arrived and path.startswith(reads):
            await news.arrive()
        return await get(self, path, credentials, **params)

    async def read_with_news(
        self: LivenessProbe, api: Api, session_id: str, credentials: Credentials
    ) -> Liveness:
        first = not news.arrived
        if first and point == "between the read and the reading":
            await news.arrive()
        liveness = await read(self, api, session_id, credentials)
        if first and point == "after the reading":
            await news.arrive()
        return liveness

    monkeypatch.setattr(UpstreamApi, "get", get_after_news)
    monkeypatch.setattr(LivenessProbe, "read", read_with_news)


async def metric(proxy: ProxyClient, name: str) -> float:
    text = await (await proxy.get("/_settle/metrics")).text()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def outcome(proxy: ProxyClient, fake: FakeOpencode) -> dict[str, float]:
    """What the confirmation did, once everything it started is done."""
    await idle(proxy.app)
    return {
        "injected": await metric(proxy, "settle_proxy_injected_events_total"),
        "withdrawn": await metric(proxy, "settle_proxy_withdrawn_confirmations_total"),
        "written": len(fake.patches) + len(fake.replays),
    }


async def crash_while_writing(proxy: ProxyClient, fake: FakeOpencode) -> None:
    await publish(proxy, fake, "session.status", V1, status={"type": "busy"})
    await publish(proxy, fake, "message.updated", V1, info=WRITING_INFO)
    await crash(proxy, fake)


async def open_v2_session_stream(proxy: ProxyClient, _: FakeOpencode) -> None:
    await proxy.get(f"/api/session/{V2}/event")


CONFIRMATIONS = {
    "open parts": (crash_with_part_open, V1, f"/session/{V1}/message/"),
    "dead turns": (crash_while_writing, V1, f"/session/{V1}/message/"),
    "session streams": (open_v2_session_stream, V2, f"/api/session/{V2}/message"),
}


def news_of(proxy: ProxyClient, fake: FakeOpencode, session: str) -> News:
    if session == V1:
        return News(proxy, fake, V1, "session.status", {"status": {"type": "busy"}})
    return News(proxy, fake, V2, "session.next.step.started", {"assistantMessageID": "msg_new"})


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("confirmation", CONFIRMATIONS)
async def test_news_at_any_point_of_a_confirmation_withdraws_it(
    proxy: ProxyClient,
    fake: FakeOpencode,
    *,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    confirmation: str,
    point: str,
) -> None:
    caplog.set_level(logging.INFO, logger="proxy.addons.live.confirmations")
    start, session, reads = CONFIRMATIONS[confirmation]
    news = news_of(proxy, fake, session)
    interpose(monkeypatch, point, news, reads)
    await start(proxy, fake)
    assert await outcome(proxy, fake) == {"injected": 0, "withdrawn": 1, "written": 0}
    assert news.arrived
    logged = [getattr(record, "fields", {}) for record in caplog.records]
    assert [fields for fields in logged if fields.get("decision") == "withdrawn"] == [
        {"session": session, "news": news.kind, "decision": "withdrawn"}
    ]


@pytest.mark.parametrize("confirmation", CONFIRMATIONS)
async def test_without_news_the_same_confirmation_announces_and_writes(
    proxy: ProxyClient, fake: FakeOpencode, confirmation: str
) -> None:
    """The control: the setups above do announce (and write) when nothing is heard meanwhile."""
    start, _, _ = CONFIRMATIONS[confirmation]
    await start(proxy, fake)
    done = await outcome(proxy, fake)
    assert done["withdrawn"] == 0
    assert done["injected"] > 0
    assert done["written"] == (0 if confirmation == "dead turns" else 1)


async def test_the_idle_burst_that_starts_a_confirmation_does_not_withdraw_it(
    proxy: ProxyClient, fake: FakeOpencode
) -> None:
    """The server says a turn ended with several events (`session.error`, `session.status` idle,
    `session.idle`): they agree with the announcement, so the first does not lose it to the next."""
    await publish(proxy, fake, "message.part.updated", V1, part=PART, time=1)
    await publish(proxy, fake, "session.error", V1, error={"name": "MessageAbortedError"})
    await publish(proxy, fake, "session.status", V1, status={"type": "idle"})
    await publish(proxy, fake, "session.idle", V1)
    done = await outcome(proxy, fake)
    assert (done["withdrawn"], done["written"]) == (0, 1)


async def test_a_withdrawn_part_is_confirmed_again_when_the_session_next_goes_idle(
    proxy: ProxyClient, fake: FakeOpencode, monkeypatch: pytest.MonkeyPatch
) -> None:
    news = news_of(proxy, fake, V1)
    interpose(monkeypatch, "after the reading", news, f"/session/{V1}/message/")
    await crash_with_part_open(proxy, fake)
    assert await outcome(proxy, fake) == {"injected": 0, "withdrawn": 1, "written": 0}
    await publish(proxy, fake, "session.status", V1, status={"type": "idle"})  # the new turn ended
    assert (await outcome(proxy, fake))["written"] == 1


async def test_a_message_the_server_no_longer_has_leaves_the_others_confirmed(
    proxy: ProxyClient, fake: FakeOpencode, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="proxy.addons.live.parts")
    gone = {**PART, "id": "prt_gone", "messageID": "msg_gone"}  # the fake answers 404 for its message
    await publish(proxy, fake, "message.part.updated", V1, part=gone, time=1)
    await crash_with_part_open(proxy, fake)
    assert await outcome(proxy, fake) == {"injected": 4, "withdrawn": 0, "written": 1}
    assert "message msg_gone is gone, its parts are forgotten" in caplog.text
