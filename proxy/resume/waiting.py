"""Turns that wait for a person: interrupted with a call that may have changed something (or on
a proxy without `--resume`, any interrupted turn), settled, and then left for a person to
continue (`POST /_settle/resume/{session}`) or to take back with a message of their own.

They are listed in `GET /_settle/resume`, kept in the ledger's database (a proxy restarted lists
them still) and told through an `Announcer` when a wait starts and when it ends: the proxy's
default tells no one; a client-facing one (a toast, a session error the UI shows) is another
part's to give."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from proxy.relay.bounded import Bounded
from proxy.resume.last_turn import InterruptedCall, InterruptedTurn
from proxy.resume.ledger import Ledger
from proxy.resume.safety import CallClass, Classed
from rules import Api

__all__ = [
    "TITLE",
    "Announcer",
    "Continued",
    "NotWaiting",
    "Silent",
    "Waiting",
    "WaitingTurns",
    "wait_message",
]

log = logging.getLogger(__name__)
OVER_KEPT = 10_000
"""Sessions whose wait ended, remembered to answer a second Continue 409 (continued already) rather
than 404 (none waits): both refuse; past this many later ones, the oldest is answered 404."""
TITLE = "Interrupted call needs you"


class Announcer(Protocol):
    def waiting(self, session_id: str, directory: str | None, title: str, message: str) -> None: ...

    def ended(self, session_id: str) -> None: ...


class Silent:
    """The default `Announcer`: the wait is in `GET /_settle/resume` and the log only."""

    def waiting(self, session_id: str, directory: str | None, title: str, message: str) -> None:
        del session_id, directory, title, message

    def ended(self, session_id: str) -> None:
        del session_id


@dataclass(frozen=True, slots=True)
class Waiting:
    """One turn waiting for a person: the turn, where it runs, its calls' classes, since when
    (epoch seconds), why, the line (a dialect's name) that continues it, and its last sign of
    life before the crash (epoch seconds)."""

    turn: InterruptedTurn
    directory: str | None
    calls: tuple[Classed, ...]
    since: float
    why: str
    line: str
    alive: float

    def as_json(self) -> dict[str, Any]:
        return {
            "session": self.turn.session_id,
            "message": self.turn.message_id,
            "api": str(self.turn.api),
            "since": self.since,
            "why": self.why,
            "calls": [call.as_json() for call in self.calls],
        }

    def stored(self) -> bytes:
        turn = self.turn
        calls = [[c.call_id, c.tool, c.input, c.still_open, c.status] for c in turn.calls]
        kept = [
            turn.session_id,
            str(turn.api),
            turn.message_id,
            calls,
            turn.agent,
            turn.model,
            turn.prompted_by,
        ]
        classes = [[c.call_id, c.tool, c.command, str(c.klass), c.why] for c in self.calls]
        return orjson.dumps([kept, self.directory, classes, self.since, self.why, self.line, self.alive])

    @classmethod
    def restored(cls, data: bytes) -> Waiting:
        kept, directory, classes, since, why, line, alive = orjson.loads(data)
        session_id, api, message_id, calls, agent, model, prompted_by = kept
        turn = InterruptedTurn(
            session_id,
            Api(api),
            message_id,
            tuple(InterruptedCall(*call) for call in calls),
            agent,
            model,
            prompted_by,
        )
        classed = tuple(Classed(c[0], c[1], c[2], CallClass(c[3]), c[4]) for c in classes)
        return cls(turn, directory, classed, since, why, line, alive)


def wait_message(calls: Sequence[Classed], session_id: str) -> str:
    """What a person is told: the calls that made the turn wait, and how to continue it."""
    unsafe = [call for call in calls if not call.safe] or list(calls)
    named = (
        "; ".join(f"{call.tool} `{call.command}` ({call.why})" for call in unsafe) or "the answer was cut off"
    )
    return (
        f"The server stopped during {named}. It was not run again. To continue the turn, send a "
        f"message, or POST /_settle/resume/{session_id}"
    )


class NotWaiting(LookupError):
    """No turn of the session waits (never did, or its wait ended: the message says why)."""


class Continued(LookupError):
    """The session's waiting turn was continued already (the message says when)."""


class WaitingTurns:
    """The waiting turns by session, in memory and in the `ledger` (when there is one)."""

    def __init__(
        self,
        announcer: Announcer | None = None,
        ledger: Ledger | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._announcer = announcer or Silent()
        self._ledger = ledger
        self._clock = clock
        self._waiting: dict[str, Waiting] = {}
        self._over: Bounded[str, tuple[str, bool]] = Bounded(OVER_KEPT)
        """Sessions no longer waiting: why, and whether they were continued (to say so to a
        second Continue; one forgotten is answered that no turn of it waits, a refusal too)."""

    async def load(self) -> None:
        """The turns a proxy before this one left waiting."""
        if self._ledger is None:
            return
        for data in await self._ledger.waits():
            waiting = Waiting.restored(data)
            self._waiting[waiting.turn.session_id] = waiting

    def get(self, session_id: str) -> Waiting | None:
        return self._waiting.get(session_id)

    def listed(self) -> list[dict[str, Any]]:
        return [waiting.as_json() for waiting in sorted(self._waiting.values(), key=lambda w: w.since)]

    async def add(self, waiting: Waiting) -> None:
        session_id = waiting.turn.session_id
        if self._ledger is not None:  # kept first: once listed, it can be continued at once
            await self._ledger.wait(session_id, waiting.turn.message_id, waiting.stored())
        self._waiting[session_id] = waiting
        self._over.pop(session_id, None)
        self._announcer.waiting(session_id, waiting.directory, TITLE, wait_message(waiting.calls, session_id))

    async def take(self, session_id: str) -> Waiting:
        """The session's waiting turn, no longer waiting (it is to be continued once)."""
        if (waiting := self._waiting.pop(session_id, None)) is None:
            why, continued = self._over.get(session_id, ("no turn of this session waits for a person", False))
            raise (Continued if continued else NotWaiting)(why)
        self._over[session_id] = (f"continued already, at {self._clock():.0f} (epoch s)", True)
        await self._forget(session_id)
        return waiting

    async def end(self, session_id: str, why: str) -> None:
        """End the session's wait, if it waits (a person took it back)."""
        if self._waiting.pop(session_id, None) is None:
            return
        self._over[session_id] = (f"the wait ended: {why}", False)
        await self._forget(session_id)
        log.info(
            "resume wait ended: session %s: %s", session_id, why, extra={"fields": {"session": session_id}}
        )

    async def _forget(self, session_id: str) -> None:
        if self._ledger is not None:
            await self._ledger.unwait(session_id)
        self._announcer.ended(session_id)
