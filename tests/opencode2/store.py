"""What a 2.x stand-in holds: the database a crash keeps (`Store`) and the process it does not (`Process`),
and the drain every prompt and synthetic input ends in.

`SessionRunner.drain` (`packages/core/src/session/runner/llm.ts` @008d57153952) settles stale
compactions, then stale tool calls, then runs steps. The stand-in's step is canned: one assistant
message with one text part, then `session.execution.succeeded` and its `idle` message (projection
idx:70408091340), so a test sees a whole turn without a model.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tests.opencode2.auth import Auth
from tests.opencode2.events import EventHub
from tests.opencode2.session_log import Log
from tests.opencode2.settle import (
    INTERRUPTED,
    Settle,
    compaction_failures,
    project_compaction_failed,
    project_tool_failed,
    tool_failures,
)
from tests.opencode2.shapes import MODEL, Json, ascending, assistant, idle, text

TURN_TEXT = "Continued."
TOKENS: Json = {"input": 0, "output": 0, "reasoning": 0, "cache": {"read": 0, "write": 0}}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Call:
    """One request a test may assert on: the route's name, its session and its JSON body."""

    route: str
    session_id: str
    body: Json | None = None


@dataclass
class Process:
    """What a server process is, and what a crash takes with it."""

    version: str
    auth: Auth
    pid: int = 4242
    booting: bool = False
    health_route: str = "info"
    """`info` (`GET /api/info`, `protocol/src/groups/server.ts` @51819a10a412) or `health` (early
    2.0's `GET /api/health`, `protocol/src/groups/health.ts` @7c3c912ea4ff)."""
    form_route: bool = True
    """Whether `GET /api/session/{id}/form` is served: 2.1.2 serves it (measured); the from-source
    build @2092350c was not seen to (/work/shared/OPENCODE.md: the route is "from newer source")."""
    web_fallback: bool = False
    """Answer every unknown GET with 200 text/html, as a server bundling its web app may."""
    compress: bool = False
    """gzip every answer whose request accepts gzip, `/api/event` included: newer 2.x servers
    compress responses (issue 36 item 15, /work/shared/OPENCODE.md's last section, "From newer
    source"); the file that does it was not found in the code index, so the stand-in takes the
    worst case, every stream compressed as soon as a client accepts it."""
    session_log: Log = Log.HEAD
    """Which durable session log it answers (`tests.opencode2.session_log`)."""
    before_log: Callable[[], Awaitable[None]] | None = None
    """Awaited before a read of the log is answered (a test's hook: publish meanwhile, or hang)."""
    port: int = 0


@dataclass
class Store:
    """The database: sessions, their messages in stored order, pending requests; and the live state
    (`active`) that a crash clears."""

    hub: EventHub
    clock: Callable[[], int] = now_ms
    settle: Settle = Settle.CHILD
    call_key: str = "id"
    run_turns: bool = True
    """False: a drain settles and leaves the session running, as a model still answering would."""
    sessions: dict[str, Json] = field(default_factory=dict)
    messages: dict[str, list[Json]] = field(default_factory=dict)
    active: set[str] = field(default_factory=set)
    permissions: dict[str, list[Json]] = field(default_factory=dict)
    forms: dict[str, list[Json]] = field(default_factory=dict)
    inbox: dict[str, list[Json]] = field(default_factory=dict)
    """Admitted inputs not yet delivered: what the drain turns into messages after it settles
    (`session.inbox.enqueued` → `session.inbox.delivered`, `specs/v2/session.md` per idx:70823202177)."""
    admitted: dict[str, dict[str, Json]] = field(default_factory=dict)
    """Every inbox item admitted, by session and id: what a send under a used id is answered with."""
    calls: list[Call] = field(default_factory=list)

    def settle_stale(self, session_id: str) -> None:
        """`settleStaleCompactions` then `settleStaleToolCalls`: publish each event, then project it."""
        messages = self.messages[session_id]
        for published in compaction_failures(session_id, messages):
            self.hub.publish(published.type, published.data)
            project_compaction_failed(messages, published.data)
        for published in tool_failures(session_id, messages, self.settle, self.call_key):
            event = self.hub.publish(published.type, published.data)
            project_tool_failed(messages, published.data, event["created"])

    def drain(self, session_id: str) -> None:
        """Settle, deliver what the inbox holds, then run the turn (or stay running)."""
        self.settle_stale(session_id)
        self.messages[session_id].extend(self.inbox.pop(session_id, []))
        if self.run_turns:
            self.run_turn(session_id)
        else:
            self.active.add(session_id)

    def run_turn(self, session_id: str) -> None:
        messages = self.messages[session_id]
        self.hub.publish("session.execution.started", {"sessionID": session_id})
        message_id = ascending("msg")
        data = {"sessionID": session_id, "assistantMessageID": message_id, "agent": "build", "model": MODEL}
        started = self.hub.publish("session.step.started", data)["created"]
        latest = next((m for m in reversed(messages) if m["type"] == "assistant"), None)
        if latest is not None and "completed" not in latest["time"]:
            latest["time"]["completed"] = started
        reply = assistant(message_id, [text(TURN_TEXT)], started)
        messages.append(reply)
        ended = {"sessionID": session_id, "assistantMessageID": message_id, "finish": "stop", "cost": 0}
        reply["time"]["completed"] = self.hub.publish("session.step.ended", {**ended, "tokens": TOKENS})[
            "created"
        ]
        reply["finish"] = "stop"
        self._idle(session_id, "session.execution.succeeded", {}, "succeeded")

    def interrupt(self, session_id: str) -> bool:
        """A live interrupt (`POST …/interrupt`): the running calls fail with `step.ts`
        `TOOLS_INTERRUPTED` (2.0.18 per idx:71123457094), then `session.execution.interrupted`
        with reason `user` and its `idle` message. False for the idle no-op."""
        if session_id not in self.active:
            return False
        messages = self.messages[session_id]
        for published in tool_failures(session_id, messages, Settle.EARLY, self.call_key):
            published.data["error"] = {"type": "aborted", "message": INTERRUPTED}
            event = self.hub.publish(published.type, published.data)
            project_tool_failed(messages, published.data, event["created"])
        self._idle(session_id, "session.execution.interrupted", {"reason": "user"}, "interrupted")
        return True

    def _idle(self, session_id: str, event_type: str, fields: Json, outcome: str) -> None:
        event = self.hub.publish(event_type, {"sessionID": session_id, **fields})
        message_id = "msg_" + event["id"].removeprefix("evt_")
        self.messages[session_id].append(idle(message_id, outcome, event["created"]))
        self.active.discard(session_id)
