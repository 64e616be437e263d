"""The routes that start, continue or stop a 2.x turn: prompt, synthetic, resume, interrupt.

All four end in the server's own drain, which settles stale work first (`SessionRunner.drain`,
`packages/core/src/session/runner/llm.ts` @008d57153952). Every request is recorded in `Store.calls`
so a test can assert how many continuations were sent, and through which route.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.opencode2.shapes import (
    Json,
    ascending,
    conflict,
    dumps,
    error_body,
    inbox_item,
    session_not_found,
    synthetic,
    user,
)
from tests.opencode2.store import Call, Store

PROMPT_FIELDS = ("text", "files", "agents", "skills", "metadata")
"""The flat prompt body: `PromptInput.Prompt.fields` and `metadata` (`session.prompt`,
`protocol/src/groups/session.ts` @01fd0c8548b2)."""


async def _body(request: web.Request) -> Json | None:
    try:
        body: Any = await request.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _invalid(message: str) -> web.Response:
    return web.json_response(dumps=dumps, data=error_body("InvalidRequestError", message), status=400)


class Inputs:
    """The handlers that admit input or move execution."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def _known(self, session_id: str) -> web.Response | None:
        if session_id in self.store.messages:
            return None
        return web.json_response(dumps=dumps, data=session_not_found(session_id), status=404)

    def _taken(self, session_id: str, message_id: str) -> bool:
        held = self.store.messages[session_id] + self.store.inbox.get(session_id, [])
        return any(message["id"] == message_id for message in held)

    def _admit(self, session_id: str, message: Json, resume: object) -> None:
        """Admit one input; unless `resume` is false, wake the drain. A session already running takes
        it at its next step boundary (delivery `steer`), so no second drain starts."""
        self.store.inbox.setdefault(session_id, []).append(message)
        if resume is not False and session_id not in self.store.active:
            self.store.drain(session_id)

    async def prompt(self, request: web.Request) -> web.Response:
        """`POST /api/session/{id}/prompt` with a flat body `{id?, text, files?, agents?, skills?,
        metadata?, delivery?, resume?}` → `{data: Session.Inbox.User}`; a reused `id` → 409."""
        return await self._input(request, "user", "session.prompt")

    async def synthetic(self, request: web.Request) -> web.Response:
        """`POST /api/session/{id}/synthetic {id?, text, description?, metadata?, delivery?, resume?}`
        → `{data: Session.Inbox.Synthetic}` (`session.synthetic` @01fd0c8548b2); a reused `id` → 409."""
        return await self._input(request, "synthetic", "session.synthetic")

    async def _input(self, request: web.Request, kind: str, route: str) -> web.Response:
        session_id = request.match_info["session"]
        body = await _body(request)
        self.store.calls.append(Call(route, session_id, body))
        if (missing := self._known(session_id)) is not None:
            return missing
        if body is None or not isinstance(body.get("text"), str):
            return _invalid("Expected a JSON object with a string `text`")
        message_id = body.get("id") or ascending("msg")
        if self._taken(session_id, message_id):
            return web.json_response(dumps=dumps, data=conflict(message_id), status=409)
        created = self.store.clock()
        if kind == "user":
            payload = {key: body[key] for key in PROMPT_FIELDS if key in body}
            message = user(message_id, body["text"], created)
        else:
            payload = {key: body[key] for key in ("text", "description", "metadata", "resume") if key in body}
            message = synthetic(message_id, body["text"], created, body.get("description"))
        delivery = body.get("delivery", "steer")
        item = inbox_item(kind, message_id, session_id, created, payload, delivery=delivery)
        self._admit(session_id, message, body.get("resume"))
        return web.json_response(dumps=dumps, data={"data": item})

    async def resume(self, request: web.Request) -> web.Response:
        """`POST /api/session/{id}/resume` → 204: start or join execution without new input
        (`session.resume` @01fd0c8548b2). Starting means a forced drain: settle, then a step."""
        session_id = request.match_info["session"]
        self.store.calls.append(Call("session.resume", session_id))
        if (missing := self._known(session_id)) is not None:
            return missing
        if session_id not in self.store.active:
            self.store.drain(session_id)
        return web.Response(status=204)

    async def interrupt(self, request: web.Request) -> web.Response:
        """`POST /api/session/{id}/interrupt` → `{interrupted}` (`session.interrupt` @01fd0c8548b2)."""
        session_id = request.match_info["session"]
        self.store.calls.append(Call("session.interrupt", session_id))
        if (missing := self._known(session_id)) is not None:
            return missing
        return web.json_response(dumps=dumps, data={"interrupted": self.store.interrupt(session_id)})
