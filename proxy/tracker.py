"""Liveness kept from the upstream's own event stream, so a message fetch needs no extra
request in the steady state.

The proxy follows `GET /global/event`, which carries every directory instance's events
(v1 `session.status`/`session.idle`, v2 `session.next.*`). A reading (the upstream's
answer to an on-demand look-up, or a v1 status event) is kept for a session until an
event about that session arrives; v1 status events replace it, any other event about the
session drops it, and the next fetch asks again. While the stream is down, or before it
has (re)connected, nothing is kept: the proxy falls back to asking, never to guessing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import aiohttp
import orjson
from aiohttp import hdrs, web

from proxy.config import Settings
from rules import Api, Liveness

log = logging.getLogger(__name__)

EVENTS_PATH = "/global/event"
_RETRY_SECONDS = (0.0, 0.25, 1.0, 2.0, 5.0)
_V1_BUSY = ("busy", "retry")


class StreamState(StrEnum):
    CONNECTING = "connecting"
    FOLLOWING = "following"
    REFUSED = "refused"
    """The upstream refused the subscription (HTTP error, e.g. 401 without credentials)."""


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """What an event says about one session's liveness."""

    session_id: str
    api: Api
    busy: bool | None
    """True/False when the event states it (v1 status); None when it only says "something happened"."""


class LivenessTracker:
    """Keeps readings fresh from the event stream; `run()` follows it until cancelled."""

    def __init__(self, session: aiohttp.ClientSession, settings: Settings) -> None:
        self._session = session
        self._settings = settings
        self._readings: dict[tuple[Api, str], bool] = {}
        self.state = StreamState.CONNECTING

    def cached(self, api: Api, session_id: str) -> Liveness | None:
        """The kept reading, or None when the proxy must ask."""
        if self.state is not StreamState.FOLLOWING:
            return None
        active = self._readings.get((api, session_id))
        return None if active is None else Liveness(session_id, active)

    def store(self, api: Api, liveness: Liveness) -> None:
        """Keep an on-demand reading, valid until the next event about its session."""
        if self.state is StreamState.FOLLOWING:
            self._readings[(api, liveness.session_id)] = liveness.active

    def apply(self, event: SessionEvent) -> None:
        key = (event.api, event.session_id)
        if event.busy is None:
            self._readings.pop(key, None)
        else:
            self._readings[key] = event.busy

    async def run(self) -> None:
        """Follow the stream forever, reconnecting at once and then with growing pauses."""
        failures = 0
        while True:
            try:
                async for event in self._follow():
                    failures = 0
                    self.apply(event)
            except (aiohttp.ClientError, TimeoutError) as error:
                log.info("event stream %s lost: %s", EVENTS_PATH, error or type(error).__name__)
            self._forget()
            await asyncio.sleep(_RETRY_SECONDS[min(failures, len(_RETRY_SECONDS) - 1)])
            failures += 1

    def _forget(self) -> None:
        if self.state is StreamState.FOLLOWING:
            self.state = StreamState.CONNECTING
        self._readings.clear()

    async def _follow(self) -> AsyncIterator[SessionEvent]:
        headers = {hdrs.ACCEPT: "text/event-stream", hdrs.ACCEPT_ENCODING: "identity"}
        if self._settings.authorization:
            headers[hdrs.AUTHORIZATION] = self._settings.authorization
        url = self._settings.upstream_origin.with_path(EVENTS_PATH)
        async with self._session.get(
            url, headers=headers, timeout=aiohttp.ClientTimeout(total=None, connect=5)
        ) as stream:
            if stream.status != 200:
                if self.state is not StreamState.REFUSED:
                    log.warning(
                        "%s refused (HTTP %d): liveness is asked on every fetch", EVENTS_PATH, stream.status
                    )
                self.state = StreamState.REFUSED
                return
            self._readings.clear()
            self.state = StreamState.FOLLOWING
            log.info("following %s: liveness now comes from events", EVENTS_PATH)
            async for line in stream.content:
                if line.startswith(b"data:"):
                    event = parse_event(line[5:])
                    if event is not None:
                        yield event


def parse_event(data: bytes) -> SessionEvent | None:
    """The liveness meaning of one `/global/event` payload, if it has one."""
    found = _kind_and_properties(data)
    if found is None:
        return None
    kind, session_id, properties = found
    if kind == "session.status":
        status = properties.get("status") or {}
        return SessionEvent(session_id, Api.V1, status.get("type") in _V1_BUSY)
    if kind == "session.idle":
        return SessionEvent(session_id, Api.V1, False)
    if kind.startswith("session.next."):
        return SessionEvent(session_id, Api.V2, None)
    return None


def _kind_and_properties(data: bytes) -> tuple[str, str, dict[str, Any]] | None:
    try:
        envelope = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    payload = envelope.get("payload") if isinstance(envelope, dict) else None
    if not isinstance(payload, dict):
        return None
    kind, properties = payload.get("type"), payload.get("properties")
    if not isinstance(kind, str) or not isinstance(properties, dict):
        return None
    session_id = properties.get("sessionID")
    return (kind, session_id, properties) if isinstance(session_id, str) else None


TRACKER = web.AppKey("tracker", LivenessTracker)
