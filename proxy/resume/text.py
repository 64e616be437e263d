"""The prompt a resumed turn starts with: the only place the model learns its call was cut off.

Measured on opencode 1.18.33: after write-back, v1 replays a settled call to the model as an
ordinary tool result holding the partial output, with no error marker. So the text names each
interrupted call, says what became of its process, says its outcome is unknown, and asks the
model to check before it relies on the call or repeats it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from enum import StrEnum

from proxy.resume.last_turn import InterruptedCall

__all__ = ["PROCESS_TOOLS", "ProcessFate", "resume_text", "shortened"]

SHORT_CHARS = 160


class ProcessFate(StrEnum):
    """What became of the process an interrupted call ran, as the proxy knows it."""

    ENDED = "its process was ended after the server stopped"
    GONE = "its process no longer runs"
    LEFT_RUNNING = "its process is still running"
    UNKNOWN = "whether its process still runs is not known"
    NONE = ""
    """A call that runs no process of its own (read, edit, …)."""


PROCESS_TOOLS = frozenset({"bash", "shell"})
"""The tools that start a process of their own (opencode 1.18.33's `bash`, 2.x's `shell`)."""


def shortened(call: InterruptedCall, limit: int = SHORT_CHARS) -> str:
    """The call's command (or else its whole input), on one line, cut to `limit` characters."""
    command = call.input.get("command")
    text = command if isinstance(command, str) else json.dumps(call.input, ensure_ascii=False, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def resume_text(calls: Sequence[InterruptedCall], fates: Mapping[str, ProcessFate]) -> str:
    """The continuation prompt for a turn cut off during `calls` (none: while the model wrote);
    `fates` says, by call id, what became of each call's process."""
    if not calls:
        return (
            "The opencode server stopped while you were answering, and has been restarted; your answer "
            "was cut off. Continue the task where it stopped, without redoing work that is already finished."
        )
    lines = [
        "The opencode server stopped while this turn was running, and has been restarted. "
        "These tool calls were interrupted:",
    ]
    for call in calls:
        what = fates.get(
            call.call_id, ProcessFate.UNKNOWN if call.tool in PROCESS_TOOLS else ProcessFate.NONE
        )
        lines.append(f"- {call.tool}: `{shortened(call)}`" + (f" ({what})" if what else ""))
    lines.append(
        "Their outcome is unknown: each may have done all, part or none of its work, and any output "
        "shown for it may be incomplete. Check the actual state before you rely on a call or repeat it, "
        "then continue the task where it stopped, without redoing work that is already finished."
    )
    return "\n".join(lines)
