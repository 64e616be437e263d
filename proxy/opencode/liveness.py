"""Ask the upstream whether a session is active, with the client's own credentials.

The two runtimes keep separate liveness: v2 in `GET /api/session/active`, v1 in
`GET /session/status`, which is kept per directory instance, so it is asked with the
session's own directory: asked without it, or in the directory a session has since been
moved away from, a session busy elsewhere would look idle. A reading's time is the
server's `Date` of the answer, so freshness never depends on the proxy's own clock.
Any doubt (an error, a timeout, an odd answer, a status type it does not know) yields no
reading, and no reading means no rewrite: the proxy never guesses that a session is dead.
Every look-up is counted here, whoever asks (a view, a write-back, live settle, a session
stream), as `settle_proxy_liveness_requests`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import Counter

from proxy.opencode.client import Credentials, UpstreamApi, UpstreamRefused
from proxy.opencode.runtimes import V1_HTTP, V2_HTTP
from proxy.opencode.server_clock import ServerClock
from proxy.opencode.surveys import OtherProcesses
from proxy.opencode.vocabulary import v1_status_active
from proxy.relay.bounded import Bounded
from proxy.relay.errors import reason_of
from rules import Api, Liveness

log = logging.getLogger(__name__)

_MOVES = 3
"""How often a v1 reading is retaken for a session that moved while it was asked about."""


class LivenessUnknown(RuntimeError):
    """The upstream could not say whether the session is active."""


REMEMBERED_DIRECTORIES = 4096
"""Sessions whose directory is remembered: a first guess only, since a session can be moved
to another worktree of its project (`/experimental/control-plane/move-session`)."""


class LivenessProbe:
    """Reads liveness from the upstream on demand, timed by the server's clock.

    `authorization` is what look-ups send when the client they serve sent no credentials;
    `timeout` bounds one reading; `elsewhere`, when known, the other processes on the server's
    database whose tools the server cannot vouch for; `lookups`, when given, counts each reading
    asked (by runtime).
    """

    def __init__(
        self,
        upstream: UpstreamApi,
        *,
        authorization: str | None = None,
        timeout: float = 5.0,
        elsewhere: OtherProcesses | None = None,
        clock: ServerClock | None = None,
        lookups: Counter | None = None,
    ) -> None:
        self._upstream = upstream
        self._authorization = authorization
        self._timeout = timeout
        self._lookups = lookups
        self._directories: Bounded[str, str] = Bounded(REMEMBERED_DIRECTORIES)
        self._elsewhere = elsewhere
        self.clock = clock or ServerClock()
        self._readers = {V1_HTTP.api: self._busy_v1, V2_HTTP.api: self._active_v2}

    def credentials(self, request: web.Request) -> Credentials:
        """What look-ups made on behalf of `request` authenticate with."""
        return Credentials.for_request(request, self._authorization)

    async def read(self, api: Api, session_id: str, credentials: Credentials) -> Liveness:
        """A fresh reading for one session, with the server's time of it; raises
        `LivenessUnknown` when in doubt."""
        if self._lookups is not None:
            self._lookups.labels(api).inc()
        try:
            async with asyncio.timeout(self._timeout):
                active, date = await self._readers[api](session_id, credentials)
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, UpstreamRefused) as error:
            raise LivenessUnknown(f"{type(error).__name__}: {reason_of(error)}") from error
        taken_at = self.clock.observe(date)
        liveness = Liveness(session_id, active, taken_at=self.clock.now() if taken_at is None else taken_at)
        return await self.bounded(liveness)

    async def bounded(self, liveness: Liveness) -> Liveness:
        """`liveness` bounded by the other processes on the upstream's database, as known now:
        their tools are absent from the upstream's answer, so it cannot vouch for them."""
        if liveness.active or self._elsewhere is None:
            return liveness
        unbounded = (
            liveness
            if liveness.elsewhere_since is None
            else dataclasses.replace(liveness, elsewhere_since=None)
        )
        # A bound the reading could not vouch past anyway leaves nothing for a later survey to add.
        bound = await self._elsewhere.bound(lambda bound: not unbounded.vouches_for(bound))
        if bound == liveness.elsewhere_since:  # a kept reading, bounded as before
            return liveness
        return dataclasses.replace(liveness, elsewhere_since=bound)

    async def _active_v2(self, session_id: str, credentials: Credentials) -> tuple[bool, str | None]:
        answer, date = await self._upstream.dated_get(V2_HTTP.liveness_path, credentials)
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, dict):
            raise LivenessUnknown(f"{V2_HTTP.liveness_path}: no `data` object")
        return session_id in data, date

    async def _busy_v1(self, session_id: str, credentials: Credentials) -> tuple[bool, str | None]:
        """Asked in the session's directory, which is read again after the answer: a session moved
        meanwhile was asked about in the wrong instance, and is asked again where it is now."""
        directory = self._directories.get(session_id) or await self._directory(session_id, credentials)
        for _ in range(_MOVES):
            answer, date = await self._upstream.dated_get(
                V1_HTTP.liveness_path, credentials, directory=directory
            )
            if not isinstance(answer, dict):
                raise LivenessUnknown(f"{V1_HTTP.liveness_path}: not an object")
            current = await self._directory(session_id, credentials)
            if current == directory:
                return _listed_active(answer, session_id), date
            log.info("session %s moved from %s to %s: asking again", session_id, directory, current)
            directory = current
        raise LivenessUnknown(f"session {session_id} kept moving between directories")

    async def _directory(self, session_id: str, credentials: Credentials) -> str:
        info = await self._upstream.get(f"/session/{session_id}", credentials)
        directory = info.get("directory") if isinstance(info, dict) else None
        if not isinstance(directory, str):
            raise LivenessUnknown(f"/session/{session_id}: no `directory`")
        self._directories[session_id] = directory
        return directory


def _listed_active(answer: dict[str, object], session_id: str) -> bool:
    """v1 lists the sessions of the instance that are not idle; one listed in a status the proxy
    does not know is neither active nor vouched inactive."""
    if session_id not in answer:
        return False
    active = v1_status_active(answer[session_id])
    if active is None:
        status = answer[session_id]
        raise LivenessUnknown(f"{V1_HTTP.liveness_path}: {session_id} has a status unknown here: {status!r}")
    return active
