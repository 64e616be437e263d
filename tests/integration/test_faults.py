"""The real opencode 1.18.33 SIGKILLed under the proxy while a request, two event streams and a PTY
WebSocket are in flight through it, then restarted.

What a client must see: the pending request a JSON 502, each event stream cut as the server's
was (clients reconnect after an error; a clean end would stop the JS SDK for good), the PTY a close frame with a code it may receive; meanwhile the proxy answers
everyone else (health 503 with `reachable: false`, forwarded routes 502 JSON), a proxy started
while the server is down starts anyway and says so, and once the server is back both proxies
serve again without a restart: requests, streams and a new PTY.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from yarl import URL

from proxy.demo.model import MockModel, Plan

from .opencode_server import OpencodeServer, directory_header
from .proxy_process import ProxyProcess
from .turns import Turn, wait_tool_running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=60)
BOUND_S = 15.0
"""How long any client may wait to learn of the crash, or for the proxy to recover."""
RESERVED_CLOSE_CODES = (1005, 1006, 1015)


async def _v1_session(session: aiohttp.ClientSession, proxy: URL, directory: Path) -> str:
    async with session.post(proxy / "session", json={}, headers=directory_header(directory)) as created:
        assert created.status == 200, await created.text()
        return str((await created.json())["id"])


async def _post_and_read(
    session: aiohttp.ClientSession, url: URL, body: Any, headers: dict[str, str]
) -> tuple[int, str, bytes]:
    async with session.post(url, json=body, headers=headers) as answer:
        return answer.status, answer.content_type, await answer.read()


async def _open_pty(session: aiohttp.ClientSession, proxy: URL) -> aiohttp.ClientWebSocketResponse:
    """A PTY through the proxy, proven alive by a command's output."""
    async with session.post(proxy / "pty", json={}) as created:
        assert created.status == 200, await created.text()
        pty = str((await created.json())["id"])
    socket = await session.ws_connect(proxy / "pty" / pty / "connect")
    await socket.send_str("echo marker-$((40+2))\n")
    await _read_until(socket, "marker-42")
    return socket


async def _read_until(socket: aiohttp.ClientWebSocketResponse, text: str) -> None:
    seen = ""
    deadline = time.monotonic() + BOUND_S
    while text not in seen:
        message = await socket.receive(timeout=max(deadline - time.monotonic(), 0.1))
        assert message.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), message
        seen += message.data if isinstance(message.data, str) else message.data.decode(errors="replace")


async def _subscribe(session: aiohttp.ClientSession, url: URL) -> aiohttp.ClientResponse:
    stream = await session.get(url)
    assert stream.status == 200
    assert b"server.connected" in await asyncio.wait_for(stream.content.readuntil(b"\n\n"), BOUND_S)
    return stream


async def _close_frame(socket: aiohttp.ClientWebSocketResponse) -> aiohttp.WSMessage:
    """The first message that is not terminal output: what the proxy did when the PTY died."""
    while True:
        message = await socket.receive(timeout=BOUND_S)
        if message.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
            return message


async def _status(session: aiohttp.ClientSession, url: URL) -> tuple[int, Any]:
    async with session.get(url) as answer:
        return answer.status, await answer.json(content_type=None)


async def _until_status(session: aiohttp.ClientSession, url: URL, want: int) -> Any:
    deadline = time.monotonic() + BOUND_S
    while True:
        status, body = await _status(session, url)
        if status == want:
            return body
        assert time.monotonic() < deadline, f"{url} still answers {status}: {body}"
        await asyncio.sleep(0.2)


async def _assert_down(session: aiohttp.ClientSession, proxy: URL, *, has_heard_it: bool = True) -> None:
    """While the server is down the proxy answers, and says why: in its health once it has heard the
    server without credentials (so it knows the server wants none); before that only in its probe."""
    assert await _until_status(session, proxy / "_settle" / "up", 503) == {"status": "down"}
    health = await _until_status(session, proxy / "_settle" / "health", 503)
    if has_heard_it:
        assert health["upstream"]["reachable"] is False
    else:
        assert health["error"] == "unknown", health
    status, body = await _status(session, proxy / "session" / "status")
    assert (status, body["error"]) == (502, "bad_gateway")


async def _assert_recovered(session: aiohttp.ClientSession, proxy: URL) -> None:
    """Back without a proxy restart: requests, a stream and a new PTY.

    Liveness from events is not required here: the proxy's own `/global/event` subscription
    can hang for good when it lands the instant the server's port opens (see
    `test_event_subscription_the_upstream_never_answers_is_retried`).
    """
    health = await _until_status(session, proxy / "_settle" / "health", 200)
    assert health["upstream"]["reachable"] is True
    assert (await _status(session, proxy / "session" / "status"))[0] == 200
    (await _subscribe(session, proxy / "event")).close()
    socket = await _open_pty(session, proxy)
    await socket.close()


async def test_server_killed_mid_request_stream_and_websocket(
    opencode: OpencodeServer, mock_model: MockModel, proxy_url: str, tmp_path: Path
) -> None:
    proxy = URL(proxy_url)
    prompt = "fault: killed mid-request"
    mock_model.plan(prompt, Plan())
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
        session_id = await _v1_session(session, proxy, opencode.project)
        # v1 `POST /session/{id}/message` answers only when the turn ends: the natural request
        # to be in flight when the server dies.
        pending = asyncio.create_task(
            _post_and_read(
                session,
                proxy / "session" / session_id / "message",
                {"parts": [{"type": "text", "text": prompt}]},
                directory_header(opencode.project),
            )
        )
        await asyncio.to_thread(
            wait_tool_running, opencode.url, Turn("v1", session_id, opencode.project, prompt)
        )
        streams = [
            await _subscribe(session, proxy / "event"),
            await _subscribe(session, proxy / "global" / "event"),
        ]
        pty = await _open_pty(session, proxy)

        await asyncio.to_thread(opencode.crash)
        late = ProxyProcess(opencode.url, tmp_path / "late-proxy.log")
        try:
            status, content_type, body = await asyncio.wait_for(pending, BOUND_S)
            assert (status, content_type) == (502, "application/json"), body[:300]
            for stream in streams:
                with pytest.raises(aiohttp.ClientPayloadError):
                    await asyncio.wait_for(stream.read(), BOUND_S)
            closing = await _close_frame(pty)
            assert closing.type is aiohttp.WSMsgType.CLOSE, closing
            assert closing.data not in RESERVED_CLOSE_CODES, f"close code {closing.data} must never be sent"
            await _assert_down(session, proxy)
            await asyncio.to_thread(late.start)
            await _assert_down(session, URL(late.url), has_heard_it=False)
        finally:
            await asyncio.to_thread(opencode.restart)
        try:
            await _assert_recovered(session, proxy)
            await _assert_recovered(session, URL(late.url))
        finally:
            await asyncio.to_thread(late.stop)
