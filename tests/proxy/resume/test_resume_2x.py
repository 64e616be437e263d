"""`--resume` in front of 2.x (the stand-in): one continuation through 2.x's own settle-then-continue
(`POST /api/session/{id}/synthetic` under one id, naming the call), and none over a newer message,
a pending permission or question, or for a child session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.writeback.scheduler import WriteBackMode
from tests.opencode2.proxied import PASSWORD, Client, Said, call_opened, proxied
from tests.opencode2.stand_in import RunningCall, StandIn

pytestmark = pytest.mark.usefixtures("caplog")


async def crashed_mid_call(
    server: StandIn, aiohttp_client: Client, tmp_path: Path, call: RunningCall, before_restart: Any = None
) -> Said:
    """Run the proxy with `--resume`; the stream shows the call's execution; the server is killed
    and restarted; the proxy's decision line, once said."""
    decided = Said("resume ", f": session {call.session_id}: ")
    # --resume wants a write-back mode (1.18's settlement); on 2.x it writes nothing and says so.
    settings = {"resume": True, "write_back": WriteBackMode.API, "state_db": tmp_path / "state.db"}
    async with proxied(server, aiohttp_client, lock_dir=tmp_path, **settings) as (_, seen):
        server.publish("session.execution.started", {"sessionID": call.session_id})
        call_opened(server, call)
        await seen.until(lambda: any(e.kind == "session.tool.called" for e in seen.events))
        await server.crash()
        if before_restart is not None:
            before_restart()
        await server.restart()
        await decided.wait()
    return decided


async def test_a_crashed_turn_is_continued_once_through_synthetic_naming_the_call(
    aiohttp_client: Client, tmp_path: Path
) -> None:
    async with StandIn(password=PASSWORD) as server:
        session = server.add_session()
        call = server.add_running_call(session, "shell", {"command": "make test"})
        decided = await crashed_mid_call(server, aiohttp_client, tmp_path, call)
        routes = [(c.route, c.session_id) for c in server.calls]
        body = server.calls[0].body
        settled = server.messages(session)[1]["content"][0]["state"]
    assert decided.line.startswith(f"resume resumed: session {session}")
    assert decided.fields["durable"].startswith("2.x's own drain")
    assert routes == [("session.synthetic", session)]
    assert body is not None
    assert body["id"].startswith("msg_")
    assert "- shell: `make test` (whether its process still runs is not known)" in body["text"]
    assert "Their outcome is unknown" in body["text"]
    # 2.x's drain settled the call before the continuation ran (its own settle-then-continue).
    assert settled["error"] == {"type": "aborted", "message": "Tool execution interrupted: shell"}


def _later(server: StandIn, session: str, message: dict[str, Any]) -> None:
    server.messages(session).append(message)


@pytest.mark.parametrize("person", ["newer message", "permission", "question"])
async def test_never_over_a_person(aiohttp_client: Client, tmp_path: Path, person: str) -> None:
    async with StandIn(password=PASSWORD) as server:
        session = server.add_session()
        call = server.add_running_call(session)

        def a_person() -> None:
            if person == "permission":
                server.add_permission(call)
            elif person == "question":
                server.add_question(call)
            else:
                later = {
                    "id": "msg_zzzzzzzzzzzzzzzzzzzzzzzzzz",
                    "type": "user",
                    "text": "stop",
                    "time": {"created": 1},
                }
                _later(server, session, later)

        line = (await crashed_mid_call(server, aiohttp_client, tmp_path, call, a_person)).line
        routes = [c.route for c in server.calls]
    assert line.startswith(f"resume skipped: session {session}")
    assert ("person" if person != "newer message" else "newer message") in line
    assert routes == []


async def test_never_for_a_child_session(aiohttp_client: Client, tmp_path: Path) -> None:
    async with StandIn(password=PASSWORD) as server:
        parent = server.add_session()
        child = server.add_session(parent_id=parent)
        call = server.add_running_call(child)
        line = (await crashed_mid_call(server, aiohttp_client, tmp_path, call)).line
        routes = [c.route for c in server.calls]
    assert "a child session" in line
    assert routes == []
