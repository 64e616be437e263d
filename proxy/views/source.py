"""Where a message view's liveness comes from: kept, asked, and bounded by what it can vouch for.

A reading is kept from the event stream (the tracker) while no event about its session has
arrived, or asked of the upstream (the probe) and then kept likewise. Either is bounded by the
other processes on the server's database, whose tools the server cannot vouch for; and a
reading vouches only for what was last alive well before it (`rules.Liveness.vouches_for`,
`FRESH_MARGIN_MS` in the server's clock), so when a kept one is too close, a fresh one is asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from proxy.opencode.client import Credentials
from proxy.opencode.liveness import LivenessProbe
from proxy.opencode.routes import MessageRoute
from proxy.opencode.tracker import LivenessTracker
from rules import Doubt, Liveness

__all__ = ["LivenessSource", "Reading"]


@dataclass(frozen=True, slots=True)
class Reading:
    """A reading bounded by the other processes, and whether it was just asked (so is as fresh
    as any could be) or kept."""

    liveness: Liveness
    asked: bool


class LivenessSource:
    """The one place the view path reads liveness from; it raises `LivenessUnknown` when in doubt."""

    def __init__(self, tracker: LivenessTracker, probe: LivenessProbe) -> None:
        self._tracker = tracker
        self._probe = probe

    def credentials(self, request: web.Request) -> Credentials:
        """What look-ups made on behalf of `request` authenticate with."""
        return self._probe.credentials(request)

    def kept(self, route: MessageRoute) -> Liveness | None:
        """The reading the stream still vouches for, unbounded (None: one must be asked)."""
        kept = self._tracker.cached(route.api, route.session_id)
        return None if kept is None else kept.liveness

    def known_unchanged(self, route: MessageRoute, view: str, kept: Liveness | None) -> bool:
        """Whether the stream vouches there is nothing to settle, so the body goes out unscanned:
        the session is active, or this view showed no trigger and nothing happened since."""
        return (kept is not None and kept.active) or self._tracker.known_clean(route.session_id, view)

    def mark_clean(self, route: MessageRoute, view: str) -> None:
        self._tracker.mark_clean(route.session_id, view)

    async def reading(self, route: MessageRoute, request: web.Request, kept: Liveness | None) -> Reading:
        """`kept` bounded, or else a fresh reading asked on behalf of `request`."""
        if kept is not None:
            return Reading(await self._probe.bounded(kept), asked=False)
        return Reading(await self._ask(route, request), asked=True)

    async def vouching(
        self, route: MessageRoute, request: web.Request, reading: Reading, last_alive: int
    ) -> Liveness:
        """The reading to judge what was last alive at `last_alive` by: `reading` unless it was kept
        and is too close to `last_alive`, when a fresh one can vouch for more."""
        if reading.asked or reading.liveness.doubt(last_alive) is not Doubt.TOO_RECENT:
            return reading.liveness
        return await self._ask(route, request)

    async def _ask(self, route: MessageRoute, request: web.Request) -> Liveness:
        """A fresh reading from the upstream, kept for later fetches while the stream vouches for it.
        The credentials are only worked out here: a kept reading needs none."""
        liveness = await self._probe.read(route.api, route.session_id, self.credentials(request))
        self._tracker.store(route.api, liveness)
        return liveness
