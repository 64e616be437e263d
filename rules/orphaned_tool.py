"""`orphaned-tool`: a tool still open in a session that is not active was orphaned by a crash.

The settled shape is the one opencode writes itself when a live turn is interrupted, so
every client already knows how to render it (see each runtime's `settled_tool`). The server
died at an unknown moment, so the end time written is derived from the part itself: the
last moment it is known to have been alive. That keeps the rule pure and the value stable:
every fetch, every proxy instance and a later write-back agree.
"""

from __future__ import annotations

from typing import ClassVar

from rules.changes import Change
from rules.liveness import Liveness
from rules.models import Api, Message
from rules.rule import Trigger
from rules.runtimes import V1_ERROR, V2_ERROR, runtime_for
from rules.triggers import OPEN_TOOL_TRIGGER

__all__ = ["V1_ERROR", "V2_ERROR", "OrphanedTool"]


class OrphanedTool:
    """Settle open tool parts of an inactive session as interrupted.

    Open is what the trigger finds (`OPEN_TOOL_TRIGGER`, `has_open_tool`: a tool in one of its
    runtime's open statuses, live or not); orphaned is what this rule decides: open, and in a
    session whose reading vouches that nothing runs it.

    The whole message is judged by its latest sign of life: its tools ran in one turn, so a
    reading too close to any of them (or a process that may run that turn) vouches for none.
    """

    name: ClassVar[str] = "orphaned-tool"
    trigger: ClassVar[Trigger] = OPEN_TOOL_TRIGGER
    durable: ClassVar[frozenset[Api]] = frozenset({Api.V1, Api.V2})

    def __call__(self, message: Message, liveness: Liveness) -> list[Change]:
        runtime = runtime_for(message)
        if not liveness.vouches_for(runtime.last_alive(message)):
            return []
        changes = []
        for index in runtime.open_tool_indexes(message):
            target = runtime.target(message, index)
            changes.append(
                Change(
                    self.name,
                    target,
                    runtime.settled_tool(message, index),
                    f"tool {runtime.item_noun} {target.part} open in inactive session",
                    (runtime.item_key, index),
                )
            )
        return changes
