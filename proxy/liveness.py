"""Ask the upstream whether a session is active, with the client's own credentials.

The two runtimes keep separate liveness: v2 in `GET /api/session/active`, v1 in
`GET /session/status`, which is kept per directory instance, so it is asked with the
session's own directory: asked without it, a session busy elsewhere would look idle.
Any doubt (an error, a timeout, an odd answer) yields no reading, and no reading means
no rewrite: the proxy never guesses that a session is dead.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import hdrs, web

from proxy.config import Settings
from proxy.routes import MessageRoute
from rules import Api, Liveness

log = logging.getLogger(__name__)

AUTH_TOKEN_PARAM = "auth_token"


class LivenessUnknown(RuntimeError):
    """The upstream could not say whether the session is active."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """How a look-up authenticates: the client's own header or token, else the configured ones."""

    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)

    @classmethod
    def for_request(cls, request: web.Request, fallback: str | None) -> Credentials:
        if authorization := request.headers.get(hdrs.AUTHORIZATION):
            return cls(headers={hdrs.AUTHORIZATION: authorization})
        if token := request.query.get(AUTH_TOKEN_PARAM):
            return cls(params={AUTH_TOKEN_PARAM: token})
        if fallback is not None:
            return cls(headers={hdrs.AUTHORIZATION: fallback})
        return cls()


class DirectoryCache:
    """Session id → directory. A session never changes directory, so entries never go stale."""

    def __init__(self, capacity: int = 4096) -> None:
        self._entries: OrderedDict[str, str] = OrderedDict()
        self._capacity = capacity

    def get(self, session_id: str) -> str | None:
        directory = self._entries.get(session_id)
        if directory is not None:
            self._entries.move_to_end(session_id)
        return directory

    def put(self, session_id: str, directory: str) -> None:
        self._entries[session_id] = directory
        self._entries.move_to_end(session_id)
        if len(self._entries) > self._capacity:
            self._entries.popitem(last=False)


class LivenessProbe:
    """Reads liveness from the upstream on demand."""

    def __init__(self, session: aiohttp.ClientSession, settings: Settings) -> None:
        self._session = session
        self._settings = settings
        self._directories = DirectoryCache()

    async def read(self, route: MessageRoute, request: web.Request) -> Liveness:
        """A fresh reading for the route's session; raises `LivenessUnknown` when in doubt."""
        credentials = Credentials.for_request(request, self._settings.authorization)
        try:
            async with asyncio.timeout(self._settings.liveness_timeout):
                if route.api is Api.V2:
                    active = await self._active_v2(credentials)
                else:
                    directory = await self._directory(route.session_id, credentials)
                    active = await self._busy_v1(directory, credentials)
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as error:
            raise LivenessUnknown(f"{type(error).__name__}: {error}") from error
        return Liveness(route.session_id, route.session_id in active)

    async def _active_v2(self, credentials: Credentials) -> set[str]:
        answer = await self._get_json("/api/session/active", credentials)
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, dict):
            raise LivenessUnknown("/api/session/active: no `data` object")
        return set(data)

    async def _busy_v1(self, directory: str, credentials: Credentials) -> set[str]:
        answer = await self._get_json("/session/status", credentials, directory=directory)
        if not isinstance(answer, dict):
            raise LivenessUnknown("/session/status: not an object")
        return {session for session, status in answer.items() if _is_busy(status)}

    async def _directory(self, session_id: str, credentials: Credentials) -> str:
        cached = self._directories.get(session_id)
        if cached is not None:
            return cached
        info = await self._get_json(f"/session/{session_id}", credentials)
        directory = info.get("directory") if isinstance(info, dict) else None
        if not isinstance(directory, str):
            raise LivenessUnknown(f"/session/{session_id}: no `directory`")
        self._directories.put(session_id, directory)
        return directory

    async def _get_json(self, path: str, credentials: Credentials, **params: str) -> Any:
        url = self._settings.upstream_origin.with_path(path)
        query = {**credentials.params, **params}
        headers = {**credentials.headers, hdrs.ACCEPT_ENCODING: "identity"}
        target = url.with_query(query) if query else url
        async with self._session.get(target, headers=headers, allow_redirects=False) as response:
            if response.status != 200:
                raise LivenessUnknown(f"{path}: HTTP {response.status}")
            return orjson.loads(await response.read())


def _is_busy(status: Any) -> bool:
    """v1 lists busy and retrying sessions; anything listed and not idle is alive."""
    return not (isinstance(status, dict) and status.get("type") == "idle")


__all__ = ["Credentials", "DirectoryCache", "LivenessProbe", "LivenessUnknown"]
