"""Notices for a person, in the clients they use: a turn that waits for them is said on every
client event stream of its session, for the live-settle addon (`Notices` is the resume's Announcer).

What the 1.18.33 clients draw of an event on `/global/event` (measured, `docs/resume.md`):
the TUI (`opencode attach`) draws `tui.toast.show` as a toast and `session.error` as a 5 s error
toast; the bundled web UI draws neither (its reducer has no case for them: a `session.error` only
marks the session unseen and may raise a system notification naming the session's title). Both
draw a text part of a message they hold, where the transcript ends, and both drop a part on
`message.part.removed`. So a notice is one text part added to the session's newest assistant
message (the interrupted one): it marks nothing failed or busy, stays in view until the wait
ends, and is then removed from every stream open. It is kept as the session's state, so a
stream that opens while the wait lasts is replayed it once, after the messages it belongs to
(`replay`); the server never hears of it, and a page reloaded later fetches none.

A client that opens later takes its stream first and fetches the transcript after, and the TUI
then replaces what it holds of each message fetched: measured, a TUI attached while the wait
lasted was replayed the notice and showed nothing. So each v1 message view of a waiting session
that passes the proxy is followed by the notice once more, on every stream open (the same part:
a client that still holds it draws nothing new).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import aiohttp

from proxy.addons.context import SettleContext
from proxy.addons.live.clients import ClientStreams, Telling
from proxy.addons.live.memory import REMEMBERED, Place
from proxy.addons.routing import message_view, route_of
from proxy.opencode.client import UpstreamRefused
from proxy.opencode.ids import ascending_id
from proxy.opencode.vocabulary import notice_part, notice_removed, part_subject
from proxy.relay.bounded import Bounded
from proxy.relay.hooks import Addon, Flow
from proxy.relay.tasks import KeyedTasks
from rules import Api

__all__ = ["Notices"]

log = logging.getLogger(__name__)

NEWEST = "4"
"""Messages asked for to find the session's newest assistant message (a person's queued message
may be newer)."""
PAUSES_S = (0.0, 0.5, 1.0, 2.0)
"""Before each attempt to read the session: a server that has just restarted may not answer at once."""
_FAILURES = (UpstreamRefused, aiohttp.ClientError, OSError, TimeoutError, ValueError)


@dataclass(slots=True, eq=False)
class Notice:
    """What one waiting session is told, and where it is shown once its message is known."""

    session_id: str
    directory: str | None
    text: str
    part_id: str
    place: Place | None = None
    """The session's newest assistant message and directory, once read; None until then."""


class Notices(Addon):
    """Tells the client streams that a session waits for a person (`waiting`), until it does not
    (`ended`); and again after each view of its messages."""

    name: ClassVar[str] = "live-notices"

    def __init__(self, ctx: SettleContext, clients: ClientStreams) -> None:
        self.scope = message_view
        self._ctx = ctx
        self._clients = clients
        self._waiting: Bounded[str, Notice] = Bounded(REMEMBERED)
        self.tasks: KeyedTasks[str] = KeyedTasks("live-settle notice")

    def waiting(self, session_id: str, directory: str | None, title: str, message: str) -> None:
        """Show `title` and `message` in every client stream of the session, now and in each one
        that opens until `ended`; said again, the notice's text is replaced in place."""
        earlier = self._waiting.get(session_id)
        part_id = earlier.part_id if earlier is not None else ascending_id("prt")
        notice = Notice(session_id, directory, f"{title}\n\n{message}", part_id)
        if earlier is not None and earlier.place is not None and earlier.directory == directory:
            notice.place = earlier.place
        self._waiting[session_id] = notice
        if notice.place is not None:
            self._show(notice, notice.place)
        else:
            self.tasks.start(session_id, lambda: self._find(session_id))

    def ended(self, session_id: str) -> None:
        """Stop the notice: no stream that opens is replayed it, and every open one drops it."""
        notice = self._waiting.pop(session_id, None)
        if notice is None or (place := notice.place) is None:
            return
        self._clients.replays.withdraw(session_id, part_subject(notice.part_id))
        removed = notice_removed(session_id, place.message_id, notice.part_id)
        self._clients.publish(f"notice {session_id}", Telling(place, moment=[removed]))
        log.info(
            "session %s waits no longer: its notice is withdrawn from the client streams",
            session_id,
            extra={"fields": {"session": session_id, "decision": "notice withdrawn"}},
        )

    async def done(self, flow: Flow) -> None:
        """A client that fetched a waiting session's messages holds them as fetched: tell it again."""
        route = route_of(flow).messages
        if route is None or route.api is not Api.V1 or route.single or flow.status != 200:
            return
        notice = self._waiting.get(route.session_id)
        if notice is not None and notice.place is not None:
            self._show(notice, notice.place, again=True)

    async def close(self) -> None:
        """Cancel the reads of where a notice goes (application cleanup)."""
        await self.tasks.close()

    async def _find(self, session_id: str) -> None:
        """Read where the notice goes, then show it if the session still waits (the newest
        notice of it, which may have come meanwhile)."""
        while (notice := self._waiting.get(session_id)) is not None and notice.place is None:
            place = await self._place(notice)
            if place is None:
                return
            if (newest := self._waiting.get(session_id)) is None:
                return
            if newest.directory == notice.directory:
                newest.place = place
                self._show(newest, place)

    async def _place(self, notice: Notice) -> Place | None:
        error: BaseException | None = None
        for pause in PAUSES_S:
            await asyncio.sleep(pause)
            try:
                return await self._read(notice)
            except _FAILURES as failure:
                error = failure
        log.warning(
            "session %s waits for a person, but no client is told: its messages could not be read (%s)",
            notice.session_id,
            error,
            extra={"fields": {"session": notice.session_id, "decision": "not told", "error": str(error)}},
        )
        return None

    async def _read(self, notice: Notice) -> Place:
        """The session's newest assistant message, and its directory (the web UI keeps each
        directory's sessions apart: a part framed with another directory is never drawn)."""
        upstream, credentials, session_id = self._ctx.upstream, self._ctx.credentials, notice.session_id
        directory = notice.directory
        if directory is None:
            info = await upstream.get(f"/session/{session_id}", credentials)
            directory = info.get("directory") if isinstance(info, dict) else None
        asked = {"directory": directory} if isinstance(directory, str) else {}
        messages = await upstream.get(f"/session/{session_id}/message", credentials, limit=NEWEST, **asked)
        message_id = _newest_assistant(messages)
        if message_id is None:
            raise ValueError(f"no assistant message among the newest {NEWEST}")
        return Place(session_id, message_id, directory if isinstance(directory, str) else None, None)

    def _show(self, notice: Notice, place: Place, *, again: bool = False) -> None:
        if self._ctx.dry_run:
            log.info(
                "session %s waits for a person: the client streams would be told (dry run)",
                notice.session_id,
                extra={"fields": {"session": notice.session_id, "decision": "would tell"}},
            )
            return
        now = int(time.time() * 1000)
        said = notice_part(notice.session_id, place.message_id, notice.part_id, notice.text, now)
        self._clients.publish(f"notice {notice.session_id}", Telling(place, state=[said]))
        log.log(
            logging.DEBUG if again else logging.INFO,
            "session %s waits for a person: the client streams are told%s",
            notice.session_id,
            " again, after a view of its messages" if again else ", and those that open are replayed it",
            extra={"fields": {"session": notice.session_id, "message": place.message_id, "decision": "told"}},
        )


def _newest_assistant(messages: Any) -> str | None:
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        info = message.get("info") if isinstance(message, dict) else None
        if isinstance(info, dict) and info.get("role") == "assistant" and isinstance(info.get("id"), str):
            return str(info["id"])
    return None
