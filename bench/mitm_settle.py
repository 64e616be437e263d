"""The settle rule as a mitmproxy addon: what a user would write instead of settle-proxy.

The benchmark's `mitmproxy` target runs it (see `start_mitmproxy` in bench/targets.py):

    mitmdump --mode reverse:http://127.0.0.1:4096 --listen-host 127.0.0.1 --listen-port 4097 \
        -q --set flow_detail=0 -s bench/mitm_settle.py

It needs mitmproxy and pydantic (for `rules`) in mitmdump's environment; it puts the repository
root on `sys.path` itself. It does the straightforward thing, on mitmproxy's own event loop:

- `responseheaders`: every response that is not a message view is streamed (SSE, downloads),
  as settle-proxy streams it; message views are buffered, which mitmproxy needs to change them.
- `response`: for a GET message view (`proxy.opencode.routes.match_message_route`) answered 200 with
  JSON whose bytes mention an open tool status, ask the upstream, after the body arrived,
  whether the session is active (v2 `/api/session/active`; v1 `/session/{id}` for its
  directory, remembered, then `/session/status?directory=`), with urllib in a worker thread
  and the client's own `Authorization`. If it is not, parse the whole body with `json.loads`,
  settle it with `rules.settle_view` and serialize it again with `json.dumps`. A failed
  look-up or an unexpected body leaves the response as it is.
- `request`: answers `/_settle/metrics` itself with the two counters the benchmark runner reads
  from every rewriting target (client requests and liveness look-ups, under settle-proxy's
  metric names), so its report can show upstream requests per client request here too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from mitmproxy import http  # type: ignore[import-not-found, unused-ignore]

REPO = Path(__file__).resolve().parents[1]
METRICS_PATH = "/_settle/metrics"
LIVENESS_TIMEOUT_S = 5.0
LOOKUP_ERRORS = (OSError, ValueError, TimeoutError, KeyError, TypeError)

log = logging.getLogger(__name__)


def _make_importable() -> None:
    """Put the repository on the path. `proxy` imports its application lazily, so
    `proxy.opencode.routes` (which needs nothing but `rules`) imports without aiohttp's stack."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


_make_importable()

from proxy.opencode.routes import MessageRoute, match_message_route  # noqa: E402
from proxy.opencode.vocabulary import v1_status_active  # noqa: E402
from rules import OPEN_STATUSES, Api, Liveness, UnexpectedShape, settle_view  # noqa: E402

_NEEDLES = {
    api: tuple(f'"{status}"'.encode() for status in statuses) for api, statuses in OPEN_STATUSES.items()
}
# Liveness look-ups go straight to the upstream, whatever *_proxy variables the environment has.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def message_route(flow: http.HTTPFlow) -> MessageRoute | None:
    return match_message_route(flow.request.method, flow.request.path.partition("?")[0])


def mentions_open_status(body: bytes, api: Api) -> bool:
    return any(needle in body for needle in _NEEDLES[api])


def get_json(url: str, authorization: str | None) -> Any:
    """GET `url` and parse its JSON (blocking: run it in a thread)."""
    request = urllib.request.Request(url, headers={"Authorization": authorization} if authorization else {})
    with _OPENER.open(request, timeout=LIVENESS_TIMEOUT_S) as answer:
        return json.loads(answer.read())


def is_busy(status: Any) -> bool:
    """v1 lists busy and retrying sessions; anything listed and not idle is alive."""
    return v1_status_active(status) is not False


class SettleAddon:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()
        self.lookups: Counter[str] = Counter()
        self.directories: dict[str, str] = {}

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.request.path.partition("?")[0] == METRICS_PATH:
            flow.response = http.Response.make(
                200, self.exposition(), {"Content-Type": "text/plain; version=0.0.4"}
            )

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None and message_route(flow) is None:
            flow.response.stream = True

    async def response(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        path = flow.request.path.partition("?")[0]
        if response is None or path == METRICS_PATH:
            return
        self.requests[flow.request.method, response.status_code] += 1
        route = message_route(flow)
        content_type = response.headers.get("content-type", "")
        if route is None or response.status_code != 200 or "json" not in content_type:
            return
        body = response.content
        if not body or not mentions_open_status(body, route.api):
            return
        try:
            active = await self.active(flow, route)
        except LOOKUP_ERRORS as error:
            log.error(
                "liveness of %s unknown, left as is: %s: %s", route.session_id, type(error).__name__, error
            )
            return
        try:
            settled = settle_view(
                json.loads(body), route.api, Liveness(route.session_id, active), single=route.single
            )
        except (ValueError, UnexpectedShape) as error:
            log.error("%s left as is: %s", path, error)
            return
        if settled is None:
            return
        response.content = json.dumps(settled.document, separators=(",", ":"), ensure_ascii=False).encode()
        response.headers["X-Settle-Settled"] = str(settled.messages.settled_parts)

    async def active(self, flow: http.HTTPFlow, route: MessageRoute) -> bool:
        """Whether the upstream lists the session as active, asked now."""
        parts = urllib.parse.urlsplit(flow.request.url)
        base = f"{parts.scheme}://{parts.netloc}"
        authorization = flow.request.headers.get("authorization")
        session = route.session_id
        if route.api is Api.V2:
            answer = await self.lookup(route.api, base + "/api/session/active", authorization)
            return session in answer["data"]
        directory = self.directories.get(session)
        if directory is None:
            info = await self.lookup(
                route.api, f"{base}/session/{urllib.parse.quote(session)}", authorization
            )
            directory = self.directories[session] = str(info["directory"])
        query = urllib.parse.urlencode({"directory": directory})
        statuses = await self.lookup(route.api, f"{base}/session/status?{query}", authorization)
        return is_busy(statuses[session]) if session in statuses else False

    async def lookup(self, api: Api, url: str, authorization: str | None) -> Any:
        self.lookups[api.value] += 1
        return await asyncio.to_thread(get_json, url, authorization)

    def exposition(self) -> bytes:
        """The counters in the Prometheus text format, under the names settle-proxy uses."""
        lines = [
            f'settle_proxy_requests_total{{method="{method}",status="{status}"}} {count}'
            for (method, status), count in self.requests.items()
        ]
        lines += [
            f'settle_proxy_liveness_requests_total{{api="{api}"}} {n}' for api, n in self.lookups.items()
        ]
        return ("\n".join(lines) + "\n").encode()


addons = [SettleAddon()]
