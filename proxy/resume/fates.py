"""What became of an interrupted call's process, as the resume tells the model: the policy, given
what the proxy knows of processes as values (the service reads them from the supervisor of a
server `run` started, or from the records of a server it did not start)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from proxy.resume.text import ProcessFate

__all__ = ["Fates", "LeftRunning", "no_fates", "process_fates"]

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
