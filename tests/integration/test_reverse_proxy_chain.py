"""The example configs work: nginx or Caddy -> settle-proxy -> the real opencode 1.18.33.

Through the whole chain: a crash-orphaned tool shows settled, an event stream delivers an
event as it happens, and a PTY echoes what is typed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from .front_proxies import FrontProxy
from .http_client import request as http_request
from .opencode_server import OpencodeServer, directory_header
from .proxy_process import ProxyProcess
from .turns import Turn, fetch_settled, start_turn, wait_tool_running

pytestmark = pytest.mark.integration

KINDS = ("nginx", "caddy")


@pytest.fixture(scope="module")
def stale_turn(opencode: OpencodeServer) -> Turn:
    """A v1 turn whose bash call the crash orphaned."""
    turn = start_turn("v1", opencode.url, opencode.project, "chain stale v1")
    wait_tool_running(opencode.url, turn)
    opencode.crash()
    opencode.restart()
    return turn


@pytest.fixture(params=KINDS)
def chain(request: pytest.FixtureRequest, opencode: OpencodeServer, tmp_path: Path) -> Iterator[str]:
    proxy = ProxyProcess(opencode.url, tmp_path / "proxy.log")
    front = FrontProxy(request.param, proxy.url, tmp_path / request.param)
    try:
        proxy.start()
        front.start()
        yield front.url
    finally:
        front.stop()
        proxy.stop()


def test_settled_view_through_the_chain(chain: str, stale_turn: Turn, opencode: OpencodeServer) -> None:
    reply = fetch_settled(chain + stale_turn.messages_path)
    assert reply.headers.get("x-settle-settled") == "1"
    tool = next(p for m in reply.json() for p in m["parts"] if p["type"] == "tool")
    assert tool["state"]["status"] == "error"
    assert tool["state"]["metadata"]["interrupted"] is True
    direct = http_request("GET", opencode.url + stale_turn.messages_path).json()
    assert next(p for m in direct for p in m["parts"] if p["type"] == "tool")["state"]["status"] == "running"


async def test_event_arrives_through_the_chain(chain: str, opencode: OpencodeServer) -> None:
    headers = directory_header(opencode.project)
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as client,
        client.get(f"{chain}/event", headers=headers) as stream,
    ):
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        first = await asyncio.wait_for(stream.content.readline(), 10)
        assert b"server.connected" in first
        created = await client.post(f"{chain}/session", json={}, headers=headers)
        session_id = (await created.json())["id"]
        while True:
            line = await asyncio.wait_for(stream.content.readline(), 10)
            if b"session.created" in line and session_id.encode() in line:
                break


async def test_pty_round_trip_through_the_chain(chain: str) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as client:
        created = await client.post(f"{chain}/pty", json={"command": "/bin/sh"})
        assert created.status == 200
        pty = (await created.json())["id"]
        try:
            async with client.ws_connect(f"{chain}/pty/{pty}/connect") as socket:
                await socket.send_str("echo chain-$((6*7))\n")
                seen = ""
                while "chain-42" not in seen:
                    message = await asyncio.wait_for(socket.receive(), 10)
                    assert message.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), message
                    if message.type is aiohttp.WSMsgType.TEXT:
                        seen += message.data
            resized = await client.put(f"{chain}/pty/{pty}", json={"size": {"rows": 30, "cols": 100}})
            assert resized.status == 200
        finally:
            closed = await client.delete(f"{chain}/pty/{pty}")
            assert closed.status == 200
