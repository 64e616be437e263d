"""The `settle` addon: message views are made to agree with the server's liveness.

A body is only parsed when a byte scan finds a rule's trigger in it (for the built-in rules an
open tool status, or an unfinished assistant message: a turn cut while the model was writing
has no tool), and only when the session is inactive by a reading that was current when the
upstream answered (the body is what the server had then): one kept from the event stream (no
event about the session since it was taken), looked up once, with the answer's headers, or
else a fresh one asked of the upstream. A reading vouches only for what was last alive well
before it (the rules' `Liveness.vouches_for`, in the server's clock): when a kept one cannot
vouch for all that a later reading would settle, a fresh one is asked, and what even that one
cannot vouch for is left open (and decided afresh on the next fetch). Any doubt leaves the
body exactly as the upstream sent it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import ClassVar

from aiohttp import hdrs, web
from prometheus_client import Counter

from proxy.addons.context import SettleContext
from proxy.addons.routing import message_view, route_of
from proxy.opencode.liveness import LivenessUnknown
from proxy.opencode.routes import MessageRoute
from proxy.opencode.server_line import TOLD_1_18, ServerLine
from proxy.opencode.tracker import LivenessTracker
from proxy.relay import codings
from proxy.relay.bounded import Bounded
from proxy.relay.hooks import Addon, Flow, FlowKey
from proxy.views.message_views import Held, MessageViews, Reason, StreamWord, Unchanged
from proxy.views.rewrite import Rewritten
from rules import DEFAULT_RULES, Api, Rule

log = logging.getLogger(__name__)

SETTLED_HEADER = "X-Settle-Settled"
RULES_HEADER = "X-Settle-Rules"
_VALIDATORS = (hdrs.ETAG, hdrs.LAST_MODIFIED, "Content-MD5")
REPORTED = 1_000
"""How many (session, problem) pairs are remembered as said: past it, one may be said again."""
_WORD = FlowKey[StreamWord]("settle: the stream's word on the view")
"""The stream's word on a view answered 200, taken with its headers: it decides whether the
body is read, and `response` settles by it."""


class Settle(Addon):
    """Rewrite orphaned tool parts in message views of inactive sessions: the message views
    (`proxy.views.message_views`) decide what goes out; this owns what is HTTP: which bodies are
    read, their codings, the server's line, the headers, the log lines and counts, and handing a
    settlement to the write-back.

    With `dry_run` it decides, logs and counts exactly as it would, but sends the body
    unchanged and schedules no write-back.
    """

    name: ClassVar[str] = "settle"

    def __init__(
        self,
        ctx: SettleContext,
        *,
        tracker: LivenessTracker,
        rules: Sequence[Rule] = DEFAULT_RULES,
        server: ServerLine | None = None,
    ) -> None:
        self.scope = message_view
        self._views = MessageViews(tracker, ctx.probe, rules)
        self._server = server or ServerLine.told(TOLD_1_18)
        self._metrics = ctx.metrics
        self._write_back = ctx.write_back
        self._settled = ctx.views
        self._dry_run = ctx.dry_run
        self._reported: Bounded[tuple[str, str], None] = Bounded(REPORTED)
        self._counters: dict[tuple[str, Api], Counter] = {}

    async def request_headers(self, flow: Flow) -> None:
        if _route(flow) is not None:
            # The body must be readable to be checked; an uncompressed answer costs nothing on loopback.
            flow.upstream_headers[hdrs.ACCEPT_ENCODING] = "identity"

    async def response_headers(self, flow: Flow) -> None:
        route = _route(flow)
        if route is None or flow.status != 200:
            return
        word = flow[_WORD] = self._views.stream_word(route, flow.request.raw_path)
        is_json = flow.response_headers.get(hdrs.CONTENT_TYPE, "").startswith("application/json")
        # A body with nothing to check goes out as it arrives, at any size: against the real server a
        # list's pieces come over a millisecond, and holding them only delays the client.
        if not is_json or word.unchanged:
            return
        absent = codings.missing(_codings(flow))
        if absent:
            log.warning(
                "%s answered in %s, which cannot be decoded here (not installed): passed on unchecked",
                route.session_id,
                ", ".join(absent),
            )
        else:
            flow.read_whole(by=self.name)

    async def response(self, flow: Flow) -> None:
        """Checked once each, in order of cost: the stream's word (taken with the headers), the
        body's bytes, a reading."""
        route, word = _route(flow), flow.get(_WORD)
        if route is None or word is None:
            return
        body = None if word.unchanged else self._decoded(route, flow)
        if body is None or (route := await self._in_dialect(route, flow.request)) is None:
            return
        try:
            settled = await self._views.settle(word, route, body, flow.request)
        except LivenessUnknown as error:
            log.warning("liveness of %s unknown, body passed on unchanged: %s", route.session_id, error)
            return
        for message in settled.held:
            self._report_held(route, message)
        if isinstance(settled.outcome, Unchanged):
            if settled.outcome.reason is Reason.UNEXPECTED_SHAPE:
                self._report_once(route, settled.outcome.detail)
            return
        self._record(route, settled.outcome, log_it=not settled.repeated)
        if not self._dry_run:
            self._deliver(flow, route, settled.outcome)

    async def _in_dialect(self, route: MessageRoute, request: web.Request) -> MessageRoute | None:
        """The route in the shape of the server's line; None (the body goes out as sent) while the
        server is not known (its line said so once), or for a route its line does not serve."""
        known = self._server.current or await self._server.known(self._views.credentials(request))
        if known is None:
            return None
        http = known.dialect.runtime(route.api)
        if http is None:
            self._report_once(route, f"the {known.dialect.name} line serves no {route.api} message views")
            return None
        return dataclasses.replace(route, runtime=http.rules)

    def _deliver(self, flow: Flow, route: MessageRoute, rewritten: Rewritten) -> None:
        """The settled body to the client, in the codings it takes and with the headers that say
        what changed; to the write-back, which makes it durable if the session stays idle; and to
        whoever tells the client streams (`SettledViews`)."""
        _send(flow, rewritten.body)
        _label(flow, rewritten)
        if self._write_back is not None:
            credentials = self._views.credentials(flow.request)
            self._write_back.schedule(route.api, route.session_id, credentials, _targets(rewritten))
        targets = frozenset(change.target for change in rewritten.messages.changes)
        self._settled.settled(route.api, route.session_id, targets)

    def _decoded(self, route: MessageRoute, flow: Flow) -> bytes | None:
        """The body with its content codings undone, or None (logged) when they do not decode."""
        try:
            return codings.decode(flow.body, _codings(flow), limit=flow.max_body)
        except codings.CodingError as error:
            log.warning("%s: body passed on unchecked: %s", route.session_id, error)
            return None

    def _record(self, route: MessageRoute, rewritten: Rewritten, *, log_it: bool) -> None:
        """One count per change, and one structured log line when it is decided (not when the
        same bytes are settled again for a client polling the view)."""
        verb = "would settle" if self._dry_run else "settled"
        for change in rewritten.messages.changes:
            if log_it:
                target = change.target
                fields = {
                    "session": route.session_id,
                    "message": target.message,
                    "part": target.part,
                    "tool": target.tool,
                    "rule": change.rule,
                    "api": str(route.api),
                    "why": change.reason,
                }
                log.info("%s %s", verb, change.rule, extra={"fields": fields})
            self._rewrites(change.rule, route.api).inc()

    def _rewrites(self, rule: str, api: Api) -> Counter:
        """The rewrite counter of `rule` in `api`, labelled once (a look-up by label values is
        a visible share of a settled poll)."""
        key = (rule, api)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = self._metrics.rewrites.labels(
                rule, api, str(not self._dry_run).lower()
            )
        return counter

    def _report_held(self, route: MessageRoute, held: Held) -> None:
        """One line per message and doubt: a view left open is fetched again, and decided afresh."""
        if not self._first_time(route, f"{held.message} {held.doubt.name}"):
            return
        fields = {
            "session": route.session_id,
            "message": held.message,
            "api": str(route.api),
            "why": str(held.doubt),
            "last_alive": held.last_alive,
        }
        log.info("left message %s open: %s", held.message, held.doubt, extra={"fields": fields})

    def _report_once(self, route: MessageRoute, problem: str) -> None:
        if self._first_time(route, problem):
            log.warning("session %s: %s; body passed on unchanged", route.session_id, problem)

    def _first_time(self, route: MessageRoute, problem: str) -> bool:
        """Whether `problem` of the session is said for the first time (it is remembered as said)."""
        key = (route.session_id, problem)
        if key in self._reported:
            return False
        self._reported[key] = None
        return True


def _targets(rewritten: Rewritten) -> set[str]:
    """What the write-back may touch: each part or call settled here (or message, for a change
    to the message itself)."""
    return {change.target.key for change in rewritten.messages.changes}


def _label(flow: Flow, rewritten: Rewritten) -> None:
    """The headers of a settled body: what was settled, by which rules, and no validator of the
    upstream's bytes (they are not these)."""
    for name in _VALIDATORS:
        flow.response_headers.popall(name, None)
    flow.response_headers[SETTLED_HEADER] = str(rewritten.messages.settled_parts)
    flow.response_headers[RULES_HEADER] = ",".join(rewritten.messages.rules)


def _codings(flow: Flow) -> list[str]:
    if hdrs.CONTENT_ENCODING not in flow.response_headers:  # as opencode answers: asked for identity
        return []
    return codings.content_codings(flow.response_headers.getall(hdrs.CONTENT_ENCODING))


def _send(flow: Flow, body: bytes) -> None:
    """Send the settled `body` in the codings the upstream's was in if the client takes them,
    else as identity, with the headers saying which. Which one depends on the request's
    `Accept-Encoding`, so caches are told so."""
    applied = _codings(flow)
    if not applied:
        flow.body = body
        return
    if codings.accepts(flow.request.headers.get(hdrs.ACCEPT_ENCODING), applied):
        flow.body = codings.encode(body, applied)
    else:
        flow.body = body
        flow.response_headers.popall(hdrs.CONTENT_ENCODING)
    vary = flow.response_headers.getall(hdrs.VARY, ())
    if not {token.strip().lower() for value in vary for token in value.split(",")} & {"*", "accept-encoding"}:
        flow.response_headers.add(hdrs.VARY, hdrs.ACCEPT_ENCODING)


def _route(flow: Flow) -> MessageRoute | None:
    return route_of(flow).messages
