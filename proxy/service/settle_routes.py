"""The proxy's own routes under `/_settle/`: they are answered here and never reach upstream.

`up` answers anyone; the others only whom `DetailsGuard` admits (with a password on the
upstream: who presents it). `SettleRoutes.add_to` is the one place they are registered: a new
`/_settle/NAME` route is a method of `SettleRoutes` named in its `guarded`. Each handler reads
the values it is given and the parts built as the application started (`Running`, which the
assembly's record of them is), never the app nor the assembly."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import aiohttp
from aiohttp import hdrs, web

from proxy.opencode.client import basic_as
from proxy.opencode.dialects import HEALTH_PATHS, route_line
from proxy.opencode.server_line import KnownServer, ServerLine
from proxy.opencode.surveys import OtherProcesses
from proxy.opencode.tracker import LivenessTracker, StreamState
from proxy.relay.errors import NAMELESS, reason_of
from proxy.resume.journal import Journal
from proxy.resume.resuming import Resuming
from proxy.resume.waiting import Continued, NotWaiting
from proxy.service.auth import DetailsGuard, Handler, Lookup
from proxy.service.config import Settings
from proxy.service.metrics import CONTENT_TYPE_LATEST, Metrics
from proxy.supervision.stalls import Stalls
from proxy.supervision.supervisor import Supervisor
from proxy.supervision.tool_processes import ToolProcesses
from proxy.version import VERSION


class Running(Protocol):
    """What the `/_settle` routes read of the parts built as the application starts (the
    assembly's `Started` is one): only these, so the routes depend on no assembly, and none of
    the parts on them."""

    @property
    def session(self) -> aiohttp.ClientSession: ...
    @property
    def line(self) -> ServerLine: ...
    @property
    def tracker(self) -> LivenessTracker: ...
    @property
    def others(self) -> OtherProcesses: ...
    @property
    def tool_processes(self) -> ToolProcesses | None: ...
    @property
    def journal(self) -> Journal: ...
    @property
    def resuming(self) -> Resuming | None: ...
    @property
    def stalls(self) -> Stalls | None: ...


PREFIX = "/_settle"
Answer = dict[str, object]
ANSWER_WITHIN_S = 2.5
"""How long `up` and `health` take at most to answer, whatever the upstream does (one that accepts
connections and never answers included): a health checker's own timeout is seldom longer than 3 s."""
WAIT_S = 2.0
"""How long a reading waits on the upstream: one reading per request (the guard's is the one the
route answers from), so the rest of `ANSWER_WITHIN_S` is left for what the proxy knows itself."""
_SILENT = f"it did not answer within {WAIT_S:g} s (busy, hung, or not an HTTP server)"
_READING = web.RequestKey("upstream reading", dict[str, object])


class SettleRoutes:
    """The proxy's own routes, given the parts they describe. They are registered as the
    application is made, before the parts that need a running loop are built: those are asked of
    `running` as each request comes, never before the application has started."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        running: Callable[[], Running],
        *,
        supervisor: Supervisor | None,
    ) -> None:
        self._settings, self._metrics, self._supervisor = settings, metrics, supervisor
        self._running = running
        self.reading = UpstreamHealth(self._ask, server=self._server_now)
        self.guard = DetailsGuard(
            settings.authorization,
            self._status_of_own_lookup,
            behind_own_auth=settings.auth is not None,
            user=self._line_user,
        )

    def add_to(self, app: web.Application) -> None:
        """Register every route under the prefix, before the catch-all forwarder: the probe (`up`)
        open to anyone, each of `guarded` behind the `DetailsGuard`, so none can be added outside it."""
        app.on_cleanup.append(lambda _: self.reading.close())
        app.router.add_get(f"{PREFIX}/up", self.up)
        for name, handler in self.guarded().items():
            app.router.add_get(f"{PREFIX}/{name}", self.guard.guard(handler))
        app.router.add_post(f"{PREFIX}/resume/{{session_id}}", self.guard.guard(self.proceed))
        app.router.add_route("*", PREFIX + "/{tail:.*}", self.guard.guard(not_found))

    def guarded(self) -> dict[str, Handler]:
        """The proxy's own routes but the probe, by name under the prefix; anything else there is 404."""
        return {
            "health": self.health,
            "metrics": self.metrics,
            "orphans": self.orphans,
            "resume": self.resume,
        }

    async def health(self, request: web.Request) -> web.Response:
        """Whether the upstream answers, where liveness comes from, which version runs, and whether
        other processes share the upstream's database (`other_processes`: who, or why unknown),
        and where the proxy listens (`listening`: the port bound, for `--port 0` too); the calls
        named stalled (`stalled`: each with its holders' pids and programs), and whether calls can
        be judged here at all (`stalls_judged`: the server's tool processes are known).

        503 while the upstream is unreachable, so a supervisor can tell; the proxy itself keeps
        serving (and answering 502 on forwarded routes) until it is back. Under `run`, the server's
        state, with its program's name only: the rest of a command line may hold a secret.
        """
        settings, running = self._settings, self._running()
        upstream = {"url": str(settings.upstream_origin)} | await self._reading(request)
        body = {
            "status": _status(upstream),
            "version": VERSION,
            "upstream": upstream,
            "liveness": _liveness_source(running.tracker),
            "other_processes": (await running.others.current()).describe(),
            "write_back": str(settings.write_back),
            "dry_run": settings.dry_run,
            "stalled": [stall.as_json() for stall in stalls.stalled] if (stalls := running.stalls) else [],
            "stalls_judged": stalls is not None,
        } | _listening(request)
        if (supervisor := self._supervisor) is not None:
            server = supervisor.health()
            command = server.pop("command", None)
            if isinstance(command, list) and command:
                server["program"] = Path(str(command[0])).name
            body["server"] = server
        return web.json_response(body, status=200 if upstream["reachable"] else 503)

    async def up(self, request: web.Request) -> web.Response:
        """Up or down, and nothing else: open to anyone who reaches the port (health checkers that
        hold no password); 503 while the upstream cannot be reached."""
        reachable = (await self._reading(request))["reachable"]
        return web.json_response({"status": "up" if reachable else "down"}, status=200 if reachable else 503)

    async def metrics(self, _: web.Request) -> web.Response:
        """Prometheus text exposition."""
        exposition = self._metrics.exposition()
        return web.Response(body=exposition, headers={hdrs.CONTENT_TYPE: CONTENT_TYPE_LATEST})

    async def orphans(self, _: web.Request) -> web.Response:
        """The processes a dead server left running, each with the session and part that started it."""
        if (supervisor := self._supervisor) is not None:
            found = [orphan.as_json() for orphan in supervisor.orphans()]
            return web.json_response({"tracked": supervisor.subreaper, "orphans": found})
        if (watcher := self._running().tool_processes) is not None:
            found = [orphan.as_json() for orphan in await watcher.left_running()]
            return web.json_response({"tracked": True, "orphans": found})
        reason = "no state database: tool processes are not recorded (the embedded proxy records none)"
        return web.json_response({"tracked": False, "reason": reason, "orphans": []})

    async def resume(self, _: web.Request) -> web.Response:
        """`GET /_settle/resume`: whether resume is on for the server behind the proxy (and, when
        it is not, or no turn can wait for a Continue, why), the sessions it would consider should
        the server die now (`running`), and its recent decisions, oldest first."""
        running = self._running()
        journal, resuming = running.journal, running.resuming
        known = running.line.latest
        refused = resuming.refusal(known.dialect.name) if resuming is not None and known is not None else None
        body: Answer = {
            "enabled": journal.enabled and refused is None,
            "dry_run": journal.dry_run,
            "continue": resuming is not None and refused is None,
            "running": resuming.running() if resuming is not None else [],
            "waiting": resuming.waiting.listed() if resuming is not None else [],
            "decisions": journal.recent(),
        }
        if (reason := self._resume_off(resuming, refused, known)) is not None:
            body["reason"] = reason
        return web.json_response(body)

    def _resume_off(
        self, resuming: Resuming | None, refused: str | None, known: KnownServer | None
    ) -> str | None:
        """Why resume is not on, or no turn waits for a Continue; None when both are so."""
        if resuming is None:
            return "nothing is resumed and no turn waits: there is no state database to keep resumes in"
        if refused is not None and known is not None:
            return f"nothing is resumed and no turn waits on opencode {known.version}: {refused}"
        if not self._settings.resume:
            return "--resume is off: every interrupted turn waits for a Continue"
        return None

    async def proceed(self, request: web.Request) -> web.Response:
        """`POST /_settle/resume/{session_id}`: continue the session's waiting turn, once (202); 404
        when none waits (or the wait ended, or none can wait on this server), 409 when it was
        continued already; each with why."""
        session_id = request.match_info["session_id"]
        running = self._running()
        if (resuming := running.resuming) is None:
            why = "no turn waits here: there is no state database to keep resumes in"
            return _refusal(404, "not_waiting", why)
        known = running.line.latest
        try:
            waiting = await resuming.proceed(session_id, known.dialect.name if known is not None else None)
        except NotWaiting as error:
            return _refusal(404, "not_waiting", str(error))
        except Continued as error:
            return _refusal(409, "continued", str(error))
        return web.json_response({"continuing": waiting.as_json()}, status=202)

    async def _ask(self) -> Answer:
        """Which server the upstream is (asked now, if it is not known), or why that is not known,
        and how the route it was known by answers now (as that line's user). Not known yet, the
        route of the newest line is asked, for whether the upstream answers at all."""
        settings, running = self._settings, self._running()
        line = running.line
        deadline = asyncio.get_running_loop().time() + WAIT_S
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):  # the line goes on asking, for the next reading
                await asyncio.shield(line.known())
        known = line.current
        said = known.describe() if known is not None else {"not_known": line.why_unknown}
        path = known.health_route if known is not None else HEALTH_PATHS[0]
        headers = {hdrs.ACCEPT_ENCODING: "identity"}
        if settings.authorization:
            headers[hdrs.AUTHORIZATION] = basic_as(settings.authorization, route_line(path).username)
        try:
            async with (
                asyncio.timeout_at(deadline),
                running.session.get(settings.upstream_origin.with_path(path), headers=headers) as response,
            ):
                return {"reachable": True, "status": response.status, "route": path} | said
        except TimeoutError:
            return {"reachable": False, "error": _SILENT} | said
        except aiohttp.ClientError as error:
            return {"reachable": False, "error": reason_of(error)} | said

    def _line_user(self) -> str | None:
        """The user the upstream's line fixes (the line is built when the application starts)."""
        return self._running().line.user()

    def _server_now(self) -> object:
        """Which server a reading is of: the one the line knows (none once its stream was lost),
        and under `run` which start of it (a restart the supervisor saw before the stream said so)."""
        known, supervisor = self._running().line.current, self._supervisor
        return (
            id(known) if known is not None else None,
            supervisor.restarts if supervisor is not None else 0,
        )

    async def _reading(self, request: web.Request) -> Answer:
        """The upstream's health for this request: taken once, by the guard or the route, so that
        a request waits on the upstream once at most (a reading the guard waited for the whole of
        `WAIT_S` is too old for the next asker, and the route would wait as long again)."""
        if (answer := request.get(_READING)) is None:
            answer = request[_READING] = await self.reading.answer()
        return answer

    async def _status_of_own_lookup(self, request: web.Request) -> Lookup:
        """The guard's check: how the upstream answered the proxy's own look-up, made with the
        proxy's credentials if it has any."""
        reading = await self._reading(request)
        status, error = reading.get("status"), reading.get("error")
        nameless = error if error in NAMELESS or error == _SILENT else None
        return Lookup(
            status if isinstance(status, int) else None, nameless if isinstance(nameless, str) else None
        )


class UpstreamHealth:
    """How the health route of the upstream's line answers the proxy (with its configured
    credentials, if any), and which server it is (`_asking`), shared by every asker: a reading at
    most `max_age_s` old is answered from, and askers that come while one is taken wait for it.
    So a health checker polling `/_settle/up` (or any `/_settle` route, which the guard checks by
    it) as hard as it likes costs the server one request a second at most. A reading is of one
    server: once `server()` names another (the line forgot the one it knew when its stream was
    lost, or knows a new one), it is taken afresh, so a server that has just died or restarted is
    never answered for from a reading of the one before."""

    def __init__(
        self,
        ask: Callable[[], Awaitable[Answer]],
        *,
        max_age_s: float = 1.0,
        server: Callable[[], object] = lambda: None,
    ) -> None:
        self._ask = ask
        self._server = server
        self.max_age_s = max_age_s
        self.clock: Callable[[], float] = time.monotonic
        self._reading: tuple[float, object, Answer] | None = None
        self._taking: asyncio.Task[Answer] | None = None

    async def answer(self) -> Answer:
        if (reading := self._reading) is not None:
            taken_at, server, answer = reading
            if server == self._server() and self.clock() - taken_at <= self.max_age_s:
                return answer
        if self._taking is None:
            self._taking = asyncio.create_task(self._take(), name="upstream health")
        # Shielded: an asker that goes away must not cancel the reading the others wait on.
        return await asyncio.shield(self._taking)

    async def _take(self) -> Answer:
        taken_at, server = self.clock(), self._server()
        try:
            answer = await self._ask()
        finally:
            self._taking = None
        self._reading = (taken_at, server, answer)
        return answer

    async def close(self) -> None:
        """Application cleanup: a reading under way is not waited for."""
        if (taking := self._taking) is not None:
            taking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await taking


def _listening(request: web.Request) -> Answer:
    """Where the proxy listens, as the socket this request came in on says: the port bound for
    `--port 0` too."""
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    return {"listening": {"host": sockname[0], "port": sockname[1]}} if isinstance(sockname, tuple) else {}


def _status(upstream: Answer) -> str:
    """`ok` only when the server is known and its own health route answered 200."""
    if not upstream["reachable"]:
        return "upstream unreachable"
    if "dialect" not in upstream:
        return "upstream not known yet"
    if upstream.get("status") != 200:
        return f"upstream answered HTTP {upstream.get('status')} on {upstream['route']}"
    return "ok"


def _liveness_source(tracker: LivenessTracker) -> dict[str, object]:
    """Where readings come from; and, if following the stream ever failed in the proxy itself
    (it is started again at once), how often and why it last did."""
    source = "events" if tracker.state is StreamState.FOLLOWING else "asked on every fetch"
    said: dict[str, object] = {"source": source, "event_stream": str(tracker.state)}
    if tracker.last_failure is not None:
        said |= {"restarts": tracker.restarts, "last_failure": tracker.last_failure}
    return said


def _refusal(status: int, error: str, why: str) -> web.Response:
    return web.json_response({"error": error, "message": why}, status=status)


async def not_found(_: web.Request) -> web.Response:
    """Anything else under the prefix is the proxy's, and does not exist."""
    return web.json_response(
        {"error": "not_found", "message": f"no such settle-proxy route under {PREFIX}/"}, status=404
    )
