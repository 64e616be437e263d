"""The real proxy process (`python -m proxy`) in front of a 2.x server process across a SIGKILL and a
restart of the server: views are settled, a client of `/api/event` is told the call failed, write-back
is refused with nothing written, and health names the server. Each scene runs against the stand-in and,
when `SETTLE_TEST_OPENCODE2` names one, a real 2.x server (`servers.py`); `--resume` sends one
continuation through `/synthetic` (the stand-in only)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.demo.model import MockModel, RecordedRequest
from tests.integration.http_client import request, with_credentials
from tests.integration.polling import poll
from tests.integration.proxy_process import ProxyProcess, wait_all_decided
from tests.opencode2.conftest import real_2x_command
from tests.opencode2.database import opencode_sqlite
from tests.opencode2.servers import RealServer, Server2x, StandInServer
from tests.opencode2.stand_in import VARIANT_FLAGS, RunningCall

INTERRUPTED = {"type": "aborted", "message": "Tool execution interrupted: shell"}


@asynccontextmanager
async def proxy_in_front(server: Server2x, tmp_path: Path, *args: str) -> AsyncIterator[ProxyProcess]:
    proxy = ProxyProcess(
        server.url,
        tmp_path / "proxy.log",
        ("--grace", "0", *args),
        environment={"OPENCODE_PASSWORD": server.password},
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


async def through(proxy: ProxyProcess, server: Server2x, path: str) -> Any:
    """`path` through the proxy, parsed."""
    async with (
        aiohttp.ClientSession(headers=server.headers) as http,
        http.get(f"{proxy.url}{path}", timeout=aiohttp.ClientTimeout(total=30)) as answer,
    ):
        assert answer.status == 200, (path, answer.status)
        return await answer.json(content_type=None)


async def settled_through(proxy: ProxyProcess, server: Server2x, path: str, call: RunningCall) -> Any:
    """`path` through the proxy once it shows `call` settled: a view read within 2 s of the call's
    last sign of life is left open (`rules.liveness.FRESH_MARGIN_MS`), and a real server's crash
    and restart take less."""
    async with asyncio.timeout(30):
        while True:
            view = await through(proxy, server, path)
            messages = view["data"] if isinstance(view["data"], list) else [view["data"]]
            tools = [tool_of(m, call) for m in messages if m["id"] == call.message_id]
            if tools and tools[0]["state"]["status"] != "running":
                return view
            await asyncio.sleep(0.25)


async def poll_async(found: Callable[[], list[RecordedRequest]], what: str) -> list[RecordedRequest]:
    """`found()` once it is not empty (a positive signal), polled up to 60 s."""
    return await asyncio.to_thread(poll, lambda: found() or None, what=what, timeout=60)


def _continued(model: MockModel) -> list[RecordedRequest]:
    """The turn's requests the model answered with text (a title request offers no tools)."""
    return [r for r in model.requests() if r.decision == "text" and r.tools]


def tool_of(message: dict[str, Any], call: RunningCall) -> dict[str, Any]:
    (tool,) = [item for item in message["content"] if item.get("id") == call.call_id]
    return dict(tool)


async def crashed(server: Server2x) -> RunningCall:
    """A call left running by a SIGKILL of the server, which is then restarted."""
    call = await server.running_call()
    await server.kill()
    await server.restart()
    return call


async def api_events(
    http: aiohttp.ClientSession, proxy: ProxyProcess, server: Server2x, session_id: str
) -> list[dict[str, Any]]:
    """`/api/event` through the proxy, reconnected until the session's execution is said to end."""
    got: list[dict[str, Any]] = []
    async with asyncio.timeout(120):
        while not (got and got[-1]["type"] == "session.execution.interrupted"):
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{proxy.url}/api/event", headers=server.headers) as stream:
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


async def test_views_are_settled_after_a_crash(server_2x: Server2x, tmp_path: Path) -> None:
    call = await crashed(server_2x)
    one = f"/api/session/{call.session_id}/message/{call.message_id}"
    async with proxy_in_front(server_2x, tmp_path) as proxy:
        stored = tool_of((await server_2x.get(one))["data"], call)
        shown = tool_of((await settled_through(proxy, server_2x, one, call))["data"], call)
        listed = await through(proxy, server_2x, f"/api/session/{call.session_id}/message")
    (message,) = [m for m in listed["data"] if m["id"] == call.message_id]
    assert stored["state"]["status"] == "running"
    assert shown["state"] == {"status": "error", "input": stored["state"]["input"], "error": INTERRUPTED}
    assert tool_of(message, call)["state"] == shown["state"]
    assert message["time"]["completed"] == shown["time"]["completed"]


async def test_the_settled_view_is_what_the_server_settles_on_the_next_prompt(
    server_2x: Server2x, tmp_path: Path
) -> None:
    """The proxy's view of the crashed turn, against the server's own once a prompt sent to it
    directly has settled it: the same message, but for the times the server takes from its drain."""
    call = await crashed(server_2x)
    one = f"/api/session/{call.session_id}/message/{call.message_id}"
    async with proxy_in_front(server_2x, tmp_path) as proxy:
        shown = (await settled_through(proxy, server_2x, one, call))["data"]
    await server_2x.post(f"/api/session/{call.session_id}/prompt", {"text": "go on"})
    theirs = await server_2x.closed(one)
    assert shown["time"]["completed"] <= theirs["time"]["completed"]
    for message in (shown, theirs):
        message["time"].pop("completed")
        tool_of(message, call)["time"].pop("completed")
    assert shown == theirs


async def test_a_client_of_api_event_is_told_the_call_failed_across_a_sigkill(
    server_2x: Server2x, tmp_path: Path
) -> None:
    async with proxy_in_front(server_2x, tmp_path) as proxy:
        await until_logged(proxy, "following /api/event")
        call = await server_2x.running_call()
        async with aiohttp.ClientSession() as http:
            told = asyncio.create_task(api_events(http, proxy, server_2x, call.session_id))
            await server_2x.kill()
            await server_2x.restart()
            failed, ended = (await told)[-2:]
    assert failed["type"] == "session.tool.failed"
    assert failed["data"]["id"] == call.call_id
    assert failed["data"]["error"] == INTERRUPTED
    assert ended["data"] == {"sessionID": call.session_id, "reason": "shutdown"}


@pytest.mark.parametrize("mode", ["api", "db"])
async def test_write_back_is_refused_and_nothing_is_written(
    server_2x: Server2x, tmp_path: Path, mode: str
) -> None:
    call = await crashed(server_2x)
    one = f"/api/session/{call.session_id}/message/{call.message_id}"
    database = sqlite_database(server_2x, tmp_path)
    before = database.read_bytes()  # the stand-in's: nothing else writes it (a real server does)
    async with proxy_in_front(server_2x, tmp_path, "--write-back", mode, "--db", str(database)) as proxy:
        refused = await until_logged(proxy, f"--write-back {mode} does nothing on opencode")
        shown = tool_of((await settled_through(proxy, server_2x, one, call))["data"], call)
        decided = with_credentials(proxy.url, "opencode", server_2x.password)
        await asyncio.to_thread(wait_all_decided, decided, within=30)
        stored = tool_of((await server_2x.get(one))["data"], call)
    assert "WARNING" in refused
    assert shown["state"]["error"] == INTERRUPTED
    assert stored["state"]["status"] == "running"
    if isinstance(server_2x, StandInServer):
        assert database.read_bytes() == before


def sqlite_database(server: Server2x, tmp_path: Path) -> Path:
    """The SQLite file a 2.x server keeps: the real server's own; for the stand-in, an empty one
    with 2.x's session table."""
    if isinstance(server, StandInServer):
        return opencode_sqlite(tmp_path / "opencode.db")
    return server.database


async def test_health_names_the_2x_server_and_its_stream_is_followed(
    server_2x: Server2x, tmp_path: Path
) -> None:
    async with proxy_in_front(server_2x, tmp_path) as proxy:

        def known() -> dict[str, Any] | None:
            found: dict[str, Any] = proxy_health(proxy, server_2x)
            return found if "version" in found["upstream"] else None

        health = await asyncio.to_thread(poll, known, what="the server known", timeout=30)
        assert health["status"] == "ok", health
        upstream = health["upstream"]
        version = upstream["version"]
        assert version == await server_2x.version()
        # The line is known by the server's shape; a version is a known release only when it parses.
        assert (upstream["dialect"], upstream["known_line"]) == ("2.x", True)
        assert upstream["known_version"] is (version != "local"), upstream
        await until_logged(proxy, "following /api/event")
        assert proxy_health(proxy, server_2x)["liveness"]["source"] == "events"


async def test_a_proxy_given_a_wrong_password_admits_no_one_to_its_details(
    server_2x: Server2x, tmp_path: Path
) -> None:
    """The server refuses the proxy's credentials: no one is shown the details, neither whoever
    presents the proxy's (the server refuses them) nor whoever presents the server's (the proxy
    cannot check them), and each refusal says the proxy's password is the wrong one."""
    proxy = ProxyProcess(server_2x.url, tmp_path / "proxy.log", environment={"OPENCODE_PASSWORD": "wrong"})
    await asyncio.to_thread(proxy.start)
    try:
        await until_logged(proxy, "the server refused the password presented")
        bases = [with_credentials(proxy.url, "opencode", p) for p in ("wrong", server_2x.password)] + [
            proxy.url
        ]
        replies = [
            await asyncio.to_thread(request, "GET", base + route)
            for base in bases
            for route in ("/_settle/health", "/_settle/orphans", "/_settle/resume", "/_settle/metrics")
        ]
    finally:
        await asyncio.to_thread(proxy.stop)
    assert [reply.status for reply in replies] == [403] * len(replies)
    assert all(
        reply.json()["message"].startswith("the server refuses the proxy's credentials") for reply in replies
    )


def proxy_health(proxy: ProxyProcess, server: Server2x) -> dict[str, Any]:
    """The proxy's `/_settle/health` (200 or 503: either says what it knows)."""
    reply = request("GET", f"{proxy.url}/_settle/health", headers=server.headers, timeout=10)
    assert reply.status in (200, 503), reply.body[:300]
    return dict(reply.json())


@pytest.mark.parametrize("variant", ["2.1.2", "from source"])
async def test_resume_sends_one_continuation_through_synthetic_across_a_sigkill(
    tmp_path: Path, variant: str
) -> None:
    server = StandInServer(tmp_path / "server", VARIANT_FLAGS[variant])
    await server.start()
    try:
        async with proxy_in_front(server, tmp_path, "--resume", "--write-back", "api") as proxy:
            call = await server.running_call()
            await until_logged(proxy, "following /api/event")
            await server.kill()
            await server.restart()
            decided = await until_logged(proxy, f"resume resumed: session {call.session_id}")
    finally:
        await server.stop()
    messages = orjson.loads(server.database.read_bytes())["messages"][call.session_id]
    continuations = [m for m in messages if m["type"] == "synthetic"]
    assert "2.x's own drain" in decided
    assert len(continuations) == 1
    assert "- shell: `sleep 20`" in continuations[0]["text"]
    assert [m["type"] for m in messages][-2:] == ["assistant", "idle"]


async def test_resume_continues_a_safe_turn_cut_on_2_1_2_exactly_once(
    real_2x: RealServer, mock_model: MockModel, tmp_path: Path
) -> None:
    """The real 2.1.2: the cut `shell` call (`echo`, `sleep`: safe to have been cut) is continued by
    itself through `/synthetic`, once; the server settles the call in its own drain, the model is
    told which call was cut, and the session ends idle."""
    async with proxy_in_front(real_2x, tmp_path, "--resume") as proxy:
        await until_logged(proxy, "following /api/event")
        call = await real_2x.running_call()
        await real_2x.kill()
        await real_2x.restart()
        decided = await until_logged(proxy, f"resume resumed: session {call.session_id}")
        one = f"/api/session/{call.session_id}/message/{call.message_id}"
        closed = await real_2x.closed(one)
        answered = await poll_async(lambda: _continued(mock_model), "the model asked again")
    assert "2.x's own drain" in decided
    assert tool_of(closed, call)["state"]["error"] == INTERRUPTED
    (continuation,) = answered
    assert "shell" in (continuation.latest_prompt or "")
    assert "unknown" in (continuation.latest_prompt or "")
    assert [r.decision for r in mock_model.requests()].count("tool") == 1
    assert proxy.log().count(f"resume resumed: session {call.session_id}") == 1


UNSAFE = "echo hello > out.txt && sleep 600"
"""A call that may have changed something (it writes a file): never continued by itself."""


async def test_an_unsafe_turn_cut_on_2_1_2_waits_and_a_continue_resumes_it_once(
    real_2x: RealServer, mock_model: MockModel, tmp_path: Path
) -> None:
    async with proxy_in_front(real_2x, tmp_path, "--resume") as proxy:
        await until_logged(proxy, "following /api/event")
        call = await real_2x.running_call(UNSAFE)
        await real_2x.kill()
        await real_2x.restart()
        waits = await until_logged(proxy, f"resume waiting: session {call.session_id}")
        assert _continued(mock_model) == [], "never continued by itself"
        continued = f"{proxy.url}/_settle/resume/{call.session_id}"
        first = await asyncio.to_thread(request, "POST", continued, headers=real_2x.headers, timeout=15)
        resumed = await until_logged(proxy, f"resume resumed: session {call.session_id}")
        second = await asyncio.to_thread(request, "POST", continued, headers=real_2x.headers, timeout=15)
        (continuation,) = await poll_async(lambda: _continued(mock_model), "the model asked again")
    assert "'>': redirects to a file (out.txt)" in waits
    assert first.status == 202, first.body
    assert "2.x's own drain" in resumed
    assert second.status == 409, second.body
    assert f"- shell: `{UNSAFE}`" in (continuation.latest_prompt or "")


async def test_a_service_server_resumes_by_itself_and_the_proxy_leaves_it_to_it(
    tmp_path: Path, mock_model: MockModel
) -> None:
    """2.1.2's `serve --service` continues the cut turn at boot itself: the proxy with `--resume`
    says so once and sends nothing, so the model is asked to continue exactly once."""
    server = RealServer(tmp_path / "server", real_2x_command(), mock_model, service=True)
    await server.start()
    try:
        async with proxy_in_front(server, tmp_path, "--resume") as proxy:
            await until_logged(proxy, "following /api/event")
            call = await server.running_call()
            await server.kill()
            await server.restart()
            decided = await until_logged(proxy, f"resume skipped: session {call.session_id}")
            (continuation,) = await poll_async(lambda: _continued(mock_model), "the server's continuation")
            said = await until_logged(proxy, "the server resumes interrupted turns itself")
    finally:
        await server.stop()
    assert "left to it" in decided
    assert "serve --service" in said
    assert "The server restarted while you were working" in (continuation.latest_prompt or "")
    assert "resume resumed" not in proxy.log()


async def test_four_turns_cut_at_once_on_2_1_2_are_continued_each_once_two_at_a_time_spaced(
    real_2x: RealServer, mock_model: MockModel, tmp_path: Path
) -> None:
    """Never a stampede on 2.1.2 either (`--resume-concurrency 2 --resume-spacing 2`, the
    defaults): four turns cut by one SIGKILL are each continued once, at least 2 s apart, never
    more than 2 between admission and a seen start."""
    commands = [f"echo stampede {n} && sleep 600" for n in range(4)]
    async with proxy_in_front(real_2x, tmp_path, "--resume") as proxy:
        await until_logged(proxy, "following /api/event")
        calls = [await real_2x.running_call(command) for command in commands]
        await real_2x.kill()
        await real_2x.restart()
        for call in calls:
            await until_logged(proxy, f"resume resumed: session {call.session_id}")
        for call in calls:
            await real_2x.closed(f"/api/session/{call.session_id}/message/{call.message_id}")
        finals = await asyncio.to_thread(resumed_decisions, proxy, real_2x, {c.session_id for c in calls})
    asked = [r.latest_prompt or "" for r in _continued(mock_model)]
    assert [sum(command in prompt for prompt in asked) for command in commands] == [1, 1, 1, 1]
    admitted = sorted(d["admitted"] for d in finals)
    gaps = [later - earlier for earlier, later in itertools.pairwise(admitted)]
    assert all(gap >= 2.0 - 1e-6 for gap in gaps), gaps
    spans = [(d["admitted"], d["at"]) for d in finals]
    assert max(sum(1 for start, end in spans if start <= moment <= end) for moment, _ in spans) <= 2


def resumed_decisions(proxy: ProxyProcess, server: Server2x, sessions: set[str]) -> list[dict[str, Any]]:
    """The proxy's `resumed` decisions on `sessions` (`GET /_settle/resume`), one each."""
    reply = request("GET", f"{proxy.url}/_settle/resume", headers=server.headers, timeout=15)
    assert reply.status == 200, reply.body
    found = [d for d in reply.json()["decisions"] if d["outcome"] == "resumed" and d["session"] in sessions]
    assert sorted(d["session"] for d in found) == sorted(sessions), found
    return list(found)
