"""The confirmer: every confirmation the proxy makes before it speaks on client streams, its steps
written once, each confirmation a `Kind` that says only how it reads and what it settles (as Go's
`httputil.ReverseProxy` takes its variations as fields).

Before the proxy slips an event into a client stream it confirms, from the server, that what the
event says is true: after the grace period (`after_grace`) it reads the messages, then takes a
liveness reading (in that order: a turn that starts after the read shows in the reading), and then
announces. What the followed stream says of the session from the moment the confirmation starts is
newer than anything read: a turn may have started after the reading (the client has been relayed
`session.status busy`), and an announced "idle" would then be false. So every confirmation holds a
`Ticket` from its start until it announces; any event about its session withdraws it, and a
withdrawn ticket announces nothing, schedules no write-back, and says so in the log and in
`settle_proxy_withdrawn_confirmations`.

Only events that say the session went idle (`session.status` idle, `session.idle`,
`session.error`) leave a ticket alone: they agree with what would be announced, and the server
sends them in a burst (`session.error`, then `session.status` idle, then `session.idle`), so the
first of them, which starts a confirmation, would otherwise always be withdrawn by the next.

A confirmation asked for while one of its session is under way is not the same request: it comes
from something that happened since (a client stream opened, the session went idle), which the
confirmation under way may have read too early to see. So it runs once more when that one ends,
with a ticket taken when it was asked for; asked for again meanwhile, the newest request stands.

What a reading left open that a later one may settle is confirmed again once what held it back
is gone (`held`). Under `--dry-run` each thing told is logged in its dry-run words, and nothing
is published or written back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

from proxy.addons.context import SettleContext
from proxy.addons.live.after_grace import found_active, read_after_grace
from proxy.addons.live.held import HeldBack, Holds
from proxy.opencode.client import Credentials, UpstreamRefused
from proxy.opencode.tracker import FollowedEvent
from proxy.relay.tasks import KeyedTasks, Together
from rules import Api, Liveness

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class Ticket:
    """One confirmation's claim to announce; `news` is the kind of the event that withdrew it."""

    session_id: str
    news: str | None = None


@dataclass(frozen=True, slots=True)
class Asked:
    """Who asked for a confirmation: whose credentials it reads with (and writes back with), and
    whether what it finds is worth an INFO line (`loud`) or only a DEBUG one."""

    credentials: Credentials
    loud: bool = True

    @property
    def level(self) -> int:
        return logging.INFO if self.loud else logging.DEBUG


@dataclass(frozen=True, slots=True)
class Words:
    """What a kind of confirmation is called: `name` its tasks', `subject` the withdrawal line's
    and counter's, `held` the hold lines', `reading` the failed-try line's; `api` what it writes
    back, `log` where its lines go."""

    name: str
    subject: str
    held: str
    reading: str
    api: Api
    log: logging.Logger
    routine: bool = False
    """Asked for at every client stream's opening (a session stream's): what the reading finds
    is the kind's to say, at the asker's level; news withdraws only what would be told, and what a
    reading held back is confirmed again whatever the news."""


@dataclass(frozen=True, slots=True)
class Told:
    """One thing a confirmation tells: its line in the log (`said`, then its words under
    `--dry-run`; None: no line), what `publish` sends, and the id the write-back is given."""

    said: tuple[str, str] | None
    fields: dict[str, Any] = field(default_factory=dict)
    publish: Callable[[], None] | None = None
    write_back: str | None = None


@dataclass(frozen=True, slots=True)
class StillHeld:
    """What held back what a reading left open, and `still()`, whether any of it is left to confirm."""

    holds: Holds
    still: Callable[[], bool]


@dataclass(slots=True)
class Judgement:
    """What a kind settles from a reading: what it tells, in order, and what it holds back."""

    told: list[Told] = field(default_factory=list)
    held: list[StillHeld] = field(default_factory=list)


def said(done: str, dry: str, what: str) -> tuple[str, str]:
    """A told line: `done what`, or under `--dry-run`, `dry what`."""
    return f"{done} {what}", f"{dry} {what}"


async def read_messages(
    ctx: SettleContext,
    asked: Asked,
    path: Callable[[str], str],
    ids: Iterable[str],
    gone: Callable[[str], None],
) -> dict[str, Any]:
    """The messages `ids` read afresh, by id; one the server no longer has is left out, and `gone`
    told its id (nothing can show what it held any more)."""
    messages = {}
    for message_id in dict.fromkeys(ids):
        try:
            messages[message_id] = await ctx.upstream.get(path(message_id), asked.credentials)
        except UpstreamRefused as refusal:
            if refusal.status != 404:
                raise
            gone(message_id)
    return messages


class Reading(Protocol):
    """What a confirmation read: its messages, whatever their shape, and a reading taken after."""

    @property
    def liveness(self) -> Liveness: ...


R = TypeVar("R", bound=Reading)


class Kind(Protocol[R]):
    """What differs between confirmations: what they are called, how they read, what they settle."""

    @property
    def words(self) -> Words: ...

    async def read(self, session_id: str, asked: Asked) -> R | None:
        """The session's messages read afresh, then a reading; None when there is nothing to
        confirm. A failure (`after_grace`) is a try asked again."""

    def judge(self, session_id: str, reading: R, asked: Asked) -> Judgement:
        """What to tell of an inactive reading (a routine kind's may be active), and what it left
        held back; what is told may be forgotten here."""


class Confirmer(Generic[R]):
    """One confirmation at a time per session, of one `Kind`, each watched for news of its
    session from the moment it is scheduled until it ends. `ended(session_id)` is called as each
    ends, for what a kind keeps while one is under way."""

    def __init__(
        self, ctx: SettleContext, kind: Kind[R], *, ended: Callable[[str], object] | None = None
    ) -> None:
        self._ctx = ctx
        self._kind = kind
        self._words = kind.words
        self._ended = ended
        self._keyed: KeyedTasks[str] = KeyedTasks(self._words.name)
        self._held = HeldBack(ctx.probe, self._words.held)
        self.tasks = Together(self._keyed, self._held)
        self._tickets: dict[str, set[Ticket]] = {}
        self._asked_meanwhile: dict[str, tuple[Ticket, Asked]] = {}

    def schedule(self, session_id: str, asked: Asked | None = None) -> None:
        """Confirm `session_id` now, or once its confirmation under way ends. The ticket is taken
        now, not when the task first runs: the tracker hands over the events that came in the
        same chunk as a reconnect before any task runs, and they are news too."""
        ticket = Ticket(session_id)
        self._tickets.setdefault(session_id, set()).add(ticket)
        asked = asked or Asked(self._ctx.credentials)
        if self._keyed.start(session_id, lambda: self._runs(ticket, asked)):
            return
        if (superseded := self._asked_meanwhile.pop(session_id, None)) is not None:
            self._release(superseded[0])
        self._asked_meanwhile[session_id] = (ticket, asked)

    def heard(self, event: FollowedEvent) -> None:
        """The stream spoke of a session: confirmations of it under way must not announce."""
        if event.session_id is None or event.turn_over:
            return
        for ticket in self._tickets.pop(event.session_id, ()):
            ticket.news = event.kind

    def under_way(self, session_id: str) -> bool:
        return self._keyed.running(session_id)

    async def _runs(self, ticket: Ticket, asked: Asked) -> None:
        next_one: tuple[Ticket, Asked] | None = (ticket, asked)
        try:
            while next_one is not None:
                ticket, asked = next_one
                try:
                    await self._confirm(ticket, asked)
                finally:
                    self._release(ticket)
                    if self._ended is not None:
                        self._ended(ticket.session_id)
                next_one = self._asked_meanwhile.pop(ticket.session_id, None)
        finally:
            if (left := self._asked_meanwhile.pop(ticket.session_id, None)) is not None:
                self._release(left[0])

    async def _confirm(self, ticket: Ticket, asked: Asked) -> None:
        session_id, routine = ticket.session_id, self._words.routine
        reading = await read_after_grace(
            partial(self._kind.read, session_id, asked), self._ctx.grace, self._words.reading, session_id
        )
        if reading is None:
            return
        if not routine and (not self._vouches(ticket) or found_active(session_id, reading.liveness.active)):
            return
        judgement = self._kind.judge(session_id, reading, asked)
        if routine:
            self._hold(session_id, judgement, reading.liveness, asked)
            if not judgement.told or not self._vouches(ticket):
                return
        self._tell(session_id, judgement.told, asked)
        if not routine:
            self._hold(session_id, judgement, reading.liveness, asked)

    def _vouches(self, ticket: Ticket) -> bool:
        """Whether the confirmation may announce; when news withdrew it, log and count that."""
        if ticket.news is None:
            return True
        log.info(
            "confirmation of %s withdrawn: the stream spoke of the session meanwhile",
            self._words.subject,
            extra={"fields": {"session": ticket.session_id, "news": ticket.news, "decision": "withdrawn"}},
        )
        self._ctx.metrics.withdrawn_confirmations.labels(self._words.subject).inc()
        return False

    def _tell(self, session_id: str, told: list[Told], asked: Asked) -> None:
        dry_run = self._ctx.dry_run
        for item in told:
            if item.said is not None:
                self._words.log.info(item.said[dry_run], extra={"fields": item.fields})
            if item.publish is not None and not dry_run:
                item.publish()
        written = [item.write_back for item in told if item.write_back is not None]
        if written and not dry_run and self._ctx.write_back is not None:
            self._ctx.write_back.schedule(self._words.api, session_id, asked.credentials, written)

    def _hold(self, session_id: str, judgement: Judgement, liveness: Liveness, asked: Asked) -> None:
        again = replace(asked, loud=True)
        for held in judgement.held:
            self._held.hold(
                session_id, held.holds, liveness, lambda: self.schedule(session_id, again), held.still
            )

    def _release(self, ticket: Ticket) -> None:
        """Stop watching for news for `ticket`."""
        tickets = self._tickets.get(ticket.session_id)
        if tickets is not None:
            tickets.discard(ticket)
            if not tickets:
                del self._tickets[ticket.session_id]
