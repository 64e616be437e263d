"""The durable at-most-once record of resumes, in the proxy's state database.

`$XDG_STATE_HOME/settle-proxy/processes.db`, beside the tool-process records. An interrupted
turn is claimed by a UNIQUE insert of (session, interrupted assistant message), committed before
anything is sent: of two proxies on one host only one insert wins, and a proxy restarted after
the claim finds it there. Each prompt is recorded (with the id the proxy gives its user message)
before it is sent, so that a resumed turn interrupted again is known to be the same person's turn
(its assistant message answers one of our prompts) and shares its budget.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiosqlite

__all__ = ["Claim", "Ledger"]

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS resume_claim (
        session TEXT NOT NULL, message TEXT NOT NULL, chain TEXT NOT NULL, owner TEXT NOT NULL,
        claimed_at REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, outcome TEXT,
        PRIMARY KEY (session, message))""",
    """CREATE TABLE IF NOT EXISTS resume_prompt (
        prompt TEXT PRIMARY KEY, session TEXT NOT NULL, message TEXT NOT NULL, sent_at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS resume_waiting (
        session TEXT PRIMARY KEY, message TEXT NOT NULL, since REAL NOT NULL, turn BLOB NOT NULL)""",
)
_BUSY_TIMEOUT_MS = 5000


@dataclass(frozen=True, slots=True)
class Claim:
    """The outcome of claiming a turn: `won` it, with the prompts its person's turn already used,
    or lost to an earlier claim (`owner` says whose)."""

    won: bool
    used: int
    owner: str


def this_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Ledger:
    """An open record; use `Ledger.open(path)`."""

    def __init__(self, connection: aiosqlite.Connection) -> None:
        self._db = connection
        self._owner = this_owner()
        self._lock = asyncio.Lock()
        """One connection, shared by every session's resume: one transaction on it at a time."""

    @classmethod
    @asynccontextmanager
    async def open(cls, path: Path) -> AsyncIterator[Ledger]:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        async with aiosqlite.connect(path, isolation_level=None) as connection:
            await connection.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            for statement in _SCHEMA:
                await connection.execute(statement)
            yield cls(connection)

    async def used(self, session_id: str, prompted_by: str | None, message_id: str) -> int:
        """Prompts already sent for the person's turn that `message_id` belongs to."""
        async with self._lock:
            return await self._used(session_id, prompted_by, message_id)

    async def _used(self, session_id: str, prompted_by: str | None, message_id: str) -> int:
        chain = await self._chain(session_id, prompted_by, message_id)
        async with self._db.execute(
            "SELECT coalesce(sum(attempts), 0) FROM resume_claim WHERE session = ? AND chain = ?",
            (session_id, chain),
        ) as rows:
            row = await rows.fetchone()
        return int(row[0]) if row else 0

    async def claim(self, session_id: str, prompted_by: str | None, message_id: str) -> Claim:
        """Claim the turn ending in `message_id` once, for good (committed when this returns)."""
        async with self._lock:
            return await self._claim(session_id, prompted_by, message_id)

    async def _claim(self, session_id: str, prompted_by: str | None, message_id: str) -> Claim:
        await self._db.execute("BEGIN IMMEDIATE")
        try:
            chain = await self._chain(session_id, prompted_by, message_id)
            used = await self._used(session_id, prompted_by, message_id)
            await self._db.execute(
                "INSERT INTO resume_claim (session, message, chain, owner, claimed_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (session_id, message_id, chain, self._owner, time.time()),
            )
        except sqlite3.IntegrityError:
            await self._db.execute("ROLLBACK")
            return Claim(False, 0, await self._owner_of(session_id, message_id))
        except BaseException:
            await self._db.execute("ROLLBACK")
            raise
        await self._db.execute("COMMIT")
        return Claim(True, used, self._owner)

    async def sending(self, session_id: str, message_id: str, prompt_id: str) -> None:
        """Count one more prompt for the claimed turn, and remember its id (committed when this returns)."""
        async with self._lock:
            await self._sending(session_id, message_id, prompt_id)

    async def _sending(self, session_id: str, message_id: str, prompt_id: str) -> None:
        await self._db.execute("BEGIN IMMEDIATE")
        try:
            await self._db.execute(
                "UPDATE resume_claim SET attempts = attempts + 1 WHERE session = ? AND message = ?",
                (session_id, message_id),
            )
            await self._db.execute(
                "INSERT INTO resume_prompt VALUES (?, ?, ?, ?)",
                (prompt_id, session_id, message_id, time.time()),
            )
        except BaseException:
            await self._db.execute("ROLLBACK")
            raise
        await self._db.execute("COMMIT")

    async def finished(self, session_id: str, message_id: str, outcome: str) -> None:
        async with self._lock:
            await self._db.execute(
                "UPDATE resume_claim SET outcome = ? WHERE session = ? AND message = ?",
                (outcome, session_id, message_id),
            )

    async def wait(self, session_id: str, message_id: str, turn: bytes) -> None:
        """Keep a turn waiting for a person (`proxy.resume.waiting`), one per session."""
        async with self._lock:
            await self._db.execute(
                "INSERT OR REPLACE INTO resume_waiting VALUES (?, ?, ?, ?)",
                (session_id, message_id, time.time(), turn),
            )

    async def unwait(self, session_id: str) -> None:
        async with self._lock:
            await self._db.execute("DELETE FROM resume_waiting WHERE session = ?", (session_id,))

    async def waits(self) -> list[bytes]:
        """Every turn kept waiting, oldest first."""
        async with self._lock, self._db.execute("SELECT turn FROM resume_waiting ORDER BY since") as rows:
            return [bytes(row[0]) for row in await rows.fetchall()]

    async def _chain(self, session_id: str, prompted_by: str | None, message_id: str) -> str:
        """The first interrupted message of the person's turn: the chain of the claim whose prompt
        `prompted_by` is, else `message_id` itself."""
        if prompted_by is not None:
            query = (
                "SELECT c.chain FROM resume_prompt p JOIN resume_claim c "
                "ON c.session = p.session AND c.message = p.message WHERE p.prompt = ? AND p.session = ?"
            )
            async with self._db.execute(query, (prompted_by, session_id)) as rows:
                row = await rows.fetchone()
            if row is not None:
                return str(row[0])
        return message_id

    async def _owner_of(self, session_id: str, message_id: str) -> str:
        async with self._db.execute(
            "SELECT owner FROM resume_claim WHERE session = ? AND message = ?", (session_id, message_id)
        ) as rows:
            row = await rows.fetchone()
        return str(row[0]) if row else "unknown"
