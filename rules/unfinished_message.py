"""`unfinished-message`: the assistant message of an orphaned turn is closed too.

Without `time.completed` a client keeps showing the turn as in progress even after its
tools are settled. v1 also records the `MessageAbortedError` a graceful abort would leave.
"""

from __future__ import annotations

from typing import ClassVar

from rules.changes import Change
from rules.liveness import Liveness
from rules.models import JSONObject, Message, V1Message
from rules.tools import is_assistant, message_completed, message_settled_at, open_tool_indexes

V1_ABORTED: JSONObject = {"name": "MessageAbortedError", "data": {"message": "Aborted"}}


class UnfinishedMessage:
    """Give an unfinished assistant message with orphaned tools its completion time."""

    name: ClassVar[str] = "unfinished-message"

    def __call__(self, message: Message, liveness: Liveness) -> list[Change]:
        if liveness.active or not is_assistant(message) or message_completed(message):
            return []
        if not open_tool_indexes(message):
            return []
        patch: JSONObject = {"time": {"completed": message_settled_at(message)}}
        if isinstance(message, V1Message):
            if message.info.error is None:
                patch["error"] = V1_ABORTED
            return [Change(self.name, ("info",), patch, f"message {message.info.id} left unfinished")]
        return [Change(self.name, (), patch, f"message {message.id} left unfinished")]
