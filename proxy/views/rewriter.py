"""The view rewriter: a view's bytes and a liveness reading in, its settled bytes or "unchanged"
(and why) out. Pure: it asks nothing, waits for nothing, logs nothing.

It works in two steps because the first decides whether a reading is needed at all: `scan`
looks for the rules' triggers in the bytes (a client polling a view it already saw settled
pays one comparison instead); `settle` then runs the rules on the messages the scan found.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from proxy.opencode.routes import MessageRoute
from proxy.views import scan
from proxy.views.rewrite import RecentRewrites, Rewritten, rewrite
from rules import DEFAULT_RULES, Doubt, Liveness, Rule, UnexpectedShape

__all__ = ["Held", "Reason", "Scanned", "Unchanged", "ViewRewriter"]


class Reason(StrEnum):
    CLEAN = "no rule's trigger occurs in it"
    ACTIVE = "the session is active"
    CONSISTENT = "no rule changes anything"
    UNEXPECTED_SHAPE = "it is not the shape the rules know"


@dataclass(frozen=True, slots=True)
class Unchanged:
    """The body goes out as the upstream sent it; `detail` says more when there is more."""

    reason: Reason
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Held:
    """A message the rules would settle, left open because the reading cannot vouch for it."""

    message: str
    doubt: Doubt
    last_alive: int


@dataclass(frozen=True, slots=True)
class Scanned:
    """A body in which a trigger occurs (at `found`), or whose rewrite is `known` from before."""

    route: MessageRoute
    view: str
    body: bytes
    found: Sequence[int] | None
    known: Rewritten | None


class ViewRewriter:
    """Settles the views of one set of rules, remembering the last rewrite of each view."""

    def __init__(self, rules: Sequence[Rule] = DEFAULT_RULES) -> None:
        self._rules = rules
        self._recent = RecentRewrites()

    def scan(self, route: MessageRoute, view: str, body: bytes) -> Scanned | Unchanged:
        """What the rules will have to see of `body` (one pass over it at most)."""
        known = self._recent.known(route.session_id, view, body)
        if known is not None:
            return Scanned(route, view, body, None, known)
        found = scan.found(body, route.api, self._rules)
        return Scanned(route, view, body, found, None) if found else Unchanged(Reason.CLEAN)

    def settle(self, scanned: Scanned, liveness: Liveness) -> Rewritten | Unchanged:
        """What a reading later than everything in the body, with no other process on the
        database, would settle (the same for equal bytes, so it is kept): the caller checks that
        `liveness` vouches for it."""
        if liveness.active:
            return Unchanged(Reason.ACTIVE)
        if scanned.known is not None:
            return scanned.known
        later = Liveness(liveness.session_id, active=False)
        return self._outcome(
            lambda: self._recent.rewrite(
                scanned.view, scanned.body, scanned.route, later, self._rules, found=scanned.found
            ),
        )

    def settle_exactly(self, scanned: Scanned, liveness: Liveness) -> Rewritten | Unchanged:
        """What `liveness` itself vouches for (not kept: a later fetch may be vouched for more)."""
        if liveness.active:
            return Unchanged(Reason.ACTIVE)
        return self._outcome(
            lambda: rewrite(scanned.body, scanned.route, liveness, self._rules, found=scanned.found)
        )

    @staticmethod
    def held_back(later: Rewritten, exactly: Rewritten | Unchanged, liveness: Liveness) -> list[Held]:
        """The messages `later` settles and `exactly` does not, each with why `liveness` does not
        vouch for it: what a view left open owes the log."""
        settled = () if isinstance(exactly, Unchanged) else [index for index, _ in exactly.messages.settled]
        held = []
        for index, settlement in later.messages.settled:
            doubt = liveness.doubt(settlement.last_alive)
            if index not in settled and doubt is not None:
                held.append(Held(settlement.changes[0].target.message, doubt, settlement.last_alive))
        return held

    @staticmethod
    def _outcome(rewriting: Callable[[], Rewritten | None]) -> Rewritten | Unchanged:
        try:
            rewritten = rewriting()
        except UnexpectedShape as error:
            return Unchanged(Reason.UNEXPECTED_SHAPE, str(error))
        return Unchanged(Reason.CONSISTENT) if rewritten is None else rewritten
