"""The state database of tool processes: what `settle-proxy run` saw each tool call start, kept
on disk so that what a dead server left running can be named even after the proxy itself is gone.

`$XDG_STATE_HOME/settle-proxy/processes.db` (SQLite through aiosqlite). A process is named by its
pid and start time, and start times count from boot, so every row also holds the boot it belongs
to (`/proc/sys/kernel/random/boot_id`); rows of an earlier boot name nothing that runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite

from proxy.supervision.tool_processes import Identity, ToolCall
from proxy.system.procfs import PROC

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tool_process (
    boot TEXT NOT NULL, pid INTEGER NOT NULL, started INTEGER NOT NULL, command TEXT NOT NULL,
    server_pid INTEGER NOT NULL, server_started INTEGER NOT NULL,
    session TEXT NOT NULL, call TEXT NOT NULL, tool TEXT NOT NULL, call_command TEXT NOT NULL,
    running INTEGER NOT NULL,
    PRIMARY KEY (boot, pid, started)
)
"""
_BUSY_TIMEOUT_MS = 5000


def boot_id() -> str:
    return (PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()


@dataclass(frozen=True, slots=True)
class Recorded:
    """One tool process as recorded while its server lived."""

    process: Identity
    command: str
    server: Identity
    call: ToolCall


class ProcessRecords:
    """An open state database; use `ProcessRecords.open(path)`."""

    def __init__(self, connection: aiosqlite.Connection, boot: str) -> None:
        self._db = connection
        self._boot = boot

    @classmethod
    @asynccontextmanager
    async def open(cls, path: Path) -> AsyncIterator[ProcessRecords]:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        async with aiosqlite.connect(path) as connection:
            await connection.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            await connection.execute(_SCHEMA)
            await connection.commit()
            yield cls(connection, boot_id())

    async def record(self, process: Identity, command: str, server: Identity, call: ToolCall) -> None:
        await self._db.execute(
            "INSERT OR REPLACE INTO tool_process VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self._boot,
                process.pid,
                process.started,
                command,
                server.pid,
                server.started,
                call.session_id,
                call.call,
                call.tool,
                call.command,
                int(call.running),
            ),
        )
        await self._db.commit()

    async def ended(self, call: str) -> None:
        """The call finished: its processes, should they outlive the server, were left on purpose.
        Only those of a server that still runs: one a crash left behind stays named as running at
        that crash, however the call ends in a later server's life (a settlement, a restart's)."""
        query = "SELECT DISTINCT server_pid, server_started FROM tool_process WHERE boot = ? AND call = ?"
        async with self._db.execute(query, (self._boot, call)) as rows:
            servers = [Identity(pid, started) for pid, started in await rows.fetchall()]
        for server in servers:
            if Identity.of(server.pid) == server:
                await self._db.execute(
                    "UPDATE tool_process SET running = 0 "
                    "WHERE boot = ? AND call = ? AND server_pid = ? AND server_started = ?",
                    (self._boot, call, server.pid, server.started),
                )
        await self._db.commit()

    async def of_this_boot(self) -> list[Recorded]:
        """Every record that can still name a process (older boots' rows are dropped)."""
        await self._db.execute("DELETE FROM tool_process WHERE boot != ?", (self._boot,))
        await self._db.commit()
        query = (
            "SELECT pid, started, command, server_pid, server_started, session, call, tool, call_command, "
            "running FROM tool_process WHERE boot = ?"
        )
        async with self._db.execute(query, (self._boot,)) as rows:
            return [_recorded(tuple(row)) for row in await rows.fetchall()]

    async def left_running(self) -> list[Recorded]:
        """The recorded processes that still run while the server that started them does not (the
        same pid *and* start time for both); records of processes that are gone are dropped."""
        found = []
        for recorded in await self.of_this_boot():
            if Identity.of(recorded.process.pid) != recorded.process:
                await self.forget(recorded.process)
            elif Identity.of(recorded.server.pid) != recorded.server:
                found.append(recorded)
        return found

    async def forget(self, process: Identity) -> None:
        await self._db.execute(
            "DELETE FROM tool_process WHERE boot = ? AND pid = ? AND started = ?",
            (self._boot, process.pid, process.started),
        )
        await self._db.commit()


def _recorded(row: tuple[Any, ...]) -> Recorded:
    pid, started, command, server_pid, server_started, session, call, tool, call_command, running = row
    return Recorded(
        Identity(pid, started),
        command,
        Identity(server_pid, server_started),
        ToolCall(session, call, tool, call_command, bool(running)),
    )
