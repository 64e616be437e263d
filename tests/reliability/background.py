"""A raw upstream and the proxy, served from an event loop in a background thread.

Hypothesis drives synchronous test functions, one example after another; starting servers per
example would dominate the run. Here they start once per module and a blocking client
(`http.client`, which neither decompresses nor re-frames) talks to them: what it reads is
exactly what the proxy sent.
"""

from __future__ import annotations

import asyncio
import http.client
import threading
from collections.abc import Coroutine, Set
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, TypeVar

from yarl import URL

from proxy.service.app import create_app
from proxy.service.config import Settings
from tests.reliability.raw_upstream import Received, Reply, opencode_routes, raw_upstream, response
from tests.reliability.servers import serve

_T = TypeVar("_T")
_START_TIMEOUT_S = 10.0
CLIENT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Answer:
    """What the client received: status, headers (names lower-cased) and the exact body bytes."""

    status: int
    headers: dict[str, str]
    body: bytes


class Rig:
    """An upstream whose answers a test sets with `answer_with`, behind the proxy."""

    def __init__(self) -> None:
        self._reply = response(404)
        self._active: set[str] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="reliability-rig", daemon=True)
        self._stack = AsyncExitStack()
        self._proxy: URL | None = None

    def start(self) -> None:
        self._thread.start()
        self._proxy = self._run(self._start())

    def stop(self) -> None:
        """Stop the servers, then the loop and its thread; safe after a failed start."""
        if self._thread.is_alive():
            self._run(self._stack.aclose())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_START_TIMEOUT_S)
        self._loop.close()

    def answer_with(self, reply: Reply, *, active: Set[str] = frozenset()) -> None:
        """From now on the upstream answers `reply` on every route but liveness, where it says
        that the sessions in `active` run (and no other)."""
        self._reply = reply
        self._active.clear()
        self._active.update(active)

    def request(self, method: str, path: str) -> Answer:
        """One request on a fresh connection; the body as sent (de-chunked, never decompressed)."""
        if self._proxy is None:
            raise RuntimeError("rig not started")
        connection = http.client.HTTPConnection("127.0.0.1", self._proxy.port, timeout=CLIENT_TIMEOUT_S)
        try:
            connection.request(method, path, headers={"Accept-Encoding": "gzip, deflate, br, zstd"})
            answer = connection.getresponse()
            body = answer.read()
            return Answer(answer.status, {name.lower(): value for name, value in answer.getheaders()}, body)
        finally:
            connection.close()

    async def _start(self) -> URL:
        upstream, _ = await self._stack.enter_async_context(
            raw_upstream(opencode_routes(self._messages, self._active))
        )
        return await self._stack.enter_async_context(serve(create_app(Settings(upstream=upstream))))

    async def _messages(self, _: Received) -> Reply:
        return self._reply

    def _run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(_START_TIMEOUT_S)
