"""The soak on the real 2.1.2: `settle-proxy run --resume -- opencode serve`, the mock model, and
SIGKILLs at seeded random moments, round after round in one data directory, with a client of
`/api/event` following through the proxy throughout. Each round starts two turns whose `shell`
call runs (`echo hello && sleep 600`, safe to have been cut), waits a random moment, and kills by
its kind:

- `server`: the server's own pid (the proxy restarts it): every call settled in the views, the
  follower told each call failed, each turn continued exactly once, and each session idle.
- `proxy`: the supervising proxy (its server dies with it), then the proxy started again: every
  call settled and told, and no turn continued (the proxy that saw them run is gone).

`SETTLE_SOAK_ROUNDS` (default 2, one of each kind) sets how many rounds, `SETTLE_SOAK_SEED` the
first seed; a failing round prints its seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.demo.model import MockModel
from tests.opencode2.conftest import real_2x_command
from tests.opencode2.servers import RealServer
from tests.opencode2.stand_in import RunningCall

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KINDS = ("server", "proxy")
ROUND_S = 90.0
CONTINUED = "The opencode server stopped while this turn was running"
"""The start of the resume's prompt (`proxy.resume.text`)."""


class Follower:
    """A client of the proxy's `/api/event`, reconnecting after every cut as 2.x's clients do; the
    ids of the calls it was told failed."""

    def __init__(self, server: RealServer) -> None:
        self.server, self.failed, self.seen = server, set[str](), set[str]()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Follower:
        self._task = asyncio.create_task(self._follow())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _follow(self) -> None:
        async with aiohttp.ClientSession(headers=self.server.headers) as http:
            while True:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(f"{self.server.url}/api/event") as stream:
                        async for line in stream.content:
                            if line.startswith(b"data: "):
                                self._heard(orjson.loads(line[6:]))
                await asyncio.sleep(0.2)

    def _heard(self, event: dict[str, Any]) -> None:
        call = event.get("data", {}).get("id")
        if event.get("type") == "session.tool.called" and isinstance(call, str):
            self.seen.add(call)
        if event.get("type") == "session.tool.failed" and isinstance(call, str):
            self.failed.add(call)


@contextlib.asynccontextmanager
async def supervised(root: Path, model: MockModel) -> AsyncIterator[RealServer]:
    server = RealServer(root, real_2x_command(), model, supervised=("--resume", "--grace", "0"))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def server_pid(server: RealServer) -> int:
    pid: int = (await server.get("/api/info"))["pid"]
    return pid


async def until(check: Any) -> None:
    """Once `await check()` is true, asked every 0.25 s within the round's deadline; a request the
    restarting server (or proxy) did not answer is a not yet."""
    async with asyncio.timeout(ROUND_S):
        while True:
            with contextlib.suppress(AssertionError, aiohttp.ClientError, TimeoutError):
                if await check():
                    return
            await asyncio.sleep(0.25)


async def settled(server: RealServer, call: RunningCall) -> bool:
    view = await server.get(f"/api/session/{call.session_id}/message/{call.message_id}")
    tools = [item for item in view["data"]["content"] if item.get("id") == call.call_id]
    return bool(tools) and tools[0]["state"]["status"] == "error"


async def idle(server: RealServer, call: RunningCall) -> bool:
    active = (await server.get("/api/session/active"))["data"]
    newest = (await server.get(f"/api/session/{call.session_id}/message?limit=1"))["data"]
    return call.session_id not in active and bool(newest) and newest[0]["type"] == "idle"


async def soak_round(server: RealServer, model: MockModel, follower: Follower, seed: int) -> list[str]:
    rng, kind = random.Random(seed), KINDS[seed % len(KINDS)]
    commands = [f"echo round {seed} turn {turn} && sleep 600" for turn in range(2)]
    calls = [await server.running_call(command) for command in commands]
    before = len(model.requests())
    await until(_seen(follower, calls))
    await asyncio.sleep(rng.uniform(0, 2.0))
    if kind == "server":
        os.kill(await server_pid(server), signal.SIGKILL)
    else:
        await server.kill()
        await server.restart()
    problems = []
    for call in calls:
        try:
            await until(lambda c=call: settled(server, c))
            await until(_told(follower, call))
            if kind == "server":
                await until(lambda c=call: idle(server, c))
        except TimeoutError:
            problems.append(f"{call}: not settled, told and idle within {ROUND_S:g} s")
    counted = {command: _continued(model, command, before) for command in commands}
    expected = 1 if kind == "server" else 0
    problems += [f"`{c}`: continued {n} times, not {expected}" for c, n in counted.items() if n != expected]
    return [f"round {seed} ({kind}): {problem}" for problem in problems]


def _seen(follower: Follower, calls: list[RunningCall]) -> Any:
    async def seen() -> bool:
        return all(call.call_id in follower.seen for call in calls)

    return seen


def _told(follower: Follower, call: RunningCall) -> Any:
    async def told() -> bool:
        return call.call_id in follower.failed

    return told


def _continued(model: MockModel, command: str, since: int) -> int:
    """The continuations the model was asked for since request `since` that name `command`."""
    asked = model.requests()[since:]
    return sum(1 for r in asked if r.tools and CONTINUED in (p := r.latest_prompt or "") and command in p)


async def test_soak_2x(tmp_path: Path, mock_model: MockModel) -> None:
    rounds = int(os.environ.get("SETTLE_SOAK_ROUNDS", "2"))
    first = int(os.environ.get("SETTLE_SOAK_SEED", random.randrange(1_000_000)))
    failed: list[str] = []
    async with supervised(tmp_path / "server", mock_model) as server, Follower(server) as follower:
        for seed in range(first, first + rounds):
            failed += await soak_round(server, mock_model, follower, seed)
    assert not failed, "\n".join(failed)
