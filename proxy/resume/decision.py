"""Whether an interrupted turn may be resumed: pure, so every reason is tested without a server.

A resume is the agent acting on the user's machine with nobody watching, so every check is a
reason *not* to, and the first that applies is the answer. They are taken in two steps: what can
be told from the session before its calls are settled (`before_settling`), and what must be true
of the settled history and a liveness reading taken after it (`after_settling`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from proxy.resume.last_turn import InterruptedTurn, LastTurn
from proxy.resume.safety import CallClass, Classed, Safety, classify
from proxy.resume.text import shortened

__all__ = [
    "After",
    "Before",
    "Policy",
    "ResumeOutcome",
    "Verdict",
    "after_settling",
    "before_settling",
    "classed_calls",
    "why_wait",
]

DEFAULT_WITHIN_S = 300.0
"""`--resume-within`: a restart under `settle-proxy run` takes seconds (its pauses grow to 15 s,
and a cold opencode start with its plugin install well under a minute), so five minutes covers
any restart the proxy itself makes with room to spare; a server that stayed down longer was
restarted by a person, who is then at the machine and may well have moved on."""
DEFAULT_ATTEMPTS = 3
"""`--resume-attempts`: prompts sent for one person's turn, across a resumed turn that is itself
interrupted and a prompt the server admitted but never ran."""


class ResumeOutcome(StrEnum):
    """What became of one decision (the metric's label, the log line's `outcome`)."""

    RESUMED = "resumed"
    WOULD_RESUME = "would-resume"
    SKIPPED = "skipped"
    WAITING = "waiting"
    """Settled, and left for a person: an unsafe call, or no `--resume` (`GET /_settle/resume`)."""
    NOT_STARTED = "not-started"
    GAVE_UP = "gave-up"


@dataclass(frozen=True, slots=True)
class Policy:
    attempts: int = DEFAULT_ATTEMPTS
    within_s: float = DEFAULT_WITHIN_S


@dataclass(frozen=True, slots=True)
class Verdict:
    """Go ahead (`why` is None), or the reason not to."""

    why: str | None = None

    @property
    def go(self) -> bool:
        return self.why is None


GO = Verdict()


@dataclass(frozen=True, slots=True)
class Before:
    """What is known of a session the stream showed busy when the server went away."""

    last: LastTurn
    parent_id: str | None
    """The session's parent (a `task` call's child session has one)."""
    waiting_on_person: str | None
    """A permission or question the stream showed asked and not answered, by kind."""
    age_s: float
    """Seconds since the last sign of life of the server while the session was busy."""
    witnessed: bool = True
    """Whether the turn's message is the newest the stream spoke of while the dead server ran:
    a turn only that server's crash cut. A session idle before it (an older interruption left
    settled, news of its title) is never woken."""


def before_settling(facts: Before, policy: Policy) -> Verdict:
    """The reasons that need nothing settled to be known."""
    turn = facts.last.turn
    if not facts.age_s <= policy.within_s:  # so that a NaN on either side resumes nothing
        return Verdict(f"last alive {facts.age_s:.0f} s ago, past --resume-within {policy.within_s:g} s")
    if facts.parent_id is not None:
        return Verdict(f"a child session (of {facts.parent_id}): its parent's turn is the one to resume")
    if facts.last.newer is not None:
        return Verdict(
            f"a newer message {facts.last.newer} is in the session: a person wrote, or it was resumed already"
        )
    if turn is None:
        return Verdict("no interrupted turn: the last assistant message finished")
    return _the_turn(facts, turn)


def _the_turn(facts: Before, turn: InterruptedTurn) -> Verdict:
    """What only the interrupted turn itself can tell: cut by the last crash, no person asked."""
    if not facts.witnessed:
        return Verdict(
            f"not cut by the last crash: the stream never spoke of {turn.message_id} while the server ran"
        )
    if (person := facts.waiting_on_person or _asks_a_person(turn)) is not None:
        return Verdict(f"it was waiting on a person ({person}): left settled for them to answer")
    return GO


def _asks_a_person(turn: InterruptedTurn) -> str | None:
    return "a question" if any(call.tool == "question" for call in turn.calls) else None


@dataclass(frozen=True, slots=True)
class After:
    """The session re-read after its calls were settled, and a reading taken after that."""

    before: Before
    active: bool
    elsewhere: str | None
    """Another process on the server's database that could be running the session, described."""
    used: int
    """Prompts already sent for this person's turn (this and earlier interruptions of it)."""
    settled_by: str | None = None
    """What makes the settlement durable when the server does it itself before any model work
    (2.x's drain), so a call still open in storage is no reason to wait; None: the proxy must."""


def after_settling(facts: After, policy: Policy) -> Verdict:
    """Everything `before_settling` checks, on the re-read, and what only the re-read can tell."""
    if not (verdict := before_settling(facts.before, policy)).go:
        return verdict
    turn = facts.before.last.turn
    assert turn is not None  # before_settling went ahead
    if facts.active:
        return Verdict("the session is running: the server did not lose the turn")
    if facts.elsewhere is not None:
        return Verdict(f"another process on the database may be running it: {facts.elsewhere}")
    if (still_open := [call.call_id for call in turn.calls if call.still_open]) and facts.settled_by is None:
        return Verdict(
            f"not settled in the server's storage: {', '.join(still_open)} still open when re-read"
        )
    if facts.used >= policy.attempts:
        return Verdict(
            f"{facts.used} prompt(s) sent for this turn already (--resume-attempts {policy.attempts})"
        )
    return GO


def classed_calls(settled: InterruptedTurn, first: InterruptedTurn, safety: Safety) -> tuple[Classed, ...]:
    """The class of each call of the `settled` turn, by its status as `first` read it (before the
    settlement made every call `error`); a call the server failed as ambiguous is unsafe, whatever
    it ran: the server itself would not continue it."""
    status = {call.call_id: call.status for call in first.calls}
    found = []
    for call in settled.calls:
        shown = shortened(call)
        if call.refused is not None:
            why = f"the server failed it itself: {call.refused}"
            found.append(Classed(call.call_id, call.tool, shown, CallClass.UNSAFE, why))
        else:
            seen = status.get(call.call_id, call.status)
            found.append(classify(call.call_id, call.tool, call.input, seen, safety=safety, shown=shown))
    return tuple(found)


def why_wait(
    turn: InterruptedTurn, classed: tuple[Classed, ...], safety: Safety, *, auto: bool
) -> str | None:
    """Why the settled `turn` waits for a person instead of being continued by itself, or None."""
    if (refused := next((call for call in turn.calls if call.refused is not None), None)) is not None:
        return f"the server did not continue it ({refused.refused}): a person decides"
    if not auto:
        return "--resume is off: an interrupted turn waits for a Continue"
    unsafe = [call for call in classed if not call.safe]
    if unsafe and not safety.unsafe_ok:
        named = "; ".join(f"{call.tool} `{call.command}`: {call.why}" for call in unsafe)
        return f"an unsafe call ({named}); --resume-unsafe would continue it"
    return None
