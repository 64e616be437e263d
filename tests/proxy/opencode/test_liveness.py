"""The liveness probe is built from the values it uses: no proxy Settings."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import hdrs
from aiohttp.test_utils import make_mocked_request
from yarl import URL

from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.liveness import LivenessProbe, LivenessUnknown
from rules import Api


class _Answers(UpstreamApi):
    """The upstream's answers to the probe's GETs, each after `delay` seconds."""

    def __init__(self, session: aiohttp.ClientSession, answers: dict[str, Any], delay: float = 0.0) -> None:
        super().__init__(session, URL("http://127.0.0.1:1"))
        self._answers = answers
        self._delay = delay

    async def dated_get(self, path: str, credentials: Credentials, **params: str) -> tuple[Any, str | None]:
        await asyncio.sleep(self._delay)
        return self._answers[path], "Mon, 30 Nov 2026 20:00:00 GMT"


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
