"""The prompt a resumed turn starts with: the only place the model learns its call was cut off.

Measured on opencode 1.18.33: after write-back, v1 replays a settled call to the model as an
ordinary tool result holding the partial output, with no error marker. So the text names each
interrupted call, says what became of its process, says its outcome is unknown, and asks the
model to check before it relies on the call or repeats it.

What became of a process is a policy over values (`process_fates`): the service reads them from
the supervisor of a server `run` started, or from the records of a server it did not start.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from enum import StrEnum

from proxy.resume.last_turn import InterruptedCall

__all__ = [
    "PROCESS_TOOLS",
    "Fates",
    "LeftRunning",
    "ProcessFate",
    "no_fates",
    "process_fates",
    "resume_text",
    "shortened",
]

SHORT_CHARS = 160


class ProcessFate(StrEnum):
    """What became of the process an interrupted call ran, as the proxy knows it."""

    ENDED = "its process was ended after the server stopped"
    GONE = "its process no longer runs"
    LEFT_RUNNING = "its process is still running"
    UNKNOWN = "whether its process still runs is not known"
    NONE = ""
    """A call that runs no process of its own (read, edit, …)."""


Fates = Callable[[Sequence[str]], Awaitable[Mapping[str, ProcessFate]]]
"""What became of the processes of the named calls (by call id), as the proxy knows it."""
LeftRunning = Callable[[], Awaitable[Mapping[str, bool]]]
"""The calls whose processes a dead server left running, each with whether the call itself was
still running at the crash (and not completed)."""


async def no_fates(_: Sequence[str]) -> Mapping[str, ProcessFate]:
    return {}


def process_fates(
    left_running: LeftRunning, *, ending: bool = False, tied: Callable[[str], bool] | None = None
) -> Fates:
    """The fates of calls' processes: one left running is `ENDED` when `ending` (`--orphans
    terminate`) ends the processes of calls running at the crash, else `LEFT_RUNNING`; one no
    longer running but `tied` to its call (a subreaper saw it) is `ENDED` when `ending`, else
    `GONE`; of any other call nothing is known."""

    async def fates(calls: Sequence[str]) -> Mapping[str, ProcessFate]:
        alive = await left_running()
        found = {}
        for call in calls:
            if (was_running := alive.get(call)) is not None:
                found[call] = ProcessFate.ENDED if ending and was_running else ProcessFate.LEFT_RUNNING
            elif tied is not None and tied(call):
                found[call] = ProcessFate.ENDED if ending else ProcessFate.GONE
        return found

    return fates


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
