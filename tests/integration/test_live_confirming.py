"""A turn that starts while a live settle is confirming gets no false idle (real opencode 1.18.33).

The proxy runs in-process in front of the real server, so that the test can land the new turn
inside the confirmation for certain: a v1 tool is left running by a SIGKILL, the server restarts,
the proxy's live settle waits the grace period and re-reads the stale message, and just before
that read reaches the server the test opens a client stream through the proxy, starts a new turn
in the session (a long tool: it stays busy) and waits until the proxy's followed stream has
heard it. The client stream must then never show the session idle, nor any tool interrupted, and
the proxy must say it withdrew the confirmation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient
from yarl import URL

from proxy.demo.model import MockModel, Plan
from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.tracker import FollowedEvent
from proxy.service.app import ASSEMBLY, create_app
from proxy.service.config import Settings
from proxy.testing import idle

from .http_client import request
from .opencode_server import OpencodeServer
from .races import interrupted
from .turns import Turn, send_prompt, start_v1_turn, wait_tool_running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GRACE_S = 1.0
STALE, NEW = "live confirming stale", "live confirming new turn"
ProxyClient = TestClient[web.Request, web.Application]
ClientFactory = Callable[[web.Application], Awaitable[ProxyClient]]


class _Heard:
    """A listener on the proxy's followed stream: `heard` is set once `wanted` takes an event."""

    def __init__(self, wanted: Callable[[FollowedEvent], bool]) -> None:
        self._wanted = wanted
        self.heard = asyncio.Event()

    def following(self) -> None:
        pass

    def event(self, event: FollowedEvent) -> None:
        if self._wanted(event):
            self.heard.set()


async def _collect(response: ClientResponse, into: list[Any]) -> None:
    while line := await response.content.readline():
        if line.startswith(b"data: "):
            into.append(orjson.loads(line[6:]).get("payload"))


def _about(session_id: str, payloads: list[Any]) -> list[dict[str, Any]]:
    return [
        p
        for p in payloads
        if isinstance(p, dict) and (p.get("properties") or {}).get("sessionID") == session_id
    ]


def _says_idle(payload: dict[str, Any]) -> bool:
    status = payload["properties"].get("status") or {}
    return payload["type"] == "session.idle" or (
        payload["type"] == "session.status" and status.get("type") == "idle"
    )


def _tool_running(event: FollowedEvent) -> bool:
    part = event.properties.get("part") or {}
    return event.kind == "message.part.updated" and (part.get("state") or {}).get("status") == "running"


def _busy(event: FollowedEvent) -> bool:
    return event.kind == "session.status" and (event.properties.get("status") or {}).get("type") == "busy"


def _shows_interrupted(payload: dict[str, Any]) -> bool:
    part = payload["properties"].get("part") or {}
    return payload["type"] == "message.part.updated" and part.get("type") == "tool" and interrupted(part)


async def test_a_turn_started_while_a_live_settle_confirms_gets_no_false_idle(
    opencode: OpencodeServer,
    mock_model: MockModel,
    monkeypatch: pytest.MonkeyPatch,
    aiohttp_client: ClientFactory,
) -> None:
    mock_model.plan(STALE, Plan(command="echo hello && sleep 600"))
    mock_model.plan(NEW, Plan(command="echo again && sleep 600", each_prompt=True))
    seen: list[Any] = []
    restarted = asyncio.Event()
    hook: dict[str, Any] = {}

    class NewTurnBeforeTheRead(UpstreamApi):
        """The proxy's upstream client, except that the confirmation's read of the stale message
        waits until a client stream is open through the proxy and the proxy has heard a new turn
        start in the session."""

        async def get(self, path: str, credentials: Credentials, **params: str) -> Any:
            if path == hook.get("read") and "reader" not in hook:
                await restarted.wait()  # a prompt before the warm-up could fail, and go idle itself
                hook["reader"] = asyncio.create_task(_collect(await client.get("/global/event"), seen))
                await asyncio.to_thread(send_prompt, opencode.url, turn, NEW)
                await asyncio.wait_for(busy.heard.wait(), 30)
            return await super().get(path, credentials, **params)

    monkeypatch.setattr("proxy.service.assembly.UpstreamApi", NewTurnBeforeTheRead)
    client = await aiohttp_client(create_app(Settings(upstream=URL(opencode.origin), grace=GRACE_S)))
    started: dict[str, str] = {}
    part = _Heard(lambda e: e.session_id == started.get("session") and _tool_running(e))
    client.app[ASSEMBLY].started.tracker.listeners.append(part)
    turn: Turn = await asyncio.to_thread(start_v1_turn, opencode.url, opencode.project, STALE)
    started["session"] = turn.session_id  # the tool runs once the model answers, well after this
    running = await asyncio.to_thread(wait_tool_running, opencode.url, turn)
    busy = _Heard(lambda e: e.session_id == turn.session_id and _busy(e))
    hook["read"] = f"/session/{turn.session_id}/message/{running.tool['messageID']}"
    try:
        await asyncio.wait_for(part.heard.wait(), 30)  # the proxy saw the tool running (it still is)
        client.app[ASSEMBLY].started.tracker.listeners.append(busy)  # from now on, only the new turn's
        await asyncio.to_thread(opencode.crash)
        await asyncio.to_thread(opencode.restart)
        restarted.set()
        await asyncio.wait_for(busy.heard.wait(), 60)
        await idle(client.app)
        metrics = await (await client.get("/_settle/metrics")).text()
        about = _about(turn.session_id, seen)  # before the abort below ends the new turn
    finally:
        await asyncio.to_thread(request, "POST", f"{opencode.url}/session/{turn.session_id}/abort")
        if "reader" in hook:
            hook["reader"].cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await hook["reader"]

    assert "reader" in hook, "the confirmation never read the stale message"
    print(f"\nclient stream: {[p['type'] for p in about]}")
    busy_at = next(i for i, p in enumerate(about) if p["type"] == "session.status")
    assert [p for p in about[busy_at:] if _says_idle(p)] == [], "a busy session announced idle"
    assert [p for p in about if _shows_interrupted(p)] == []
    assert 'settle_proxy_withdrawn_confirmations_total{confirmation="open parts"} 1.0' in metrics
