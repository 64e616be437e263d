"""Session locks across processes: one writer per session at a time, and a bounded wait."""

import asyncio
import fcntl
import os
from pathlib import Path

import pytest

from proxy.writeback.locks import LockTimeout, SessionLocks


async def test_holds_of_one_session_exclude_each_other(tmp_path: Path) -> None:
    locks = SessionLocks(tmp_path)
    order = []

    async def write(name: str) -> None:
        async with locks.hold("ses_a"):
            order.append(f"{name} in")
            await asyncio.sleep(0.05)  # the point: hold the lock a while
            order.append(f"{name} out")

    await asyncio.gather(write("first"), write("second"))
    assert order in (
        ["first in", "first out", "second in", "second out"],
        ["second in", "second out", "first in", "first out"],
    )


async def test_a_lock_held_elsewhere_too_long_is_given_up(tmp_path: Path) -> None:
    locks = SessionLocks(tmp_path, wait=0.1)
    async with locks.hold("ses_a"):
        pass
    (name,) = os.listdir(tmp_path)
    with open(tmp_path / name, "a") as other:  # noqa: ASYNC230  # another process's hold, as flock sees it
        fcntl.flock(other, fcntl.LOCK_EX)
        with pytest.raises(LockTimeout):
            async with locks.hold("ses_a"):
                pass
