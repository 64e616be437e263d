"""Message views: the one sequence from a view's bytes to what goes out, and what is left open.

Each thing is checked once, cheapest first. The stream's word (`stream_word`): a session it shows
active, or a view it saw clean since its last event, goes out unread. Then the bytes: a body in
which no rule's trigger occurs is clean, and one equal to a body rewritten before is that rewrite
again. Then a reading: the kept one bounded by the other processes on the server's database, or
else one asked of the upstream (and kept while the stream vouches for it); an active session
ends it there. The rules then run as an *unbounded* reading would have them (later than
everything in the body, no other process: the same for equal bytes, so that rewrite is kept),
and what the reading vouches for decides the rest. A reading vouches only for what was last
alive well before it (`rules.Liveness.vouches_for`, in the server's clock): a kept one too close
gives way to a fresh one, and what even that one cannot vouch for is left open, and said.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from aiohttp import web

from proxy.opencode.client import Credentials
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.routes import MessageRoute
from proxy.opencode.tracker import LivenessTracker
from proxy.relay.bounded import Bounded
from proxy.views.rewrite import Rewritten, rewrite
from proxy.views.scan import trigger_offsets
from rules import DEFAULT_RULES, Doubt, Liveness, Rule, UnexpectedShape

__all__ = [
    "REMEMBERED_VIEWS",
    "Held",
    "MessageViews",
    "Reason",
    "RecentRewrites",
    "Settled",
    "StreamWord",
    "Unchanged",
]


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
class StreamWord:
    """What the stream says of a view before its body is read: its kept reading (None: one must
    be asked), and whether that leaves nothing to settle, so the body goes out unread."""

    view: str
    liveness: Liveness | None
    unchanged: bool


@dataclass(frozen=True, slots=True)
class Settled:
    """What goes out (a settled body, or the upstream's bytes and why), what is left open, and
    whether it was decided before (the same bytes rewritten again for a client polling them)."""

    outcome: Rewritten | Unchanged
    held: tuple[Held, ...] = ()
    repeated: bool = False


@dataclass(frozen=True, slots=True)
class _Scanned:
    route: MessageRoute
    view: str
    body: bytes


@dataclass(frozen=True, slots=True)
class _Triggered(_Scanned):
    """A body in which the rules' triggers occur, at `offsets`: the rules have to see it."""

    offsets: Sequence[int]


@dataclass(frozen=True, slots=True)
class _Repeated(_Scanned):
    """A body equal to the last one of its view that was rewritten, so its unbounded rewrite is
    `rewritten` again (a memcmp instead of a scan)."""

    rewritten: Rewritten


REMEMBERED_VIEWS = 256
"""Views whose last rewrite is kept: the clients that poll a stale view (a TUI, a web page, a
follower) poll the few sessions they show; a view not polled again is only ever kept, never used."""
REWRITES_BYTES = 4 * 2**20
"""The kept rewrites' bytes (each view's body and its rewrite): a few views of 600 KB. Each
settled view of a proxy's life was otherwise kept up to 64 MiB, far past what polling reuses."""


class RecentRewrites:
    """The last rewrite of each view, reused while the upstream sends the very same bytes.

    For an inactive session a rewrite depends on nothing but the body, so equal bytes give an
    equal result: a client polling a stale view pays one comparison instead of a rewrite.
    Entries are dropped oldest first once they hold more than `budget` bytes, or are more than
    `views` (a client that busts caches makes a new view of every poll).
    """

    def __init__(self, budget: int = REWRITES_BYTES, views: int = REMEMBERED_VIEWS) -> None:
        self._entries: Bounded[tuple[str, str], tuple[bytes, Rewritten]] = Bounded(
            views, forgotten=self._forgotten
        )
        self._budget = budget
        self._size = 0

    def repeated(self, session_id: str, view: str, body: bytes) -> Rewritten | None:
        """The rewrite kept for `view` when `body` is the very same bytes (a memcmp: ~10 µs for
        600 KB, where the byte scan that would otherwise come first takes ~400 µs)."""
        entry = self._entries.get((session_id, view))
        return None if entry is None or entry[0] != body else entry[1]

    def rewrite(
        self,
        view: str,
        body: bytes,
        route: MessageRoute,
        liveness: Liveness,
        rules: Sequence[Rule],
        *,
        offsets: Sequence[int] | None = None,
    ) -> Rewritten | None:
        """Rewrite `body` and keep the result for `repeated`."""
        key = (route.session_id, view)
        result = rewrite(body, route, liveness, rules, offsets=offsets)
        self._forget(key)
        size = len(body) + len(result.body) if result is not None else 0
        if result is not None and size <= self._budget:
            while self._entries and self._size + size > self._budget:
                self._forget(next(iter(self._entries)))
            self._entries[key] = (body, result)  # past `views`, the oldest is forgotten
            self._size += size
        return result

    def _forget(self, key: tuple[str, str]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._forgotten(key, entry)

    def _forgotten(self, _: tuple[str, str], entry: tuple[bytes, Rewritten]) -> None:
        """An entry gone (for the budget, or for room among the views) no longer counts against it."""
        self._size -= len(entry[0]) + len(entry[1].body)


class MessageViews:
    """Settles the message views of one set of rules, with the readings of one stream and probe;
    `settle` raises `LivenessUnknown` when no reading can be had."""

    def __init__(
        self, tracker: LivenessTracker, probe: LivenessProbe, rules: Sequence[Rule] = DEFAULT_RULES
    ) -> None:
        self._tracker = tracker
        self._probe = probe
        self._rules = rules
        self._recent = RecentRewrites()

    def credentials(self, request: web.Request) -> Credentials:
        """What look-ups made on behalf of `request` authenticate with."""
        return self._probe.credentials(request)

    def stream_word(self, route: MessageRoute, view: str) -> StreamWord:
        """The stream's word on `view`: asked once per request, before its body is read."""
        kept = self._tracker.cached(route.api, route.session_id)
        liveness = None if kept is None else kept.liveness
        if liveness is not None and liveness.active:
            return StreamWord(view, liveness, unchanged=True)
        return StreamWord(view, liveness, unchanged=self._tracker.known_clean(route.session_id, view))

    async def settle(
        self, word: StreamWord, route: MessageRoute, body: bytes, request: web.Request
    ) -> Settled:
        """`body` of the view `word` speaks of, settled as far as a reading vouches for it;
        look-ups are made on behalf of `request`."""
        scanned = self._scan(route, word.view, body)
        if isinstance(scanned, Unchanged):
            self._tracker.mark_clean(route.session_id, word.view)
            return Settled(scanned)
        repeated = isinstance(scanned, _Repeated)
        asked = word.liveness is None
        if word.liveness is None:
            reading = await self._ask(route, request)
        else:
            reading = await self._probe.bounded(word.liveness)
        if reading.active:
            return Settled(Unchanged(Reason.ACTIVE), repeated=repeated)
        unbounded = self._unbounded(scanned)
        if isinstance(unbounded, Unchanged):
            return Settled(unbounded, repeated=repeated)
        last_alive = unbounded.messages.last_alive
        if not asked and reading.doubt(last_alive) is Doubt.TOO_RECENT:
            reading = await self._ask(route, request)
            if reading.active:
                active = Unchanged(Reason.ACTIVE)
                return Settled(active, _held_back(unbounded, active, reading), repeated=repeated)
        if reading.vouches_for(last_alive):
            return Settled(unbounded, repeated=repeated)
        vouched = self._rewrite(scanned, reading, keep=False)
        return Settled(vouched, _held_back(unbounded, vouched, reading), repeated=repeated)

    def _scan(self, route: MessageRoute, view: str, body: bytes) -> _Triggered | _Repeated | Unchanged:
        """What the rules will have to see of `body` (one pass over it at most): the rewrite of
        the same bytes kept from before, else where the triggers occur, if they do."""
        rewritten = self._recent.repeated(route.session_id, view, body)
        if rewritten is not None:
            return _Repeated(route, view, body, rewritten)
        offsets = trigger_offsets(body, route.api, self._rules)
        return _Triggered(route, view, body, offsets) if offsets else Unchanged(Reason.CLEAN)

    def _unbounded(self, scanned: _Triggered | _Repeated) -> Rewritten | Unchanged:
        """What an unbounded reading settles: kept for equal bytes, for the caller to check that
        its reading vouches for it."""
        if isinstance(scanned, _Repeated):
            return scanned.rewritten
        return self._rewrite(scanned, Liveness(scanned.route.session_id, active=False), keep=True)

    def _rewrite(
        self, scanned: _Triggered | _Repeated, liveness: Liveness, *, keep: bool
    ) -> Rewritten | Unchanged:
        """What the inactive reading `liveness` settles; kept for `_scan` with `keep` (what an actual
        reading vouches for is not: a later fetch may be vouched for more)."""
        offsets = scanned.offsets if isinstance(scanned, _Triggered) else None
        route, body, rules = scanned.route, scanned.body, self._rules
        try:
            if keep:
                rewritten = self._recent.rewrite(scanned.view, body, route, liveness, rules, offsets=offsets)
            else:
                rewritten = rewrite(body, route, liveness, rules, offsets=offsets)
        except UnexpectedShape as error:
            return Unchanged(Reason.UNEXPECTED_SHAPE, str(error))
        return Unchanged(Reason.CONSISTENT) if rewritten is None else rewritten

    async def _ask(self, route: MessageRoute, request: web.Request) -> Liveness:
        """A fresh reading from the upstream, kept for later fetches while the stream vouches for it.
        The credentials are only worked out here: a kept reading needs none."""
        liveness = await self._probe.read(route.api, route.session_id, self.credentials(request))
        self._tracker.store(route.api, liveness)
        return liveness


def _held_back(unbounded: Rewritten, vouched: Rewritten | Unchanged, liveness: Liveness) -> tuple[Held, ...]:
    """The messages `unbounded` settles and `vouched` does not, each with why `liveness` does not
    vouch for it: what a view left open owes the log."""
    settled = () if isinstance(vouched, Unchanged) else [index for index, _ in vouched.messages.settled]
    held = []
    for index, settlement in unbounded.messages.settled:
        doubt = liveness.doubt(settlement.last_alive)
        if index not in settled and doubt is not None:
            held.append(Held(settlement.changes[0].target.message, doubt, settlement.last_alive))
    return tuple(held)
