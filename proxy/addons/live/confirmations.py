"""Confirmations that news of their session withdraws, for the addons that speak on client streams.

Before the proxy slips an event into a client stream it confirms, from the server, that what the
event says is true: it reads the message, then takes a liveness reading (in that order: a turn that
starts after the read shows in the reading), and then announces. What the followed stream says of
the session from the moment the confirmation starts is newer than anything read: a turn may have
started after the reading (the client has been relayed `session.status busy`), and an announced
"idle" would then be false. So every confirmation holds a `Ticket` from its start until it
announces; any event about its session withdraws it, and a withdrawn ticket announces nothing,
schedules no write-back, and says so in the log and in `settle_proxy_withdrawn_confirmations`.

Only events that say the session went idle (`session.status` idle, `session.idle`,
`session.error`) leave a ticket alone: they agree with what would be announced, and the server
sends them in a burst (`session.error`, then `session.status` idle, then `session.idle`), so the
first of them, which starts a confirmation, would otherwise always be withdrawn by the next.

A confirmation asked for while one of its session is under way is not the same request: it comes
from something that happened since (a client stream opened, the session went idle), which the
confirmation under way may have read too early to see. So it runs once more when that one ends,
with a ticket taken when it was asked for; asked for again meanwhile, the newest request stands.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from prometheus_client import Counter

from proxy.opencode.tracker import FollowedEvent
from proxy.relay.tasks import KeyedTasks

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class Ticket:
    """One confirmation's claim to announce; `news` is the kind of the event that withdrew it."""

    session_id: str
    news: str | None = None


class NewsWatch:
    """The tickets of the confirmations under way, per session, of one kind (`what`: the label of
    the counter `withdrawn` and the subject of the log line)."""

    def __init__(self, what: str, withdrawn: Counter) -> None:
        self._what = what
        self._withdrawn = withdrawn
        self._tickets: dict[str, set[Ticket]] = {}

    def heard(self, event: FollowedEvent) -> None:
        """The stream spoke of a session: confirmations of it under way must not announce."""
        if event.session_id is None or event.turn_over:
            return
        for ticket in self._tickets.pop(event.session_id, ()):
            ticket.news = event.kind

    def begin(self, session_id: str) -> Ticket:
        """A ticket for one confirmation of `session_id`, watched from now on. It is taken when the
        confirmation is scheduled, not when its task first runs: the tracker hands over the events
        that came in the same chunk as a reconnect before any task runs, and they are news too."""
        ticket = Ticket(session_id)
        self._tickets.setdefault(session_id, set()).add(ticket)
        return ticket

    @contextmanager
    def held(self, ticket: Ticket) -> Iterator[Ticket]:
        """`ticket`, watched until the block ends."""
        try:
            yield ticket
        finally:
            self.release(ticket)

    def release(self, ticket: Ticket) -> None:
        """Stop watching for news for `ticket`."""
        tickets = self._tickets.get(ticket.session_id)
        if tickets is not None:
            tickets.discard(ticket)
            if not tickets:
                del self._tickets[ticket.session_id]

    def vouches(self, ticket: Ticket) -> bool:
        """Whether the confirmation may announce; when news withdrew it, log and count that."""
        if ticket.news is None:
            return True
        log.info(
            "confirmation of %s withdrawn: the stream spoke of the session meanwhile",
            self._what,
            extra={"fields": {"session": ticket.session_id, "news": ticket.news, "decision": "withdrawn"}},
        )
        self._withdrawn.labels(self._what).inc()
        return False


Confirm = Callable[[Ticket], Awaitable[None]]


class Confirmations:
    """One confirmation at a time per session, each watched for news of its session from the
    moment it is scheduled until it ends; its work is given its `Ticket`, to ask `vouches` with
    before it announces."""

    def __init__(self, name: str, what: str, withdrawn: Counter) -> None:
        self.tasks: KeyedTasks[str] = KeyedTasks(name)
        self._watch = NewsWatch(what, withdrawn)
        self._asked_meanwhile: dict[str, tuple[Ticket, Confirm]] = {}

    def schedule(self, session_id: str, confirm: Confirm) -> None:
        """Run `confirm(ticket)` now, or once the confirmation of `session_id` under way ends; the
        ticket is taken now, so the events handed over before it first runs are news too."""
        ticket = self._watch.begin(session_id)
        if self.tasks.start(session_id, lambda: self._held(ticket, confirm)):
            return
        if (superseded := self._asked_meanwhile.pop(session_id, None)) is not None:
            self._watch.release(superseded[0])
        self._asked_meanwhile[session_id] = (ticket, confirm)

    def heard(self, event: FollowedEvent) -> None:
        self._watch.heard(event)

    def under_way(self, session_id: str) -> bool:
        return self.tasks.running(session_id)

    def vouches(self, ticket: Ticket) -> bool:
        return self._watch.vouches(ticket)

    async def _held(self, ticket: Ticket, confirm: Confirm) -> None:
        next_one: tuple[Ticket, Confirm] | None = (ticket, confirm)
        try:
            while next_one is not None:
                ticket, confirm = next_one
                with self._watch.held(ticket):
                    await confirm(ticket)
                next_one = self._asked_meanwhile.pop(ticket.session_id, None)
        finally:
            if (left := self._asked_meanwhile.pop(ticket.session_id, None)) is not None:
                self._watch.release(left[0])
