"""Starting a resumed turn through the server's own API, as a client would, and seeing it start.

Measured on opencode 1.18.33: a v2 prompt sent the moment a restarted server's health first
answers is admitted (200) and never runs. So the server must first be ready (its config, its
location in the session's directory, and the turn's provider answer), and a prompt counts only
once the turn is seen to start: the session active, or an assistant message newer than the
prompt.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import hdrs
from yarl import URL

from proxy.opencode.client import Credentials, UpstreamApi, UpstreamRefused
from proxy.opencode.dialects import LINE_1_18, Dialect
from proxy.opencode.liveness import LivenessProbe, LivenessUnknown
from proxy.opencode.runtimes import HttpRuntime
from proxy.resume.last_turn import InterruptedTurn, message_after
from rules import Api, Runtime

__all__ = ["READ_ERRORS", "Server", "read_failure", "transient"]

READY_TIMEOUT_S = 60.0
START_TIMEOUT_S = 20.0
POLL_S = 0.5
READ_ERRORS = (aiohttp.ClientError, TimeoutError, UpstreamRefused, LivenessUnknown, ValueError)
PASSING_STATUSES = frozenset({408, 429})
"""The 4xx answers that say "not now" rather than "never"."""


class Server:
    """The restarted server, as the resume sees it: its routes and shapes are its `dialect`'s."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        api: UpstreamApi,
        probe: LivenessProbe,
        origin: URL,
        credentials: Credentials,
        *,
        dialect: Dialect = LINE_1_18,
    ) -> None:
        self._session = session
        self._api = api
        self._probe = probe
        self._origin = origin.origin()
        self._credentials = credentials
        self.dialect = dialect

    def http(self, turn_api: Api) -> HttpRuntime:
        """The routes and the shape of its `turn_api` views; a ValueError (the server cannot be
        read) when its line serves none."""
        http = self.dialect.runtime(turn_api)
        if http is None:
            raise ValueError(f"the {self.dialect.name} line serves no {turn_api} message views")
        return http

    def rules(self, turn_api: Api) -> Runtime[Any]:
        """How its `turn_api` views are read: where they keep what, and how a call is settled."""
        return self.http(turn_api).rules

    async def messages(self, turn_api: Api, session_id: str) -> Any:
        return await self._api.get(self.http(turn_api).messages_path(session_id), self._credentials)

    async def session_info(self, turn_api: Api, session_id: str) -> dict[str, Any]:
        http = self.http(turn_api)
        info = http.unwrapped(await self._api.get(http.session_path(session_id), self._credentials))
        return info if isinstance(info, dict) else {}

    async def ready(self, directory: str | None, provider: str | None) -> str | None:
        """Wait until the server can run a turn in `directory` with `provider` (its config, its
        location and the provider answer); past the timeout, why not: what was asked last, and
        what came back."""
        headers = _directory_header(directory)
        paths = ["/config", "/api/location"]
        if provider is not None:
            paths.append(f"/api/provider/{quote(provider, safe='')}")
        return await self._until_answered(paths, headers)

    async def _until_answered(self, paths: list[str], headers: dict[str, str]) -> str | None:
        """Ask each of `paths` in turn until all answer, from the first again after a failure;
        None once they do, else (past `READY_TIMEOUT_S`) the last failure: `GET /api/info: HTTP 404`."""
        deadline, why = time.monotonic() + READY_TIMEOUT_S, "nothing was asked"
        while time.monotonic() < deadline:
            for path in paths:
                try:
                    await self._request("GET", path, headers)
                except READ_ERRORS as error:
                    why = f"GET {path}: {_failure(error)}"
                    break
            else:
                return None
            await asyncio.sleep(POLL_S)
        return f"asked for {READY_TIMEOUT_S:g} s; last, {why}"

    async def prompt(self, turn: InterruptedTurn, directory: str | None, prompt_id: str, text: str) -> None:
        """Send the prompt as the turn's runtime takes it (v1 `prompt_async` with the turn's own
        agent and model, in its directory; v2 `prompt`)."""
        http = self.http(turn.api)
        body = http.prompt_body(prompt_id, text, turn.agent, turn.model)
        headers = _directory_header(directory) if http.directed else {}
        await self._request("POST", http.prompt_path(turn.session_id), headers, body)

    async def started(self, turn: InterruptedTurn, prompt_id: str) -> str | None:
        """How the turn was seen to start (the session active, or an answer to the prompt), or
        None when it did not within `START_TIMEOUT_S`."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if (await self._probe.read(turn.api, turn.session_id, self._credentials)).active:
                    return "the session went active"
                view = await self.messages(turn.api, turn.session_id)
                if (answered := self.answered(view, turn, prompt_id)) is not None:
                    return answered
            except READ_ERRORS:
                pass
            await asyncio.sleep(POLL_S)
        return None

    def answered(self, view: Any, turn: InterruptedTurn, prompt_id: str) -> str | None:
        """How `view` shows the turn started, if it does: an answer newer than the prompt."""
        found = message_after(view, self.rules(turn.api), prompt_id, "assistant") is not None
        return "an answer to the prompt is stored" if found else None

    async def resumes_itself(self) -> str | None:
        """Why the server continues interrupted turns itself, if it does (1.18 never does)."""
        return None

    def heard(self, view: Any, session_id: str, since: str | None) -> None:
        """What a view of the session read since the crash (`since`: its newest message before
        it) says of the server itself (1.18: nothing)."""
        del view, session_id, since

    async def waiting_on_person(self, session_id: str) -> str | None:
        """What the server lists a person must answer (1.18: nothing; the stream says it)."""
        del session_id
        return None

    async def _request(self, method: str, path: str, headers: dict[str, str], body: Any = None) -> None:
        url = self._origin.with_path(path)
        if self._credentials.params:
            url = url.with_query(self._credentials.params)
        sent = {**self._credentials.headers, **headers, hdrs.ACCEPT_ENCODING: "identity"}
        async with asyncio.timeout(10.0):
            async with self._session.request(
                method, url, headers=sent, json=body, allow_redirects=False
            ) as answer:
                content = await answer.read()
                if answer.status not in (200, 204):
                    raise UpstreamRefused(method, path, answer.status, content)


def transient(error: Exception) -> bool:
    """Whether a failed read may answer if asked again: a timeout, a refused or reset connection,
    a 5xx, 408 or 429, liveness unknown. A 4xx else, or a body not of the route's shape
    (a ValueError, a wrong content type), says the same however often it is asked."""
    status = getattr(error, "status", None)
    if isinstance(error, UpstreamRefused | aiohttp.ClientResponseError) and isinstance(status, int):
        return not isinstance(error, aiohttp.ContentTypeError) and (
            status >= 500 or status in PASSING_STATUSES
        )
    return isinstance(error, aiohttp.ClientError | TimeoutError | LivenessUnknown)


def read_failure(error: Exception) -> str:
    """What was asked and what came back, short (`GET /session/ses_1/message: HTTP 500 (...)`)."""
    if isinstance(error, UpstreamRefused):
        return f"{error.asked}: {_failure(error)}"
    return _failure(error)


def _failure(error: Exception) -> str:
    """What came back, short: `HTTP 404 (not found)`, `HTTP 401 (UnauthorizedError)`, or the error."""
    if isinstance(error, UpstreamRefused):
        return f"HTTP {error.status} ({error.reason})"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _directory_header(directory: str | None) -> dict[str, str]:
    return {"x-opencode-directory": quote(directory, safe="")} if directory else {}
