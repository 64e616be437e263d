"""opencode 2.x's shape: 1.18's v2 layout (`content`, views in `{"data": ...}`), settled as 2.x
settles a call or a compaction a crash left open.

2.x never settles at boot: when a session's next drain starts (a prompt, or a resume), its
`settleStaleToolCalls` fails every `streaming` or `running` call, and `settleStaleCompactions`
every compaction still `running` (`packages/core/src/session/runner/llm.ts`, anomalyco/opencode
@008d57153952804fea8d6eef1cf3baf4402248cb). The event becomes a new tool state through the
projection (`message-updater.ts`). Everything here builds what 2.x itself would store, so that a
client reading the view through the proxy sees now what it would see after the server's own settle.

The source changed the settled shape more than once (an `unknown` error before 2.0; `aborted`
with no suffix nor metadata; then the suffix and the metadata; running tools once kept
`structured` and `content`), but no commit read names the release it shipped in. What is pinned:
2.0.18 and 2.0.24 settle as the newest source does (`/work/notes/opencode2x-facts.md`, from
clients that pinned those releases), and the issue this answers is on 2.1.2. So one shape, the
newest; an older one gets its own runtime once a release is tied to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from rules.models import JSONObject, V2Message
from rules.runtime import extra
from rules.runtimes import V2Shapes

__all__ = [
    "AMBIGUOUS",
    "COMPACTION_INTERRUPTED",
    "V2X",
    "Runtime2x",
    "V2xMessage",
    "interrupted_error",
]

INTERRUPTED = "Tool execution interrupted"
AMBIGUOUS = "Tool outcome is ambiguous after restart"
"""How the newest `serve --service` fails, at boot, a call a crash left running that it will not
resume (`Tool outcome is ambiguous after restart: <tool>`, `aborted`, then the session's
`session.execution.failed` "Execution stopped: a tool outcome is ambiguous after restart."):
`resumeSuspendedSessionsWith`, `packages/core/src/session/execution/restart.ts`, anomalyco/opencode
(a version newer than 9e2efa10, which has no such failure). The server's own settlement, as
`INTERRUPTED` is."""
COMPACTION_INTERRUPTED: JSONObject = {
    "type": "compaction.interrupted",
    "message": "Compaction was interrupted",
}
"""`settleStaleCompactions`' error (llm.ts @008d571)."""
_COMPACTION_KEPT = frozenset({"id", "type", "status", "metadata", "reason", "error", "time"})
"""What the projection of `session.compaction.failed` keeps of a running compaction
(`CompactionFailed`, `message-updater.ts` @03130971 and newer): `summary` and `recent` go."""


def interrupted_error(tool: Any, child: Any = None) -> JSONObject:
    """`settleStaleToolCalls`' error: the tool's name, and a `subagent`'s child session."""
    suffix = f" (sessionID: {child})" if isinstance(child, str) else ""
    return {"type": "aborted", "message": f"{INTERRUPTED}: {tool}{suffix}"}


class V2xMessage(V2Message):
    """A message of a 2.x server (how `runtime_for` tells it from 1.18's v2)."""


class Runtime2x(V2Shapes):
    """2.x, as its newest source has it (`ToolStateRunning` = `{status, input, metadata}`,
    `session-message.ts` @0ceb3dd56f35d1b08bd5f3f8b969962e97fa0e20). The projection of
    `session.tool.failed` builds a new state, `{status, error, input, content?, metadata?}`
    (content and metadata the event's: the settle sends metadata only when the running one had
    any, and never content), so every other field of the open state goes."""

    name = "2.x"
    model: ClassVar[type[V2Message]] = V2xMessage

    def settled_tool(self, message: V2Message, index: int) -> JSONObject:
        item = message.content[index]
        old = _fields(item.state)
        running = old.get("status") == "running"
        metadata = old.get("metadata") if running else None
        tool = extra(item, "name")
        child = metadata.get("sessionID") if tool == "subagent" and isinstance(metadata, dict) else None
        new: JSONObject = {"status": "error", "error": interrupted_error(tool, child)}
        given = old.get("input")
        if given is not None:
            new["input"] = {} if isinstance(given, str) else given
        if isinstance(metadata, dict) and metadata:
            new["metadata"] = metadata
        return {
            # The projection: `executed = event.executed || tool.executed === true`, and the settle
            # sends `tool.executed === true`; `providerResultState` is the event's, which has none.
            "executed": extra(item, "executed") is True,
            "providerResultState": None,
            "state": {key: None for key in old if key not in new} | new,
            "time": {"completed": self.tool_settled_at(message, index)},
        }

    def finished(self, message: V2Message, last_alive: int) -> JSONObject:
        """Closed at its last sign of life, as the server's own settlement leaves it: the settle
        itself (`session.tool.failed`) does not touch the message, but the drain that runs it
        starts a step at once, and `session.step.started` closes the current open assistant
        message (`time.completed` = the step's `created`, `retry` dropped: `message-updater.ts`,
        anomalyco/opencode @2092350cf). Measured on that build after a SIGKILL and the next prompt
        (`tests/fixtures/opencode-2.x/measured-2092350c-message-server-settled.json`): the message
        closed, no `finish`, no `error`. The proxy cannot know when that next step will come, so it
        takes the last moment the message was known alive, which is also its tools' end."""
        patch: JSONObject = {"time": {"completed": last_alive}}
        if extra(message, "retry") is not None:
            patch["retry"] = None
        return patch

    def settled_as_interrupted(self, state: Mapping[str, Any]) -> bool:
        error = state.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        return (
            isinstance(error, dict)
            and error.get("type") == "aborted"
            and isinstance(message, str)
            and message.startswith((INTERRUPTED, AMBIGUOUS))
        )

    def failed_compaction(self, message: V2Message) -> JSONObject | None:
        """The merge patch that fails a compaction left running, or None for any other message."""
        if message.type != "compaction" or extra(message, "status") != "running":
            return None
        present = message.model_fields_set | set(message.model_extra or {})
        dropped: JSONObject = {key: None for key in present if key not in _COMPACTION_KEPT}
        return dropped | {"status": "failed", "error": COMPACTION_INTERRUPTED}


def _fields(state: Any) -> JSONObject:
    """A tool state's fields as the server sent them."""
    return {"status": state.status, **(state.model_extra or {})}


V2X: Runtime2x = Runtime2x()
