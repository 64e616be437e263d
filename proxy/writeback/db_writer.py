"""`--write-back db`: settlements written straight into `opencode.db`."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from proxy.opencode.client import Credentials
from proxy.writeback.database import OpencodeDatabase
from proxy.writeback.modes import WriteBackMode
from proxy.writeback.scheduler import Confirm, Written
from rules import Api


class DbWriter:
    """Serializes passes over one connection: a connection holds one transaction at a time."""

    mode = WriteBackMode.DB

    def __init__(self, database: OpencodeDatabase) -> None:
        self._database = database
        self._lock = asyncio.Lock()

    async def write(
        self, api: Api, session_id: str, credentials: Credentials, targets: Collection[str], confirm: Confirm
    ) -> list[Written]:
        del credentials  # the database needs none; `confirm` asks the server with them
        async with self._lock:
            return await self._database.settle_session(api, session_id, targets, confirm)
