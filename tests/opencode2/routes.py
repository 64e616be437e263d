"""The routes of the 2.x stand-in, each named with the release or build it imitates.

Every route here is one opencode 2.1.2 serves (its `GET /openapi.json` lists them all), answered as
2.1.2 answered it where that was measured (`@opencode/cli@2.1.2` from npm, run here), else as the
2.x source declares it (`anomalyco/opencode`, `packages/protocol/src/groups/*.ts`, answers in
`packages/server/src/handlers/*.ts`, the commit named per route). The one route 2.1.2 does not
have, `GET /api/health`, answers only as the `v2` branch built from source @2092350c did
(`StandIn.from_source`); 2.1.2 has no `GET /api/session/{id}/question` and no
`POST /api/session/{id}/resume` (measured: empty 404s), and neither has the stand-in.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tests.opencode2 import session_log
from tests.opencode2.auth import refusal
from tests.opencode2.events import accepts_gzip
from tests.opencode2.session_log import Log
from tests.opencode2.shapes import Json, ascending, dumps, error_body, session_not_found
from tests.opencode2.store import Process, Store
from tests.opencode2.turns import Inputs

DEFAULT_LIMIT = 50
"""`DefaultMessagesLimit` (`server/src/handlers/message.ts` @0881eb2d3aa7)."""
WEB_APP = b"<!doctype html><html><head><title>OpenCode</title></head><body><div id=root></div></body></html>"


def _json(value: Any, status: int = 200) -> web.Response:
    return web.json_response(dumps=dumps, data=value, status=status)


def _encode_cursor(message: Json, order: str, direction: str) -> str:
    """base64url of `{id, order, direction}`, unpadded as Node's `base64url` is (`cursor.encode`,
    handlers/message.ts @0881eb2d3aa7)."""
    raw = json.dumps({"id": message["id"], "order": order, "direction": direction}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_cursor(value: str) -> Json | None:
    try:
        decoded = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    except (binascii.Error, ValueError):
        return None
    fine = isinstance(decoded, dict) and isinstance(decoded.get("id"), str)
    if not fine or decoded.get("order") not in ("asc", "desc"):
        return None
    return decoded if decoded.get("direction") in ("previous", "next") else None


def _page(messages: list[Json], order: str, limit: int, cursor: Json | None) -> list[Json]:
    ordered = messages if order == "asc" else list(reversed(messages))
    if cursor is None:
        return ordered[:limit]
    index = next((i for i, m in enumerate(ordered) if m["id"] == cursor["id"]), None)
    if index is None:
        return []
    if cursor["direction"] == "next":
        return ordered[index + 1 : index + 1 + limit]
    return ordered[max(0, index - limit) : index]


class Api:
    """The handlers, over the stand-in's store and process."""

    def __init__(self, store: Store, process: Process, written: Callable[[], None] | None = None) -> None:
        self.store = store
        self.process = process
        self.written = written
        """Called after every POST, once its changes are in the store (a process saves its database)."""
        self.inputs = Inputs(store)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._gate])
        get, post = app.router.add_get, app.router.add_post
        get("/api/info", self.info)
        get("/api/health", self.health)
        get("/api/event", self.events)
        get("/api/session/active", self.active)
        get("/api/session/{session}", self.session)
        get("/api/session/{session}/message", self.messages)
        get("/api/session/{session}/message/{message}", self.message)
        get("/api/session/{session}/permission", self.permissions)
        get("/api/session/{session}/form", self.forms)
        get("/api/experimental/session/{session}/log", self.session_log)
        post("/api/session/{session}/prompt", self.inputs.prompt)
        post("/api/session/{session}/synthetic", self.inputs.synthetic)
        post("/api/session/{session}/interrupt", self.inputs.interrupt)
        app.router.add_route("*", "/{tail:.*}", self.unknown)
        return app

    @web.middleware
    async def _gate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Auth on every API route: 2.1.2 (measured: 401 `{"_tag":"UnauthorizedError","message":
        "Authentication required"}` with `www-authenticate: Basic realm="Secure Area"`; the ways in,
        `tests.opencode2.auth`); then, while the server boots, 503 with `retry-after` (a boot no
        release was seen to answer: 2.1.2 answered within a second; not found in the commits read,
        an assumption kept for the proxy's own boot handling)."""
        if request.path.startswith("/api/") and request.match_info.route.handler != self.unknown:
            if not self.process.auth.allows(request, self.process.port):
                return refusal()
            if self.process.booting:
                body = error_body("ServiceUnavailableError", "Server is starting")
                return web.json_response(dumps=dumps, data=body, status=503, headers={"retry-after": "1"})
        response: web.StreamResponse = await handler(request)
        if request.method == "POST" and self.written is not None:
            self.written()
        # An empty body is never compressed (aiohttp's gzip of an empty 404 cuts the connection).
        compressible = isinstance(response, web.Response) and bool(response.body)
        if self.process.compress and compressible and accepts_gzip(request):
            response.enable_compression(web.ContentCoding.gzip)
        return response

    async def unknown(self, request: web.Request) -> web.Response:
        """No route: 2.1.2 (measured: `GET /api/nothing`, `/api/health`, `/api/session/{id}/question`
        and `POST …/resume` answer 404 with no content-type and no body), or the bundled web app's
        page for a GET (`web_fallback`; 2.1.2 answers `GET /global/health` with its web app's HTML)."""
        if self.process.web_fallback and request.method == "GET":
            return web.Response(body=WEB_APP, content_type="text/html")
        return web.Response(status=404)

    async def session_log(self, request: web.Request) -> web.StreamResponse:
        """`GET /api/experimental/session/{id}/log`: as `Process.session_log` says
        (`tests.opencode2.session_log`, which names the build each variant imitates)."""
        if self.process.session_log is Log.ABSENT:
            return await self.unknown(request)
        if self.process.before_log is not None:
            await self.process.before_log()
        hub = self.store.hub
        return await session_log.serve(
            request, self.process.session_log, self.store.sessions, hub.published, hub.sequences
        )

    async def info(self, request: web.Request) -> web.Response:
        """`GET /api/info` → `ServerInfo`: 2.1.2 (measured: `{"version":"2.1.2","pid":…,"urls":
        ["http://127.0.0.1:P"],"paths":{"tmp":"/tmp/opencode"},"capabilities":{"persistentPty":true}}`);
        404 on the from-source build @2092350c."""
        if self.process.health_route != "info":
            return await self.unknown(request)
        url = f"http://127.0.0.1:{self.process.port}"
        return _json(
            {
                "version": self.process.version,
                "pid": self.process.pid,
                "urls": [url],
                "paths": {"tmp": "/tmp/opencode"},
                "capabilities": {"persistentPty": True},
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        """`GET /api/health` → `{healthy: true, version, pid}`: the `v2` branch built from source
        @2092350c only (measured there: `{"healthy":true,"version":"local","pid":…}`, with `/api/info`
        and `/global/health` 404; /work/shared/OPENCODE.md, "opencode v2 measured"; declared by
        `protocol/src/groups/health.ts` `health.get` @7c3c912ea4ff): `StandIn.from_source()`. 2.1.2
        has no such route (measured: an empty 404), nor does the stand-in unless `health_route` is
        `health`."""
        if self.process.health_route != "health":
            return await self.unknown(request)
        return _json({"healthy": True, "version": self.process.version, "pid": self.process.pid})

    async def events(self, request: web.Request) -> web.StreamResponse:
        """`GET /api/event`: 2.1.2 (measured: `server.connected` first, then `: heartbeat` comments);
        frames and headers as `tests.opencode2.events` names them from source."""
        return await self.store.hub.serve(request, compress=self.process.compress)

    async def active(self, _: web.Request) -> web.Response:
        """`GET /api/session/active` → `{data: {<id>: {type: "running"}}}`: 2.1.2 (measured: `{"data":{}}`
        idle, `{"data":{"ses_…":{"type":"running"}}}` while a turn runs)."""
        return _json({"data": {session: {"type": "running"} for session in sorted(self.store.active)}})

    async def session(self, request: web.Request) -> web.Response:
        """`GET /api/session/{id}` → `{data: Session.Info}`: 2.1.2 (measured: `{"data":{"id","projectID",
        "cost","tokens","time":{"created","updated"},"location":{"directory"}}}`, and 404
        `SessionNotFoundError` for an unknown id); the stand-in's info is cut to `id`, `parentID?`,
        `title`, `time`."""
        session_id = request.match_info["session"]
        if session_id not in self.store.sessions:
            return _json(session_not_found(session_id), 404)
        return _json({"data": self.store.sessions[session_id]})

    async def messages(self, request: web.Request) -> web.Response:
        """`GET /api/session/{id}/message?limit&order&cursor` → `{data, cursor: {previous, next}}`, newest
        first unless `order=asc`: 2.1.2 (measured: an empty session `{"data":[],"cursor":{"previous":
        null,"next":null}}`; base64url cursors `{id, order, direction}`; 400 `InvalidCursorError`
        "Cursor cannot be combined with order" and "Invalid cursor"; a `limit` outside 1..200 or not
        an integer 400 `InvalidRequestError` of kind `Query`; an unknown session 404
        `SessionNotFoundError`); 50 a page (`DefaultMessagesLimit`, handlers/message.ts @0881eb2d3aa7)."""
        session_id, query = request.match_info["session"], request.query
        if session_id not in self.store.messages:
            return _json(session_not_found(session_id), 404)
        if "cursor" in query and "order" in query:
            return _json(error_body("InvalidCursorError", "Cursor cannot be combined with order"), 400)
        cursor = _decode_cursor(query["cursor"]) if "cursor" in query else None
        if "cursor" in query and cursor is None:
            return _json(error_body("InvalidCursorError", "Invalid cursor"), 400)
        limit = query.get("limit", str(DEFAULT_LIMIT))
        if (refused := _limit_refused(limit)) is not None:
            return _json(error_body("InvalidRequestError", refused, kind="Query"), 400)
        order = cursor["order"] if cursor else query.get("order", "desc")
        page = _page(self.store.messages[session_id], order, int(limit), cursor)
        links: dict[str, str | None] = {"previous": None, "next": None}
        if page:
            links = {"previous": _encode_cursor(page[0], order, "previous")}
            links["next"] = _encode_cursor(page[-1], order, "next")
        return _json({"data": page, "cursor": links})

    async def message(self, request: web.Request) -> web.Response:
        """`GET /api/session/{id}/message/{messageID}` → `{data}`: 2.1.2 (measured: `{"data":{…}}`, and 404
        `{"_tag":"MessageNotFoundError","sessionID","messageID","message":"Message not found: <id>"}`)."""
        session_id, message_id = request.match_info["session"], request.match_info["message"]
        if session_id not in self.store.messages:
            return _json(session_not_found(session_id), 404)
        found = next((m for m in self.store.messages[session_id] if m["id"] == message_id), None)
        if found is None:
            message = f"Message not found: {message_id}"
            body = error_body("MessageNotFoundError", message, sessionID=session_id, messageID=message_id)
            return _json(body, 404)
        return _json({"data": found})

    async def permissions(self, request: web.Request) -> web.Response:
        """`GET /api/session/{id}/permission` → `{data: Permission.Request[]}`, the pending ones: 2.1.2
        (measured: `{"data":[]}`, 404 `SessionNotFoundError` for an unknown session; an item's shape
        from its openapi.json `Permission.Request`)."""
        return self._pending(request, self.store.permissions)

    async def forms(self, request: web.Request) -> web.Response:
        """`GET /api/session/{id}/form` → `{data: Form.Info[]}`, the pending forms of the session: 2.1.2
        (measured: `{"data":[]}`, then `{"data":[{"id":"frm_…","sessionID","title","fields":[…]}]}`
        once one was created, 404 `SessionNotFoundError` for an unknown session). 2.1.2's `question`
        tool asks through a form (`question_form`). Not served as the from-source build
        (`Process.form_route`)."""
        if not self.process.form_route:
            return await self.unknown(request)
        return self._pending(request, self.store.forms)

    def _pending(self, request: web.Request, pending: dict[str, list[Json]]) -> web.Response:
        session_id = request.match_info["session"]
        if session_id not in self.store.sessions:
            return _json(session_not_found(session_id), 404)
        return _json({"data": pending.get(session_id, [])})


def _limit_refused(limit: str) -> str | None:
    """2.1.2's words for a `limit` it refuses (measured, `limit=abc`, `0`, `201`)."""
    if not limit.lstrip("-").isdigit():
        return 'Expected an integer\n  at ["limit"]'
    if int(limit) < 1:
        return 'Expected a value greater than or equal to 1\n  at ["limit"]'
    if int(limit) > 200:
        return 'Expected a value less than or equal to 200\n  at ["limit"]'
    return None


def permission_request(session_id: str, action: str, resources: list[str], call: tuple[str, str]) -> Json:
    """`Permission.Request {id: per_…, sessionID, action, resources, source: {type: "tool", messageID,
    id}}` (2.1.2's openapi.json `Permission.Request`, `Permission.Source`)."""
    source = {"type": "tool", "messageID": call[0], "id": call[1]}
    return {
        "id": ascending("per"),
        "sessionID": session_id,
        "action": action,
        "resources": resources,
        "source": source,
    }


def form_request(session_id: str, title: str, metadata: Json | None = None) -> Json:
    """`Form.Info` as 2.1.2 lists one (measured, after `POST /api/session/{id}/form {"title":"Sign in",
    "fields":[{"key":"ok","type":"boolean","title":"Go on?"}]}`: `{"id":"frm_…","sessionID","title",
    "fields":[{"key":"ok","title":"Go on?","type":"boolean"}]}`; `metadata` only when given)."""
    form: Json = {"id": ascending("frm"), "sessionID": session_id, "title": title}
    if metadata is not None:
        form["metadata"] = metadata
    form["fields"] = [{"key": "ok", "title": "Go on?", "type": "boolean"}]
    return form


def question_form(session_id: str, call: tuple[str, str]) -> Json:
    """The form 2.1.2's `question` tool asks through (read from the JavaScript bundled in its binary,
    `opencode.tool.question`: `ask({sessionID, title: "Questions", metadata: {kind: "question", tool:
    {messageID, id}}, fields})`): 2.1.2 lists what the tool asks among the session's forms."""
    metadata = {"kind": "question", "tool": {"messageID": call[0], "id": call[1]}}
    return form_request(session_id, "Questions", metadata)
