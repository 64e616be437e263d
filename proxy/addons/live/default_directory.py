"""The server's default directory, for the live-settle addon: what a plain `/event` follows.

A client on `/event` without a `directory` query or an `x-opencode-directory` header (the
official SDK's `createOpencodeClient({ baseUrl })`) follows the server's default instance, the
directory the server process runs in (measured on 1.18.33; opencode's instance middleware falls
back to `process.cwd()`). Only the server knows it: `GET /path` asked without a directory names
it (`{"directory": ...}`). A restarted server may run somewhere else, so it is asked again each
time the followed stream (re)connects; until it answers, the directory is unknown and plain
`/event` streams wait for it (`clients`), never a guess.

Only a server of a line that serves the v1 family (`/path`, `/event`: 1.18) is asked: 2.x has
neither, and asking it would only log a 404 at every reconnect (`KnownServer.dialect`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import aiohttp

from proxy.opencode.client import Credentials, UpstreamApi, UpstreamRefused
from proxy.opencode.server_line import ServerLine
from rules import Api

log = logging.getLogger(__name__)

PATH = "/path"
_PAUSES_S = (0.0, 0.25, 0.5, 1.0, 2.0)
"""Before each attempt: a server that has just restarted may not answer at once."""
_ATTEMPT_TIMEOUT_S = 5.0


class DefaultDirectory:
    """Learns the server's default directory in the background and hands it to `learned`."""

    def __init__(self, upstream: UpstreamApi, server: ServerLine, learned: Callable[[str], None]) -> None:
        self._upstream = upstream
        self._server = server
        self._learned = learned
        self._task: asyncio.Task[None] | None = None

    def learn(self, credentials: Credentials) -> None:
        """Ask the server (again, after any earlier attempt is dropped)."""
        if self._task is not None:
            self._task.cancel()
        self._task = asyncio.create_task(self._ask(credentials), name="live-settle default directory")

    async def _ask(self, credentials: Credentials) -> None:
        error: BaseException | None = None
        for pause in _PAUSES_S:
            await asyncio.sleep(pause)
            try:
                async with asyncio.timeout(_ATTEMPT_TIMEOUT_S):
                    if not await self._has_plain_streams(credentials):
                        return
                    answer = await self._upstream.get(PATH, credentials)
            except (UpstreamRefused, aiohttp.ClientError, OSError, TimeoutError, ValueError) as failure:
                error = failure
                continue
            directory = answer.get("directory") if isinstance(answer, dict) else None
            if isinstance(directory, str) and directory:
                self._learned(directory)
                return
            error = ValueError(f"{PATH} names no directory: {str(answer)[:200]}")
        log.warning(
            "the server's default directory is unknown (%s): plain /event streams are told nothing",
            error,
            extra={"fields": {"route": PATH, "why": str(error), "decision": "plain /event not told"}},
        )

    async def _has_plain_streams(self, credentials: Credentials) -> bool:
        """Whether the server's line serves `/path` and plain `/event` (its v1 family); a server
        that cannot say which it is is asked, as a client's plain `/event` says it may have one."""
        known = await self._server.known(credentials)
        return known is None or known.dialect.runtime(Api.V1) is not None

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    async def idle(self) -> None:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
