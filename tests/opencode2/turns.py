"""The routes that start, continue or stop a 2.x turn: prompt, synthetic, interrupt (2.1.2's; it has
no `/resume`).

An input wakes the server's own drain, which settles stale work first (`SessionRunner.drain`,
`packages/core/src/session/runner/llm.ts` @008d57153952; on 2.1.2, measured, the next prompt after a
crash writes the call `error`, "Tool execution interrupted: shell"). Every request is recorded in
`Store.calls` so a test can assert how many continuations were sent, and through which route.
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
"""What of a prompt's flat body its inbox item keeps as `payload` (`PromptInput.Prompt.fields` and
`metadata`, `session.prompt`, `protocol/src/groups/session.ts` @01fd0c8548b2; 2.1.2, measured:
`{"text":"p","resume":false}` is kept as `{"text":"p"}`)."""
SYNTHETIC_FIELDS = ("text", "description", "metadata")
"""`Session.Inbox.SyntheticPayload` (2.1.2's openapi.json; measured: `resume` is not kept)."""
REUSED = {"user": "Prompt message ID", "synthetic": "Synthetic input ID"}
"""How 2.1.2 names an input whose id another kind of input holds (measured, 409 `ConflictError`)."""
RESUME_QUERY = {"true": True, "false": False}


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

    def _reused(self, session_id: str, message_id: str, kind: str) -> web.Response | None:
        """A reused id: the input admitted under it, once more and admitted no more, when it was this
        kind of input; 409 when another input holds it (2.1.2, measured: a synthetic or a prompt sent
        again under its id answers 200 with the first item, text and time as first admitted, before
        and after delivery; a synthetic under a prompt's id, or a prompt under a synthetic's, 409)."""
        admitted = self.store.admitted.get(session_id, {}).get(message_id)
        if admitted is not None and admitted["type"] == kind:
            return web.json_response(dumps=dumps, data={"data": admitted})
        if admitted is not None or self._taken(session_id, message_id):
            return web.json_response(dumps=dumps, data=conflict(message_id, REUSED[kind]), status=409)
        return None

    def _admit(self, session_id: str, message: Json, resume: object) -> None:
        """Admit one input; unless `resume` is false, wake the drain. A session already running takes
        it at its next step boundary (delivery `steer`), so no second drain starts."""
        self.store.inbox.setdefault(session_id, []).append(message)
        if resume is not False and session_id not in self.store.active:
            self.store.drain(session_id)

    async def prompt(self, request: web.Request) -> web.Response:
        """`POST /api/session/{id}/prompt` with a flat body `{id?, text, files?, agents?, skills?,
        metadata?, delivery?, resume?}` → `{data: Session.Inbox.User}`: 2.1.2 (measured: `{"data":{"id":
        "msg_…","sessionID","time":{"created"},"type":"user","payload":{"text"},"delivery":"steer"}}`;
        a reused id as `_reused` says; `resume:false` admits without a drain)."""
        return await self._input(request, "user", "session.prompt")

    async def synthetic(self, request: web.Request) -> web.Response:
        """`POST /api/session/{id}/synthetic {id?, text, description?, metadata?, delivery?, resume?}`
        → `{data: Session.Inbox.Synthetic}`: 2.1.2 (measured: `{"data":{"id","sessionID","time":
        {"created"},"type":"synthetic","payload":{"text","description"},"delivery":"steer"}}`, the
        message then stored as `{id, time, text, description, type: "synthetic"}`; a reused id as
        `_reused` says; a body without `text` 400 `InvalidRequestError`; an unknown session 404)."""
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
        if (reused := self._reused(session_id, message_id, kind)) is not None:
            return reused
        created = self.store.clock()
        if kind == "user":
            payload = {key: body[key] for key in PROMPT_FIELDS if key in body}
            message = user(message_id, body["text"], created)
        else:
            payload = {key: body[key] for key in SYNTHETIC_FIELDS if key in body}
            message = synthetic(message_id, body["text"], created, body.get("description"))
        delivery = body.get("delivery", "steer")
        item = inbox_item(kind, message_id, session_id, created, payload, delivery=delivery)
        self.store.admitted.setdefault(session_id, {})[message_id] = item
        self._admit(session_id, message, body.get("resume"))
        return web.json_response(dumps=dumps, data={"data": item})

    async def interrupt(self, request: web.Request) -> web.Response:
        """`POST /api/session/{id}/interrupt?resume=true|false` → `SessionInterruptResponse
        {interrupted}`: 2.1.2 (measured: `{"interrupted":true}` for a running session, which is then
        inactive with an `idle` message of outcome `interrupted`; `{"interrupted":false}` for the idle
        no-op, with or without `resume`; `resume=maybe` 400 `InvalidRequestError` `Expected "true" |
        "false"` of kind `Query`; an unknown session 404). With `resume=true` the interrupted execution
        goes on with the input it holds (its openapi.json: "execution resumes pending steering input
        … while queued prompts remain parked"; the stand-in does not part the two)."""
        session_id = request.match_info["session"]
        self.store.calls.append(Call("session.interrupt", session_id))
        resume = request.query.get("resume")
        if resume is not None and resume not in RESUME_QUERY:
            message = 'Expected "true" | "false"\n  at ["resume"]'
            body = error_body("InvalidRequestError", message, kind="Query")
            return web.json_response(dumps=dumps, data=body, status=400)
        if (missing := self._known(session_id)) is not None:
            return missing
        interrupted = self.store.interrupt(session_id)
        if interrupted and resume is not None and RESUME_QUERY[resume] and self.store.inbox.get(session_id):
            self.store.drain(session_id)
        return web.json_response(dumps=dumps, data={"interrupted": interrupted})
