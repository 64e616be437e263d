"""Settling while other processes hold the upstream's database: what was alive after the earliest
of them started is left alone, in views (the settle addon through `proxy.testing`, and a whole
proxy) and in readings kept from the event stream; health says what the survey found, or why it
could not."""

import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy import testing
from proxy.addons.settle import SETTLED_HEADER, Settle
from proxy.opencode import other_processes as processes
from proxy.opencode import surveys
from proxy.opencode.client import UpstreamApi
from proxy.opencode.other_processes import START_MARGIN_MS
from rules import Doubt
from tests.fixtures import compact, load
from tests.proxy.conftest import ProxyClient, asking_settle, following, publish
from tests.proxy.fake_opencode import FakeOpencode
from tests.proxy.system.fake_proc import BOOT_S, DB, FakeProc

V2 = "ses_dd6bd0f33ffejRStwdnQDIkDom"
V2_LAST_ALIVE = 1795988584703
"""The latest time in `v2-message-stale-running.json` (its tool's `ran`)."""
V1 = "ses_dd6bcdaa7ffenxavFWr4GKPq95"
V1_CREATED = 1795988598698
"""When the assistant message of `v1-message-stale-running.json` was created."""


@pytest.fixture
def other_server(proc: FakeProc, upstream: TestServer, monkeypatch: pytest.MonkeyPatch) -> FakeProc:
    """The fake upstream listening, holding DB; `proc.process(...)` adds other holders."""
    assert upstream.port is not None
    proc.listen(upstream.port, "555")
    proc.process(100, "socket:[555]", DB, started_at=BOOT_S * 1000)
    monkeypatch.setattr(processes, "PROC", proc.root)
    monkeypatch.setattr(surveys, "MAX_AGE_S", 0.0)
    return proc


@pytest.fixture
async def bounded_settle(upstream: TestServer, upstream_api: UpstreamApi) -> AsyncIterator[Settle]:
    """The settle addon, its readings bounded by the other holders of the fake's database."""
    elsewhere = surveys.OtherProcesses(URL(str(upstream.make_url("/"))))
    try:
        async with asking_settle(upstream_api, elsewhere) as addon:
            yield addon
    finally:
        await elsewhere.close()


async def settles(settle: Settle) -> bool:
    """Whether the addon settles the stale v2 view."""
    body = compact("v2-message-stale-running.json")
    flow = await testing.cycle(settle, testing.flow("GET", f"/api/session/{V2}/message", body=body))
    return flow.response_headers.get(SETTLED_HEADER) == "1"


async def test_a_view_alive_after_another_holder_started_is_left_alone(
    proxy: ProxyClient, fake: FakeOpencode, other_server: FakeProc
) -> None:
    fake.bodies[f"/api/session/{V2}/message"] = compact("v2-message-stale-running.json")
    other_server.process(200, DB, started_at=V2_LAST_ALIVE - 60_003)  # a whole tick
    response = await proxy.get(f"/api/session/{V2}/message")
    assert SETTLED_HEADER not in response.headers
    assert orjson.loads(await response.read()) == load("v2-message-stale-running.json")
    health = await (await proxy.get("/_settle/health")).json()
    assert health["other_processes"]["known"] is True
    assert health["other_processes"]["upstream_pids"] == [100]
    assert health["other_processes"]["others"] == [
        {"pid": 200, "started_at": V2_LAST_ALIVE - 60_003 - START_MARGIN_MS, "program": "opencode"}
    ]


async def test_a_view_alive_before_every_other_holder_started_is_settled(
    bounded_settle: Settle, other_server: FakeProc
) -> None:
    other_server.process(200, DB, started_at=V2_LAST_ALIVE + 60_000)
    assert await settles(bounded_settle)


async def test_a_view_left_alone_says_why_once(
    bounded_settle: Settle, other_server: FakeProc, caplog: pytest.LogCaptureFixture
) -> None:
    other_server.process(200, DB, started_at=V2_LAST_ALIVE - 60_003)
    caplog.set_level(logging.INFO, logger="proxy.addons.settle")
    assert not await settles(bounded_settle)
    assert not await settles(bounded_settle)
    said = [record for record in caplog.records if record.getMessage().startswith("left message")]
    assert len(said) == 1
    fields = getattr(said[0], "fields")  # noqa: B009
    assert fields["session"] == V2
    assert fields["why"] == str(Doubt.ELSEWHERE)
    assert fields["last_alive"] == V2_LAST_ALIVE


async def test_a_reading_kept_from_the_event_stream_is_bounded_too(
    proxy: ProxyClient, fake: FakeOpencode, other_server: FakeProc
) -> None:
    fake.bodies[f"/session/{V1}/message"] = original = compact("v1-message-stale-running.json")
    other_server.process(200, DB, started_at=V1_CREATED - 60_000)
    await following(proxy)
    await publish(proxy, fake, "session.status", V1, status={"type": "idle"})
    response = await proxy.get(f"/session/{V1}/message")
    assert await response.read() == original
    assert fake.liveness_requests == 0


async def test_health_says_why_other_processes_are_unknown(proxy: ProxyClient) -> None:
    health = await (await proxy.get("/_settle/health")).json()
    assert health["other_processes"]["known"] is False
    assert "holds no opencode database" in health["other_processes"]["why"]


async def test_a_stale_view_asked_again_is_not_surveyed_again(
    bounded_settle: Settle, other_server: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A survey taken after the view's last sign of life vouches for it for good."""
    surveys: list[int] = []
    taking = processes.survey

    def counted(*args: Any, **kwargs: Any) -> processes.Survey:
        surveys.append(1)
        return taking(*args, **kwargs)

    monkeypatch.setattr(processes, "survey", counted)
    for _ in range(3):
        assert await settles(bounded_settle)
    assert len(surveys) == 1
