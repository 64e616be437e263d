"""The stand-in as a process: it starts as plain 2.x `serve` does, survives a SIGKILL with its messages,
and a restart makes a new password unless one is given in the environment."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import orjson

from tests.opencode2.auth import basic

SERVE = str(Path(__file__).parent / "serve.py")

Started = tuple[asyncio.subprocess.Process, list[str]]


@asynccontextmanager
async def _serve(database: Path, *extra: str, env: dict[str, str] | None = None) -> AsyncIterator[Started]:
    """Start the stand-in; yield it once it printed where it listens (and, without a password in
    the environment, its password); kill it after."""
    environment = {key: value for key, value in os.environ.items() if "OPENCODE" not in key} | (env or {})
    command = [sys.executable, SERVE, "serve", "--port", "0", "--database", str(database), *extra]
    process = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE, env=environment)
    assert process.stdout is not None
    lines = [(await process.stdout.readline()).decode().strip()]
    if not env:
        lines.append((await process.stdout.readline()).decode().strip())
    try:
        yield process, lines
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


def _url(lines: list[str]) -> str:
    assert lines[0].startswith("server listening on http://127.0.0.1:")
    return lines[0].removeprefix("server listening on ")


async def _get(
    url: str, password: str, check: Callable[[int], bool] = lambda status: status == 200
) -> object:
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, headers={"Authorization": basic(password)}) as answer,
    ):
        assert check(answer.status), answer.status
        return await answer.json(content_type=None)


async def test_a_killed_stand_in_restarts_with_its_messages_and_a_new_password(tmp_path: Path) -> None:
    database, seed = tmp_path / "db.json", tmp_path / "seed.json"
    async with _serve(database, "--seed", str(seed)) as (process, lines):
        first_password = lines[1].removeprefix("server password ")
        assert lines[1].startswith("server password ")
        assert first_password
        call = orjson.loads(seed.read_bytes())
        path = f"{_url(lines)}/api/session/{call['session_id']}/message/{call['message_id']}"
        running = await _get(path, first_password)
        process.send_signal(signal.SIGKILL)
    async with _serve(database) as (_, lines):
        password = lines[1].removeprefix("server password ")
        assert password != first_password
        path = f"{_url(lines)}/api/session/{call['session_id']}/message/{call['message_id']}"
        await _get(path, first_password, lambda status: status == 401)
        assert await _get(path, password) == running
        async with aiohttp.ClientSession() as http:
            synthetic = f"{_url(lines)}/api/session/{call['session_id']}/synthetic"
            go_on = {"text": "Go on."}
            async with http.post(synthetic, json=go_on, headers={"Authorization": basic(password)}) as answer:
                assert answer.status == 200
        settled = await _get(path, password)
        assert isinstance(settled, dict)
        assert settled["data"]["content"][0]["state"]["status"] == "error"


async def test_a_password_from_the_environment_is_kept_and_not_printed(tmp_path: Path) -> None:
    async with _serve(tmp_path / "db.json", env={"OPENCODE_SERVER_PASSWORD": "secret"}) as (_, lines):
        assert lines == [lines[0]]
        assert await _get(f"{_url(lines)}/api/session/active", "secret") == {"data": {}}


async def test_a_booting_stand_in_answers_503_first(tmp_path: Path) -> None:
    async with _serve(tmp_path / "db.json", "--boot-seconds", "60", env={"OPENCODE_PASSWORD": "pw"}) as (
        _,
        lines,
    ):
        await _get(f"{_url(lines)}/api/info", "pw", lambda status: status == 503)
