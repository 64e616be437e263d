"""`unfinished-message`: the assistant message of an orphaned turn is closed too.

Without `time.completed` a client keeps showing the turn as in progress, whether its tools
are settled (here or by a write-back) or it never called one (the server died while the
model was still writing). v1 also records the `MessageAbortedError` a graceful abort leaves.
"""

from __future__ import annotations

from typing import ClassVar

from rules.changes import Change
from rules.liveness import Liveness
from rules.models import JSONObject, Message, V1Message
from rules.tools import is_assistant, message_completed, message_last_alive

V1_ABORTED: JSONObject = {"name": "MessageAbortedError", "data": {"message": "Aborted"}}


class UnfinishedMessage:
    """Give an unfinished assistant message of an inactive session its completion time: the
    last moment it is known to have been alive."""

    name: ClassVar[str] = "unfinished-message"

    def __call__(self, message: Message, liveness: Liveness) -> list[Change]:
        if not is_assistant(message) or message_completed(message):
            return []
        last_alive = message_last_alive(message)
        if not liveness.vouches_for(last_alive):
            return []
        patch: JSONObject = {"time": {"completed": last_alive}}
        if isinstance(message, V1Message):
            if message.info.error is None:
                patch["error"] = V1_ABORTED
            return [Change(self.name, ("info",), patch, f"message {message.info.id} left unfinished")]
        return [Change(self.name, (), patch, f"message {message.id} left unfinished")]
