"""The routes of the 2.x stand-in, each as the 2.x source declares and answers it.

Declarations: `packages/protocol/src/groups/{server,health,session,message,permission,question}.ts`;
answers: `packages/server/src/handlers/{server,session,message}.ts`. Commits per route below, and in
/work/notes/opencode2x-facts.md.
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
        get("/api/session/{session}/question", self.questions)
        get("/api/session/{session}/form", self.forms)
        get("/api/experimental/session/{session}/log", self.session_log)
        post("/api/session/{session}/prompt", self.inputs.prompt)
        post("/api/session/{session}/synthetic", self.inputs.synthetic)
        post("/api/session/{session}/resume", self.inputs.resume)
        post("/api/session/{session}/interrupt", self.inputs.interrupt)
        app.router.add_route("*", "/{tail:.*}", self.unknown)
        return app

    @web.middleware
    async def _gate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Auth on every API route (`authorizationLayer` @13a9aa255669), then, while the server boots,
        503 with `retry-after` (../shared/OPENCODE.md; not found in the commits read: an assumption)."""
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
        """No route: the Effect router's empty 404, or the bundled web app's page for a GET."""
        if self.process.web_fallback and request.method == "GET":
            return web.Response(body=WEB_APP, content_type="text/html")
        return web.Response(status=404)

    async def session_log(self, request: web.Request) -> web.StreamResponse:
        if self.process.session_log is Log.ABSENT:
            return await self.unknown(request)
        if self.process.before_log is not None:
            await self.process.before_log()
        return await session_log.serve(
            request, self.process.session_log, self.store.sessions, self.store.hub.published
        )

    async def info(self, request: web.Request) -> web.Response:
        """`GET /api/info` → `ServerInfo {version, pid, urls, paths}` (`protocol/src/groups/server.ts`
        @51819a10a412, handler `server/src/handlers/server.ts` @665f64395a75)."""
        if self.process.health_route != "info":
            return await self.unknown(request)
        url = f"http://127.0.0.1:{self.process.port}"
        paths = {"tmp": "/tmp/opencode", "home": "/home/user"}
        return _json(
            {"version": self.process.version, "pid": self.process.pid, "urls": [url], "paths": paths}
        )

    async def health(self, request: web.Request) -> web.Response:
        """Early 2.0's `GET /api/health` → `{healthy: true, version, pid}` (`protocol/src/groups/health.ts`
        `health.get` @7c3c912ea4ff; `packages/server/src/process.ts` `start` @02ce4a330f33 asks it
        for readiness). Measured on the `v2` branch built from source @2092350c: `{"healthy":true,
        "version":"local","pid":…}`, with `/api/info` and `/global/health` 404
        (/work/shared/OPENCODE.md, "opencode v2 measured"): `StandIn.from_source()`."""
        if self.process.health_route != "health":
            return await self.unknown(request)
        return _json({"healthy": True, "version": self.process.version, "pid": self.process.pid})

    async def events(self, request: web.Request) -> web.StreamResponse:
        return await self.store.hub.serve(request, compress=self.process.compress)

    async def active(self, _: web.Request) -> web.Response:
        """`GET /api/session/active` → `{data: {<id>: {type: "running"}}}` (`session.active`,
        `protocol/src/groups/session.ts` @01fd0c8548b2; handler `server/src/handlers/session.ts`
        @01f42103c20d)."""
        return _json({"data": {session: {"type": "running"} for session in sorted(self.store.active)}})

    async def session(self, request: web.Request) -> web.Response:
        """`GET /api/session/{id}` → `{data: Session.Info}` (`session.get` @01fd0c8548b2); the info is
        cut to `id`, `parentID?`, `title`, `time`."""
        session_id = request.match_info["session"]
        if session_id not in self.store.sessions:
            return _json(session_not_found(session_id), 404)
        return _json({"data": self.store.sessions[session_id]})

    async def messages(self, request: web.Request) -> web.Response:
        """`GET /api/session/{id}/message?limit&order&cursor` → `{data, cursor: {previous?, next?}}`,
        newest first unless `order=asc`, 50 a page (`session.messages`, `protocol/src/groups/message.ts`
        @17dce3a11c99; `MessageHandler`, `server/src/handlers/message.ts` @0881eb2d3aa7)."""
        session_id, query = request.match_info["session"], request.query
        if session_id not in self.store.messages:
            return _json(session_not_found(session_id), 404)
        if "cursor" in query and "order" in query:
            return _json(error_body("InvalidCursorError", "Cursor cannot be combined with order"), 400)
        cursor = _decode_cursor(query["cursor"]) if "cursor" in query else None
        if "cursor" in query and cursor is None:
            return _json(error_body("InvalidCursorError", "Invalid cursor"), 400)
        limit = query.get("limit", str(DEFAULT_LIMIT))
        if not limit.isdigit() or not 1 <= int(limit) <= 200:
            return _json(error_body("InvalidRequestError", f"Invalid limit: {limit}"), 400)
        order = cursor["order"] if cursor else query.get("order", "desc")
        page = _page(self.store.messages[session_id], order, int(limit), cursor)
        links = {}
        if page:
            links = {"previous": _encode_cursor(page[0], order, "previous")}
            links["next"] = _encode_cursor(page[-1], order, "next")
        return _json({"data": page, "cursor": links})

    async def message(self, request: web.Request) -> web.Response:
        """`GET /api/session/{id}/message/{messageID}` → `{data}` (`session.message`, session group,
        idx:70927739939)."""
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
        """`GET /api/session/{id}/permission` → `{data: PermissionV2.Request[]}`, the pending ones
        (`session.permission.list`, `protocol/src/groups/permission.ts` @047544f021a0)."""
        return self._pending(request, self.store.permissions)

    async def questions(self, request: web.Request) -> web.Response:
        """`GET /api/session/{id}/question` → `{data: Question.Request[]}` (`session.question.list`,
        `protocol/src/groups/question.ts` @1652328ecae0)."""
        return self._pending(request, self.store.questions)

    async def forms(self, request: web.Request) -> web.Response:
        """`GET /api/session/{id}/form` → `{data: Form.Info[]}`, the pending forms of the session
        (`session.form.list`, `protocol/src/groups/form.ts` @8c6ff62466ba), a newer route than the
        other two."""
        return self._pending(request, self.store.forms)

    def _pending(self, request: web.Request, pending: dict[str, list[Json]]) -> web.Response:
        session_id = request.match_info["session"]
        if session_id not in self.store.sessions:
            return _json(session_not_found(session_id), 404)
        return _json({"data": pending.get(session_id, [])})


def permission_request(session_id: str, action: str, resources: list[str], call: tuple[str, str]) -> Json:
    """`PermissionV2.Request {id: per_…, sessionID, action, resources, source: {type: "tool", messageID,
    callID}}` (`schema/src/permission.ts` @047544f021a0)."""
    source = {"type": "tool", "messageID": call[0], "callID": call[1]}
    return {
        "id": ascending("per"),
        "sessionID": session_id,
        "action": action,
        "resources": resources,
        "source": source,
    }


def form_request(session_id: str, title: str) -> Json:
    """`Form.Info` as `session.form.create` makes one (`{id?, title, metadata, mode: "form", fields}`,
    its `CreatePayload`, `protocol/src/groups/form.ts` @8c6ff62466ba), for the session."""
    return {"id": ascending("frm"), "sessionID": session_id, "title": title, "mode": "form", "fields": []}


def question_request(session_id: str, question: str, call: tuple[str, str]) -> Json:
    """`QuestionV2.Request {id: que_…, sessionID, questions: [{question, header, options}], tool?:
    {messageID, callID}}` (`schema/src/question.ts` @29df7523e2e4)."""
    asked = {
        "question": question,
        "header": "Question",
        "options": [{"label": "Yes", "description": "Go on."}],
    }
    tool = {"messageID": call[0], "callID": call[1]}
    return {"id": ascending("que"), "sessionID": session_id, "questions": [asked], "tool": tool}
