"""What the followed stream showed open, kept in the state database for the proxy that runs next.

A proxy killed with its server (`run`: the server dies with it) leaves clients that reconnect to
the next proxy on the same address with the state its stream showed them: a part running, the
session busy, a message being written. The next proxy never saw any of it, and the server,
restarted, announces nothing of a turn it lost. So the stream memory (`memory`) is written
through to the state database, one row per open part, busy session and unfinished message, keyed
by the proxy's own address (the one its clients reconnect to); the next proxy loads it before it
follows the server, and confirms what it holds as after a loss of the stream: told only once a
fresh reading says the session is inactive.

A write is a few rows in one transaction, made on the loop's next turn after the memory changed
and never on the request path; one that fails is said once in the log and the memory goes on
in the process alone (what the next proxy is not told it confirms on a client's fetch, as before).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiosqlite
import orjson

from proxy.addons.live.memory import REMEMBERED, Kind, OpenCall, Place, Remembered
from rules import V1, OpenTool

log = logging.getLogger(__name__)

KINDS: tuple[Kind, ...] = ("part", "session", "message", "call")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS stream_memory (
    address TEXT NOT NULL, kind TEXT NOT NULL, key TEXT NOT NULL, place TEXT NOT NULL,
    PRIMARY KEY (address, kind, key)
)
"""
_BUSY_TIMEOUT_MS = 5000


@dataclass(frozen=True, slots=True)
class Inherited:
    """One thing the stream showed open, as the proxy before kept it."""

    kind: Kind
    key: str
    place: Remembered


class StoredMemory:
    """The stream memory of the proxy listening on `address`, in an open state database; use
    `StoredMemory.open(path, address)`."""

    def __init__(self, connection: aiosqlite.Connection, address: str) -> None:
        self._db = connection
        self.address = address
        self._pending: dict[tuple[Kind, str], Remembered | None] = {}
        self._writing: asyncio.Task[None] | None = None
        self._failed = False

    @classmethod
    @asynccontextmanager
    async def open(cls, path: Path, address: str) -> AsyncIterator[StoredMemory]:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        async with aiosqlite.connect(path) as connection:
            await connection.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            await connection.execute(_SCHEMA)
            await connection.commit()
            kept = cls(connection, address)
            try:
                yield kept
            finally:
                await kept.close()

    async def load(self) -> list[Inherited]:
        """What the proxy before kept, the newest `REMEMBERED` of each kind (the rest are deleted:
        its memory forgot them too)."""
        found: list[Inherited] = []
        for kind in KINDS:
            rows = await self._db.execute_fetchall(
                "SELECT rowid, key, place FROM stream_memory WHERE address = ? AND kind = ? "
                "ORDER BY rowid DESC",
                (self.address, kind),
            )
            rows = list(rows)
            if len(rows) > REMEMBERED:
                oldest = rows[REMEMBERED - 1][0]
                await self._db.execute(
                    "DELETE FROM stream_memory WHERE address = ? AND kind = ? AND rowid < ?",
                    (self.address, kind, oldest),
                )
                await self._db.commit()
            found += [
                kept for _, key, place in reversed(rows[:REMEMBERED]) if (kept := _read(kind, key, place))
            ]
        return found

    def keep(self, kind: Kind, key: str, place: Remembered) -> None:
        self._change(kind, key, place)

    def drop(self, kind: Kind, key: str) -> None:
        self._change(kind, key, None)

    @property
    def busy(self) -> bool:
        return self._writing is not None

    async def idle(self) -> None:
        """Wait until every change made so far is written."""
        while (writing := self._writing) is not None:
            await asyncio.gather(writing, return_exceptions=True)

    async def close(self) -> None:
        await self.idle()

    def _change(self, kind: Kind, key: str, place: Remembered | None) -> None:
        if self._failed:
            return
        self._pending[kind, key] = place
        if self._writing is None:
            self._writing = asyncio.create_task(self._write(), name="stream memory write")

    async def _write(self) -> None:
        try:
            while self._pending and not self._failed:
                pending, self._pending = self._pending, {}
                await self._written(pending)
        finally:
            self._writing = None

    async def _written(self, pending: dict[tuple[Kind, str], Remembered | None]) -> None:
        kept = [(self.address, kind, key, _json(place)) for (kind, key), place in pending.items() if place]
        dropped = [(self.address, kind, key) for (kind, key), place in pending.items() if place is None]
        try:
            if kept:
                await self._db.executemany("INSERT OR REPLACE INTO stream_memory VALUES (?, ?, ?, ?)", kept)
            if dropped:
                await self._db.executemany(
                    "DELETE FROM stream_memory WHERE address = ? AND kind = ? AND key = ?", dropped
                )
            await self._db.commit()
        except (sqlite3.Error, OSError) as error:
            self._failed = True
            self._pending.clear()
            with contextlib.suppress(sqlite3.Error, OSError):
                await self._db.rollback()
            log.warning(
                "what the event stream showed open is no longer kept for the proxy that runs next: %s",
                error,
            )


def _json(place: Remembered) -> str:
    fields: dict[str, str | None] = {
        "session": place.session_id,
        "message": place.message_id,
        "directory": place.directory,
    }
    if isinstance(place, OpenCall):
        fields |= {"key": place.key}
    else:
        fields |= {"project": place.project}
    if isinstance(place, OpenTool):
        fields |= {"part": place.part, "tool": place.tool}
    return orjson.dumps(fields).decode()


def _read(kind: Kind, key: str, text: str) -> Inherited | None:
    """A row as the proxy before kept it; one this proxy cannot read is left out."""
    try:
        fields = orjson.loads(text)
        session, message = str(fields["session"]), str(fields["message"])
        directory, project = fields.get("directory"), fields.get("project")
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    if kind == "call":
        return Inherited(
            kind, key, OpenCall(session, message, key, str(fields.get("key") or "id"), directory)
        )
    if kind == "part":
        tool = fields.get("tool")
        part = OpenTool(V1.api, session, message, key, tool, directory=directory, project=project)
        return Inherited(kind, key, part)
    return Inherited(kind, key, Place(session, message, directory, project))
