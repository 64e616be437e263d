"""The proxy's own routes under `/_settle/`: they are answered here and never reach upstream.

`up` answers anyone; the others only whom `DetailsGuard` admits (with a password on the
upstream: who presents it)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from aiohttp import hdrs, web

from proxy import __version__
from proxy.opencode.dialects import HEALTH_PATHS
from proxy.opencode.server_line import SERVER_LINE
from proxy.opencode.surveys import OTHER_PROCESSES
from proxy.opencode.tracker import TRACKER, LivenessTracker, StreamState
from proxy.relay.upstream import UPSTREAM
from proxy.service.auth import DETAILS_GUARD, DetailsGuard
from proxy.service.config import SETTINGS
from proxy.service.metrics import CONTENT_TYPE_LATEST, METRICS
from proxy.supervision.supervisor import SUPERVISOR
from proxy.supervision.tool_processes import TOOL_PROCESSES

PREFIX = "/_settle"
_UPSTREAM_ANSWER = web.RequestKey("settle_upstream_answer", dict[str, object])


async def health(request: web.Request) -> web.Response:
    """Whether the upstream answers, where liveness comes from, which version runs, and whether
    other processes share the upstream's database (`other_processes`: who, or why unknown).

    503 while the upstream is unreachable, so a supervisor can tell; the proxy itself keeps
    serving (and answering 502 on forwarded routes) until it is back. Under `run`, the server's
    state, with its program's name only: the rest of a command line may hold a secret.
    """
    settings = request.app[SETTINGS]
    upstream = {"url": str(settings.upstream_origin)} | await _upstream_answer(request)
    body = {
        "status": _status(upstream),
        "version": __version__,
        "upstream": upstream,
        "liveness": _liveness_source(request.app[TRACKER]),
        "other_processes": (await request.app[OTHER_PROCESSES].current()).describe(),
        "write_back": str(settings.write_back),
        "dry_run": settings.dry_run,
    }
    if (supervisor := request.app.get(SUPERVISOR)) is not None:
        server = supervisor.health()
        command = server.pop("command", None)
        if isinstance(command, list) and command:
            server["program"] = Path(str(command[0])).name
        body["server"] = server
    return web.json_response(body, status=200 if upstream["reachable"] else 503)


async def up(request: web.Request) -> web.Response:
    """Up or down, and nothing else: open to anyone who reaches the port (health checkers that
    hold no password); 503 while the upstream cannot be reached."""
    reachable = (await _upstream_answer(request))["reachable"]
    return web.json_response({"status": "up" if reachable else "down"}, status=200 if reachable else 503)


def _status(upstream: dict[str, object]) -> str:
    """`ok` only when the server is known and its own health route answered 200."""
    if not upstream["reachable"]:
        return "upstream unreachable"
    if "dialect" not in upstream:
        return "upstream not known yet"
    if upstream.get("status") != 200:
        return f"upstream answered HTTP {upstream.get('status')} on {upstream['route']}"
    return "ok"


async def _upstream_answer(request: web.Request) -> dict[str, object]:
    """How the health route of the upstream's line answers the proxy (with its configured
    credentials, if any), asked once per request; which server it is (asked now, if it is not
    known), or why that is not known. Not known yet, the route of the newest line is asked (for
    whether the upstream answers at all)."""
    if _UPSTREAM_ANSWER in request:
        return request[_UPSTREAM_ANSWER]
    settings, line = request.app[SETTINGS], request.app.get(SERVER_LINE)
    known = await line.known() if line is not None else None
    said = known.describe() if known is not None else {"not_known": line.why_unknown if line else None}
    path = known.dialect.health_path if known is not None else HEALTH_PATHS[0]
    headers = {hdrs.AUTHORIZATION: settings.authorization} if settings.authorization else {}
    answer: dict[str, object]
    try:
        async with request.app[UPSTREAM].get(
            settings.upstream_origin.with_path(path),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=settings.connect_timeout),
        ) as response:
            answer = {"reachable": True, "status": response.status, "route": path} | said
    except (aiohttp.ClientError, TimeoutError) as error:
        answer = {"reachable": False, "error": str(error) or type(error).__name__} | said
    request[_UPSTREAM_ANSWER] = answer
    return answer


async def _status_without_credentials(request: web.Request) -> int | None:
    """The guard's check; asked only when the proxy has no credentials, so its own look-up has none."""
    status = (await _upstream_answer(request)).get("status")
    return status if isinstance(status, int) else None


def _liveness_source(tracker: LivenessTracker) -> dict[str, object]:
    """Where readings come from; and, if following the stream ever failed in the proxy itself
    (it is started again at once), how often and why it last did."""
    source = "events" if tracker.state is StreamState.FOLLOWING else "asked on every fetch"
    said: dict[str, object] = {"source": source, "event_stream": str(tracker.state)}
    if tracker.last_failure is not None:
        said |= {"restarts": tracker.restarts, "last_failure": tracker.last_failure}
    return said


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text exposition."""
    return web.Response(
        body=request.app[METRICS].exposition(), headers={hdrs.CONTENT_TYPE: CONTENT_TYPE_LATEST}
    )


async def orphans(request: web.Request) -> web.Response:
    """The processes a dead server left running, each with the session and part that started it."""
    if (supervisor := request.app.get(SUPERVISOR)) is not None:
        found = [orphan.as_json() for orphan in supervisor.orphans()]
        return web.json_response({"tracked": supervisor.subreaper, "orphans": found})
    if (watcher := request.app.get(TOOL_PROCESSES)) is not None:
        found = [orphan.as_json() for orphan in await watcher.left_running()]
        return web.json_response({"tracked": True, "orphans": found})
    reason = "no state database: tool processes are not recorded (the embedded proxy records none)"
    return web.json_response({"tracked": False, "reason": reason, "orphans": []})


async def not_found(_: web.Request) -> web.Response:
    """Anything else under the prefix is the proxy's, and does not exist."""
    return web.json_response(
        {"error": "not_found", "message": f"no such settle-proxy route under {PREFIX}/"}, status=404
    )


def add_routes(app: web.Application) -> None:
    """Register the routes; they must come before the catch-all forwarder. Every one but the
    probe (`up`) is behind the `DetailsGuard`."""
    settings = app[SETTINGS]
    details = app[DETAILS_GUARD] = DetailsGuard(
        settings.authorization, _status_without_credentials, behind_own_auth=settings.auth is not None
    )
    guard = details.guard
    app.router.add_get(f"{PREFIX}/up", up)
    app.router.add_get(f"{PREFIX}/health", guard(health))
    app.router.add_get(f"{PREFIX}/metrics", guard(metrics))
    app.router.add_get(f"{PREFIX}/orphans", guard(orphans))
    app.router.add_route("*", PREFIX + "/{tail:.*}", guard(not_found))
