"""`unfinished-message`: the assistant message of an orphaned turn is closed too.

Without `time.completed` a client keeps showing the turn as in progress, whether its tools
are settled (here or by a write-back) or it never called one (the server died while the
model was still writing). v1 also records the `MessageAbortedError` a graceful abort leaves.
"""

from __future__ import annotations

from typing import ClassVar

from rules.changes import Change
from rules.liveness import Liveness
from rules.models import Api, Message
from rules.rule import Trigger
from rules.runtimes import V1_ABORTED, runtime_for
from rules.triggers import UNFINISHED_ASSISTANT_TRIGGER

__all__ = ["V1_ABORTED", "UnfinishedMessage"]


class UnfinishedMessage:
    """Give an unfinished assistant message of an inactive session its completion time: the
    last moment it is known to have been alive."""

    name: ClassVar[str] = "unfinished-message"
    trigger: ClassVar[Trigger] = UNFINISHED_ASSISTANT_TRIGGER
    durable: ClassVar[frozenset[Api]] = frozenset({Api.V1})

    def __call__(self, message: Message, liveness: Liveness) -> list[Change]:
        runtime = runtime_for(message)
        if not runtime.is_assistant(message) or runtime.completed(message):
            return []
        last_alive = runtime.last_alive(message)
        patch = runtime.finished(message, last_alive)
        if patch is None or not liveness.vouches_for(last_alive):
            return []
        target = runtime.target(message)
        return [
            Change(self.name, target, patch, f"message {target.message} left unfinished", runtime.header_path)
        ]
