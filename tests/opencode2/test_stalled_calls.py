"""The same command that stalls a 1.18.33 call, on the real 2.1.2 under `settle-proxy run
--stall-abort`: 2.1.2's `shell` tool ends the call once its shell exits, whatever it left
running (measured: `completed` with its output about 1.3 s after it ran, the session idle), so
no call stalls there and none is named; the background `sleep` runs on, adopted by the proxy."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from proxy.demo.model import MockModel
from tests.opencode2.conftest import real_2x_command
from tests.opencode2.servers import RealServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OPTIONS = ("--stall-after", "3", "--stall-abort", "--resume", "--grace", "0")


async def closed_call(server: RealServer, session: str) -> dict[str, Any]:
    """The session's one call, once the server itself has closed it."""
    async with asyncio.timeout(60):
        while True:
            view = await server.get(f"/api/session/{session}/message")
            calls = [
                item for m in view["data"] for item in m.get("content") or [] if item.get("type") == "tool"
            ]
            if calls and calls[0]["state"]["status"] != "running":
                found: dict[str, Any] = calls[0]
                return found
            await asyncio.sleep(0.25)


async def test_a_backgrounded_child_does_not_stall_a_2x_call(tmp_path: Path, mock_model: MockModel) -> None:
    server = RealServer(tmp_path / "server", real_2x_command(), mock_model, supervised=OPTIONS)
    await server.start()
    try:
        background = await server.running_call("sleep 90 & echo started")
        call = await closed_call(server, background.session_id)
        assert call["state"]["status"] == "completed"
        assert call["state"]["content"] == [{"type": "text", "text": "started\n"}]
        assert (await server.get("/api/session/active"))["data"] == {}
        health = await server.get("/_settle/health")
        assert health["stalls_judged"] is True
        assert health["stalled"] == []
        # Closed by the server, the call is open no more: nothing can name it from now on.
        log = (server.root / "serve.log").read_text(errors="replace")
        assert "stalled call" not in log
    finally:
        await server.stop()
