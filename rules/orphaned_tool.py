"""`orphaned-tool`: a tool still open in a session that is not active was orphaned by a crash.

The settled shape is the one opencode writes itself when a live turn is interrupted, so
every client already knows how to render it.
"""

from __future__ import annotations

from typing import ClassVar

from rules.changes import Change
from rules.liveness import Liveness
from rules.models import JSONObject, Message, V1Message
from rules.tools import message_last_alive, open_tool_indexes, tool_settled_at

V1_ERROR = "Tool execution aborted"
V2_ERROR: JSONObject = {"type": "unknown", "message": "Tool execution interrupted"}


class OrphanedTool:
    """Settle open tool parts of an inactive session as interrupted.

    The whole message is judged by its latest sign of life: its tools ran in one turn, so a
    reading too close to any of them (or a process that may run that turn) vouches for none.
    """

    name: ClassVar[str] = "orphaned-tool"

    def __call__(self, message: Message, liveness: Liveness) -> list[Change]:
        if not liveness.vouches_for(message_last_alive(message)):
            return []
        return [self._settle(message, index) for index in open_tool_indexes(message)]

    def _settle(self, message: Message, index: int) -> Change:
        ended = tool_settled_at(message, index)
        if isinstance(message, V1Message):
            part = message.parts[index]
            started = part.state.time.start if part.state and part.state.time else None
            time = {"end": ended} if started is not None else {"start": ended, "end": ended}
            # `metadata.interrupted` is how opencode itself marks an orphaned, interrupted call.
            patch: JSONObject = {
                "state": {
                    "status": "error",
                    "error": V1_ERROR,
                    "metadata": {"interrupted": True},
                    "time": time,
                }
            }
            return Change(self.name, ("parts", index), patch, f"tool part {part.id} open in inactive session")
        item = message.content[index]
        patch = {"state": {"status": "error", "error": V2_ERROR}, "time": {"completed": ended}}
        return Change(self.name, ("content", index), patch, f"tool call {item.id} open in inactive session")
