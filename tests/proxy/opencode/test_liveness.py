"""The liveness probe is built from the values it uses: no proxy Settings."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import hdrs
from aiohttp.test_utils import make_mocked_request
from prometheus_client import CollectorRegistry, Counter
from yarl import URL

from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.liveness import LivenessProbe, LivenessUnknown
from proxy.opencode.surveys import OtherProcesses
from rules import Api, Liveness


class _Answers(UpstreamApi):
    """The upstream's answers to the probe's GETs, each after `delay` seconds."""

    def __init__(self, session: aiohttp.ClientSession, answers: dict[str, Any], delay: float = 0.0) -> None:
        super().__init__(session, URL("http://127.0.0.1:1"))
        self._answers = answers
        self._delay = delay

    async def dated_get(self, path: str, credentials: Credentials, **params: str) -> tuple[Any, str | None]:
        await asyncio.sleep(self._delay)
        return self._answers[path], "Mon, 30 Nov 2026 20:00:00 GMT"

    async def get(self, path: str, credentials: Credentials, **params: str) -> Any:
        return (await self.dated_get(path, credentials, **params))[0]


async def test_a_reading_from_the_values_given() -> None:
    async with aiohttp.ClientSession() as session:
        probe = LivenessProbe(_Answers(session, {"/api/session/active": {"data": {"ses_live": {}}}}))
        live = await probe.read(Api.V2, "ses_live", Credentials())
        dead = await probe.read(Api.V2, "ses_dead", Credentials())
    assert (live.active, dead.active) == (True, False)


async def test_the_timeout_given_bounds_a_reading() -> None:
    async with aiohttp.ClientSession() as session:
        slow = _Answers(session, {"/api/session/active": {"data": {}}}, delay=5)
        probe = LivenessProbe(slow, timeout=0.01)
        with pytest.raises(LivenessUnknown):
            await probe.read(Api.V2, "ses_1", Credentials())


async def test_the_authorization_given_serves_a_client_that_sent_none() -> None:
    async with aiohttp.ClientSession() as session:
        probe = LivenessProbe(_Answers(session, {}), authorization="Basic b3duOnB3")
    own = probe.credentials(make_mocked_request("GET", "/"))
    assert own.headers == {hdrs.AUTHORIZATION: "Basic b3duOnB3"}
    client = make_mocked_request("GET", "/", headers={hdrs.AUTHORIZATION: "Basic Y2xpZW50"})
    assert probe.credentials(client).headers == {hdrs.AUTHORIZATION: "Basic Y2xpZW50"}


@pytest.mark.parametrize(
    ("status", "active"),
    [
        ({"type": "busy"}, True),
        ({"type": "retry", "attempt": 1}, True),
        ({"type": "idle"}, False),
        (None, False),
    ],
)
async def test_a_listed_v1_status_means_what_the_one_vocabulary_says(status: Any, active: bool) -> None:
    listed = {} if status is None else {"ses_1": status}
    answers = {"/session/ses_1": {"directory": "/d"}, "/session/status": listed}
    async with aiohttp.ClientSession() as session:
        reading = await LivenessProbe(_Answers(session, answers)).read(Api.V1, "ses_1", Credentials())
    assert reading.active is active


@pytest.mark.parametrize("status", [{"type": "compacting"}, {"kind": "busy"}, "busy"])
async def test_a_session_listed_in_a_status_unknown_here_is_not_vouched_inactive(status: Any) -> None:
    answers = {"/session/ses_1": {"directory": "/d"}, "/session/status": {"ses_1": status}}
    async with aiohttp.ClientSession() as session:
        probe = LivenessProbe(_Answers(session, answers))
        with pytest.raises(LivenessUnknown, match="status unknown here"):
            await probe.read(Api.V1, "ses_1", Credentials())


async def test_every_reading_asked_is_counted_by_runtime() -> None:
    registry = CollectorRegistry()
    lookups = Counter("lookups", "", ("api",), registry=registry)
    answers = {
        "/session/ses_1": {"directory": "/d"},
        "/session/status": {},
        "/api/session/active": {"data": {}},
    }
    async with aiohttp.ClientSession() as session:
        probe = LivenessProbe(_Answers(session, answers), lookups=lookups)
        await probe.read(Api.V1, "ses_1", Credentials())
        await probe.read(Api.V2, "ses_2", Credentials())
        await probe.read(Api.V2, "ses_2", Credentials())
    assert registry.get_sample_value("lookups_total", {"api": "v1"}) == 1
    assert registry.get_sample_value("lookups_total", {"api": "v2"}) == 2


class _Surveyed(OtherProcesses):
    """Other processes whose bound is `since` (None: none known)."""

    def __init__(self, since: int | None) -> None:
        super().__init__(URL("http://127.0.0.1:1"))
        self.since = since

    async def bound(self, vouches: Callable[[int], bool] | None = None) -> int | None:
        return self.since


async def test_a_kept_reading_is_bounded_by_the_survey_as_it_is_now() -> None:
    elsewhere = _Surveyed(5_000)
    async with aiohttp.ClientSession() as session:
        probe = LivenessProbe(_Answers(session, {}), elsewhere=elsewhere)
    kept = await probe.bounded(Liveness("ses_1", active=False, taken_at=10_000))
    assert kept == Liveness("ses_1", active=False, taken_at=10_000, elsewhere_since=5_000)
    assert await probe.bounded(kept) is kept, "bounded as before: handed back as it is, not copied"
    elsewhere.since = None
    assert await probe.bounded(kept) == Liveness("ses_1", active=False, taken_at=10_000)
