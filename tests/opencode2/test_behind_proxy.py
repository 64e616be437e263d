"""The real proxy process (`python -m proxy`) in front of the stand-in process, across a SIGKILL and a
restart of the stand-in: a client of `/api/event` is told the call failed, and `--resume` sends one
continuation through `/synthetic`; on a release, and on the `v2` branch built from source (version
`local`, only `/api/health`), compressing or not."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.integration.http_client import free_port
from tests.integration.polling import poll
from tests.integration.proxy_process import ProxyProcess
from tests.opencode2.auth import basic
from tests.opencode2.stand_in import VARIANT_FLAGS

SERVE = str(Path(__file__).parent / "serve.py")
PASSWORD = "pw"
HEADERS = {"Authorization": basic(PASSWORD)}


@asynccontextmanager
async def stand_in(database: Path, port: int, *extra: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """The stand-in on `port`, once it says it listens; SIGKILLed after (if still running)."""
    environment = {k: v for k, v in os.environ.items() if "OPENCODE" not in k} | {
        "OPENCODE_PASSWORD": PASSWORD
    }
    command = [sys.executable, SERVE, "serve", "--port", str(port), "--database", str(database), *extra]
    process = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE, env=environment)
    assert process.stdout is not None
    assert (await process.stdout.readline()).startswith(b"server listening on ")
    try:
        yield process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGKILL)
        await process.wait()


@asynccontextmanager
async def proxy_in_front(port: int, tmp_path: Path, *args: str) -> AsyncIterator[ProxyProcess]:
    proxy = ProxyProcess(
        f"http://127.0.0.1:{port}",
        tmp_path / "proxy.log",
        ("--grace", "0", *args),
        environment={"OPENCODE_SERVER_PASSWORD": PASSWORD},
    )
    await asyncio.to_thread(proxy.start)
    try:
        yield proxy
    finally:
        await asyncio.to_thread(proxy.stop)


async def until_logged(proxy: ProxyProcess, text: str) -> str:
    """The proxy's log line holding `text`, once it is written (its decision: a positive signal)."""

    def logged() -> str | None:
        return next((line for line in proxy.log().splitlines() if text in line), None)

    line: str = await asyncio.to_thread(
        poll, logged, what=f"the proxy logs {text!r}", timeout=30, interval=0.1
    )
    return line


async def api_events(
    http: aiohttp.ClientSession, proxy: ProxyProcess, session_id: str
) -> list[dict[str, Any]]:
    """`/api/event` through the proxy, reconnected until the session's execution is said to end."""
    got: list[dict[str, Any]] = []
    async with asyncio.timeout(30):
        while not (got and got[-1]["type"] == "session.execution.interrupted"):
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{proxy.url}/api/event", headers=HEADERS) as stream:
                    got += [event async for event in _session_events(stream, session_id)]
            await asyncio.sleep(0.1)  # the server is down: a client reconnects after a pause
    return got


async def _session_events(stream: aiohttp.ClientResponse, session_id: str) -> AsyncIterator[dict[str, Any]]:
    """The session's events on `stream`, up to the end of its execution (or of the stream)."""
    if stream.status != 200:
        return
    async for line in stream.content:
        if line.startswith(b"data: "):
            event = orjson.loads(line[6:])
            if event["data"].get("sessionID") == session_id:
                yield event
                if event["type"] == "session.execution.interrupted":
                    return


@pytest.mark.parametrize("variant", VARIANT_FLAGS)
async def test_a_client_of_api_event_is_told_the_call_failed_across_a_sigkill(
    tmp_path: Path, variant: str
) -> None:
    database, seed, port = tmp_path / "db.json", tmp_path / "seed.json", free_port()
    flags = VARIANT_FLAGS[variant]
    async with (
        stand_in(database, port, "--seed", str(seed), *flags) as server,
        proxy_in_front(port, tmp_path) as proxy,
    ):
        call = orjson.loads(seed.read_bytes())
        await until_logged(proxy, "following /api/event")
        async with aiohttp.ClientSession() as http:  # it accepts gzip
            told = asyncio.create_task(api_events(http, proxy, call["session_id"]))
            server.send_signal(signal.SIGKILL)
            await server.wait()
            async with stand_in(database, port, *flags):
                failed, ended = (await told)[-2:]
    assert failed["type"] == "session.tool.failed"
    assert failed["data"]["id"] == call["call_id"]
    assert failed["data"]["error"] == {"type": "aborted", "message": "Tool execution interrupted: shell"}
    assert ended["data"] == {"sessionID": call["session_id"], "reason": "shutdown"}


@pytest.mark.parametrize("variant", ["2.1.2", "from source"])
async def test_resume_sends_one_continuation_through_synthetic_across_a_sigkill(
    tmp_path: Path, variant: str
) -> None:
    """On the from-source build the readiness wait asks `/api/health`, the route the line was
    found on (it has no `/api/info`)."""
    database, seed, port = tmp_path / "db.json", tmp_path / "seed.json", free_port()
    flags, variant_flags = ("--resume", "--write-back", "api"), VARIANT_FLAGS[variant]
    async with (
        stand_in(database, port, "--seed", str(seed), *variant_flags) as server,
        proxy_in_front(port, tmp_path, *flags) as proxy,
    ):
        call = orjson.loads(seed.read_bytes())
        await until_logged(proxy, "following /api/event")
        server.send_signal(signal.SIGKILL)
        await server.wait()
        async with stand_in(database, port, *variant_flags):
            decided = await until_logged(proxy, f"resume resumed: session {call['session_id']}")
    messages = orjson.loads(database.read_bytes())["messages"][call["session_id"]]
    continuations = [m for m in messages if m["type"] == "synthetic"]
    assert "2.x's own drain" in decided
    assert len(continuations) == 1
    assert "- shell: `sleep 20`" in continuations[0]["text"]
    assert [m["type"] for m in messages][-2:] == ["assistant", "idle"]
