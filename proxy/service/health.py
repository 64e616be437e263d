"""The proxy's own routes under `/_settle/`: they are answered here and never reach upstream."""

from __future__ import annotations

import aiohttp
from aiohttp import hdrs, web

from proxy import __version__
from proxy.opencode.other_processes import OTHER_PROCESSES
from proxy.opencode.tracker import TRACKER, LivenessTracker, StreamState
from proxy.relay.upstream import UPSTREAM
from proxy.service.config import SETTINGS
from proxy.service.metrics import CONTENT_TYPE_LATEST, METRICS
from proxy.supervision.supervisor import SUPERVISOR
from proxy.supervision.tool_processes import TOOL_PROCESSES

PREFIX = "/_settle"


async def health(request: web.Request) -> web.Response:
    """Whether the upstream answers, where liveness comes from, which version runs, and whether
    other processes share the upstream's database (`other_processes`: who, or why unknown).

    503 while the upstream is unreachable, so a supervisor can tell; the proxy itself keeps
    serving (and answering 502 on forwarded routes) until it is back.
    """
    settings = request.app[SETTINGS]
    upstream: dict[str, object] = {"url": str(settings.upstream_origin)}
    headers = {hdrs.AUTHORIZATION: settings.authorization} if settings.authorization else {}
    try:
        async with request.app[UPSTREAM].get(
            settings.upstream_origin.with_path("/global/health"),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=settings.connect_timeout),
        ) as answer:
            upstream |= {"reachable": True, "status": answer.status}
    except (aiohttp.ClientError, TimeoutError) as error:
        upstream |= {"reachable": False, "error": str(error) or type(error).__name__}
    body = {
        "status": "ok" if upstream["reachable"] else "upstream unreachable",
        "version": __version__,
        "upstream": upstream,
        "liveness": _liveness_source(request.app[TRACKER]),
        "other_processes": (await request.app[OTHER_PROCESSES].current()).describe(),
        "write_back": str(settings.write_back),
        "dry_run": settings.dry_run,
    }
    if (supervisor := request.app.get(SUPERVISOR)) is not None:
        body["server"] = supervisor.health()
    return web.json_response(body, status=200 if upstream["reachable"] else 503)


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
    """Register the routes; they must come before the catch-all forwarder."""
    app.router.add_get(f"{PREFIX}/health", health)
    app.router.add_get(f"{PREFIX}/metrics", metrics)
    app.router.add_get(f"{PREFIX}/orphans", orphans)
    app.router.add_route("*", PREFIX + "/{tail:.*}", not_found)
