"""Continuing an interrupted turn on opencode 2.x, through the server's own settle-then-continue.

2.x settles a call a crash left open only when the session's next drain starts
(`settleStaleToolCalls`, before any model work: `packages/core/src/session/runner/llm.ts` `drain`,
anomalyco/opencode @008d57153952), and both of its routes that start one do so. The resume takes
`POST /api/session/{id}/synthetic` (`session.synthetic`, `protocol/src/groups/session.ts`
@01fd0c8548b2): it admits the text naming the calls as a durable inbox item and wakes the drain,
and it takes the item's `id`, which 2.x refuses to admit twice (409 `ConflictError`), so a send
retried under the same id is admitted at most once. `POST …/resume` takes no id (a second call
starts another execution) and holds the request until the execution settles. What a person
asked and has not answered is listed by `GET …/permission` and `GET …/form` (2.1.2, measured; its
`question` tool asks through a form) and, on earlier builds, `GET …/question`: a list the server
answers with an empty 404 is a route it does not have, said once, and nothing of that kind waits.

`serve --service` (2.1.2, measured; the background service the default TUI starts) continues every
interrupted turn itself at boot: it fails the cut calls and admits a synthetic input "The server
restarted while you were working…" (`metadata: {notice: "restart"}`) as it starts to answer. A
second continuation would be the proxy's, so a server known to do that is left to it: known by
the command line of the process its `/api/info` names, where this host shows that process, or by
a restart notice in a view read since it booted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import aiohttp
from yarl import URL

from proxy.opencode.client import Credentials, UpstreamApi, UpstreamRefused
from proxy.opencode.dialects import LINE_2X
from proxy.opencode.liveness import LivenessProbe
from proxy.resume.last_turn import InterruptedTurn, message_after
from proxy.resume.sending import Server
from proxy.system import procfs

__all__ = ["Continuation"]

DESCRIPTION = "settle-proxy: the server went away mid-turn"
CONFLICT = 409
SERVICE_FLAG = "--service"
RESTART_NOTICE = "restart"
"""`metadata.notice` of the synthetic input `serve --service` continues a turn with (2.1.2, measured)."""
log = logging.getLogger(__name__)
PERSON_LISTS = ("permission", "form", "question")
"""What a person must answer, each listed by `GET /api/session/{id}/<kind>`: `form` is
`session.form.list` (`protocol/src/groups/form.ts` @8c6ff62466ba; 2.1.2's openapi.json), `question`
only before 2.1.2 (404 there, measured)."""


class Continuation(Server):
    """The restarted 2.x server, as the resume sees it: 2.x's routes, asked as its user
    (`opencode`, whatever OPENCODE_SERVER_USERNAME says); `health_route` says which route the
    server was known by (`ServerLine.health_route`)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        api: UpstreamApi,
        probe: LivenessProbe,
        origin: URL,
        credentials: Credentials,
        *,
        health_route: Callable[[], str] = lambda: LINE_2X.health_paths[0],
    ) -> None:
        user = credentials.as_user(LINE_2X.username)
        super().__init__(session, api, probe, origin, user, dialect=LINE_2X)
        self._health_route = health_route
        self._unrouted: set[str] = set()
        """The person lists this server answered with an empty 404: routes it does not have."""
        self._pid: int | None = None
        self._itself: str | None = None
        """Why the server that runs now (`_pid`) continues interrupted turns itself, once known."""

    async def resumes_itself(self) -> str | None:
        """Why the server continues interrupted turns itself (`serve --service`), or None: asked of
        the process its health answer names, each time that is another process."""
        info = await self._api.get(self._health_route(), self._credentials)
        pid = info.get("pid") if isinstance(info, dict) else None
        if not isinstance(pid, int) or pid == self._pid:
            return self._itself
        self._pid, self._itself = pid, None
        argv = procfs.command_line(pid).split()
        if "serve" in argv and SERVICE_FLAG in argv:
            self._knows(f"its command line says so (pid {pid}: serve {SERVICE_FLAG})")
        return self._itself

    def heard(self, view: Any, session_id: str, since: str | None) -> None:
        """A restart notice newer than `since` (the newest message of the session before the crash)
        was admitted by the server that runs now: it continues interrupted turns itself."""
        if self._itself is None and since is not None and (notice := restart_notice(view, since)):
            self._knows(f"it continued session {session_id} itself (its restart notice {notice})")

    def _knows(self, why: str) -> None:
        self._itself = why
        log.warning(
            "the server resumes interrupted turns itself: %s; resuming is left to it",
            why,
            extra={"fields": {"pid": self._pid, "why": why}},
        )

    async def ready(self, directory: str | None, provider: str | None) -> str | None:
        """Wait until the server answers the health route it was known by (2.x has no `/config`,
        and a from-source build no `/api/info`); past the timeout, what was asked and what came back."""
        del directory, provider
        return await self._until_answered([self._health_route()], {})

    async def prompt(self, turn: InterruptedTurn, directory: str | None, prompt_id: str, text: str) -> None:
        """Admit `text` under `prompt_id`: a 409 says an earlier send under that id was admitted
        (its answer lost), which is the one admission there will be."""
        del directory
        body = {"id": prompt_id, "text": text, "description": DESCRIPTION}
        try:
            await self._request("POST", f"/api/session/{turn.session_id}/synthetic", {}, body)
        except UpstreamRefused as refusal:
            if refusal.status != CONFLICT:
                raise

    def answered(self, view: Any, turn: InterruptedTurn, prompt_id: str) -> str | None:
        """The continuation stored, and an assistant message newer than the interrupted one (ids
        the server made, compared with each other only)."""
        rules = self.rules(turn.api)
        stored = prompt_id in {message.get("id") for message in rules.messages_of(view, single=False)}
        newer = message_after(view, rules, turn.message_id, "assistant")
        return "the continuation is stored, and a step ran after it" if stored and newer else None

    async def waiting_on_person(self, session_id: str) -> str | None:
        for kind in PERSON_LISTS:
            if kind in self._unrouted:
                continue
            try:
                listed = await self._api.get(f"/api/session/{session_id}/{kind}", self._credentials)
            except UpstreamRefused as refusal:
                if not refusal.no_route:
                    raise
                self._unrouted.add(kind)
                log.info(
                    "the server has no GET /api/session/{id}/%s (an empty 404): no %s can wait there",
                    kind,
                    kind,
                )
                continue
            pending = listed.get("data") if isinstance(listed, dict) else None
            if isinstance(pending, list) and pending:
                return f"a {kind} asked"
        return None


def restart_notice(view: Any, since: str) -> str | None:
    """The id of a synthetic input newer than `since` in `view` (a `{data: [...]}` message list)
    that a server continuing a turn itself at boot admitted, if there is one."""
    messages = view.get("data") if isinstance(view, dict) else None
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict) or message.get("type") != "synthetic":
            continue
        metadata, found = message.get("metadata"), message.get("id")
        noticed = isinstance(metadata, dict) and metadata.get("notice") == RESTART_NOTICE
        if noticed and isinstance(found, str) and found > since:
            return found
    return None
