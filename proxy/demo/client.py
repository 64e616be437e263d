"""The demo's HTTP client: one session with the server's password, a bound on every request, and
waits that ask again until an answer says what the demo waits for.

A server that has just opened its port can take a request and never answer it (1.18.33 boots so),
so every request is timed and a wait asks again; a wait itself is bounded, and says what it waited
for when it gives up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import orjson

from proxy.demo.lines import Request

T = TypeVar("T")
ASK_S = 15.0
EVERY_S = 0.25


class Failed(Exception):
    """The demo could not go on; the text says what did not happen, in one line."""


class Client:
    """Requests to a server's (or the proxy's) origin, as user `opencode` with the password."""

    def __init__(self, password: str) -> None:
        self._http = aiohttp.ClientSession(
            auth=aiohttp.BasicAuth("opencode", password), json_serialize=lambda v: orjson.dumps(v).decode()
        )

    @property
    def http(self) -> aiohttp.ClientSession:
        return self._http

    async def close(self) -> None:
        await self._http.close()

    async def ask(self, origin: str, request: Request, *, within: float = ASK_S) -> tuple[int, Any]:
        """The status and the parsed answer (None when it is not JSON) of one request; `Failed`
        when none comes in time."""
        try:
            async with self._http.request(
                request.method,
                origin + request.path,
                json=request.body,
                params=request.params,
                headers=request.headers,
                timeout=aiohttp.ClientTimeout(total=within),
            ) as answer:
                status, body = answer.status, await answer.read()
        except (aiohttp.ClientError, TimeoutError) as error:
            raise Failed(f"{request.method} {request.path}: {error or type(error).__name__}") from None
        try:
            return status, orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            return status, None

    async def answered(self, origin: str, request: Request) -> Any:
        """The answer of a request that must succeed."""
        status, body = await self.ask(origin, request)
        if status >= 300:
            raise Failed(f"{request.method} {request.path} answered HTTP {status}")
        return body

    async def answers(self, origin: str, request: Request) -> bool:
        """Whether the request is answered 200 in time (not yet, when the server is not up)."""
        try:
            status, _ = await self.ask(origin, request)
        except Failed:
            return False
        return status == 200


async def until(found: Callable[[], Awaitable[T | None]], *, what: str, within: float) -> T:
    """What `found` gives once it gives something, asked every `EVERY_S`; `Failed` after `within` s."""
    deadline = time.monotonic() + within
    while (result := await found()) is None:
        if time.monotonic() > deadline:
            raise Failed(f"{what} did not happen within {within:g} s")
        await asyncio.sleep(EVERY_S)
    return result
