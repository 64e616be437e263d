"""`--resume` in front of 2.x (the stand-in): one continuation through 2.x's own settle-then-continue
(`POST /api/session/{id}/synthetic` under one id, naming the call), and none over a newer message,
a pending permission or form (2.1.2's `question` tool asks through a form), or for a child session;
an unsafe call, or one the server itself failed as ambiguous after a restart, waits for a person's
Continue."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from yarl import URL

from proxy.opencode.client import Credentials, UpstreamApi, UpstreamRefused
from proxy.opencode.liveness import LivenessProbe
from proxy.resume import sending
from proxy.resume.continuing import Continuation
from proxy.service.config import basic_authorization
from tests.opencode2.proxied import PASSWORD, Client, Said, call_opened, proxied
from tests.opencode2.settle import Settle, project_tool_failed, tool_failures
from tests.opencode2.stand_in import VARIANTS, RunningCall, StandIn

pytestmark = pytest.mark.usefixtures("caplog")


async def crashed_mid_call(
    server: StandIn,
    aiohttp_client: Client,
    tmp_path: Path,
    call: RunningCall,
    before_restart: Any = None,
    **more: Any,
) -> Said:
    """Run the proxy with `--resume` (and `more` settings); the stream shows the call's execution;
    the server is killed and restarted; the proxy's decision line, once said."""
    decided = Said("resume ", f": session {call.session_id}: ")
    # No --write-back: on 2.x the server's own drain makes the settlement durable.
    settings: dict[str, Any] = {"resume": True, "state_db": tmp_path / "state.db", **more}
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


@pytest.mark.parametrize("variant", VARIANTS)
async def test_a_crashed_turn_is_continued_once_through_synthetic_naming_the_call(
    aiohttp_client: Client, tmp_path: Path, variant: str
) -> None:
    async with StandIn(password=PASSWORD, **VARIANTS[variant]) as server:
        session = server.add_session()
        call = server.add_running_call(session, "shell", {"command": "make test"})
        decided = await crashed_mid_call(server, aiohttp_client, tmp_path, call, resume_unsafe=True)
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


async def test_a_call_2x_settled_itself_is_read_settled_and_named(
    aiohttp_client: Client, tmp_path: Path
) -> None:
    """A drain that settled the call (a prompt by another client) and died before the model
    wrote: the view holds the call in 2.x's settled shape, read as 2.x's dialect reads it."""
    async with StandIn(password=PASSWORD) as server:
        session = server.add_session()
        call = server.add_running_call(session, "shell", {"command": "make test"})

        def settled_by_2x() -> None:
            messages = server.messages(session)
            for failed in tool_failures(session, messages, Settle.CHILD):
                project_tool_failed(messages, failed.data, created=1)

        decided = await crashed_mid_call(
            server, aiohttp_client, tmp_path, call, settled_by_2x, resume_unsafe=True
        )
        body = server.calls[0].body
    assert decided.line.startswith(f"resume resumed: session {session}")
    assert body is not None
    assert "- shell: `make test` (whether its process still runs is not known)" in body["text"]


def _later(server: StandIn, session: str, message: dict[str, Any]) -> None:
    server.messages(session).append(message)


@pytest.mark.parametrize("person", ["newer message", "permission", "question", "form"])
async def test_never_over_a_person(aiohttp_client: Client, tmp_path: Path, person: str) -> None:
    """A question is 2.1.2's: its `question` tool's call, asking through a form (no build known to
    the project served `GET /api/session/{id}/question`)."""
    async with StandIn(password=PASSWORD) as server:
        session = server.add_session()
        if person == "question":
            call = server.add_running_call(session, "question", {"questions": [{"question": "Go on?"}]})
        else:
            call = server.add_running_call(session)

        def a_person() -> None:
            if person == "permission":
                server.add_permission(call)
            elif person == "question":
                server.add_question(call)
            elif person == "form":
                server.add_form(session)
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
    if person in ("form", "question"):
        assert "a form asked" in line
    assert routes == []


NO_QUESTION_ROUTE = (
    "the server has no GET /api/session/{id}/question (an empty 404): no question can wait there"
)


async def test_a_server_without_a_question_route_is_resumed_and_says_the_route_is_absent(
    aiohttp_client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """2.1.2 has no `GET …/question` (an empty 404, measured): the turn is continued all the same,
    and the log says the route is absent, not that the server could not be read."""
    caplog.set_level(logging.INFO, "proxy")
    async with StandIn(password=PASSWORD) as server:
        session = server.add_session()
        call = server.add_running_call(session, "shell", {"command": "make test"})
        decided = await crashed_mid_call(server, aiohttp_client, tmp_path, call, resume_unsafe=True)
        routes = [c.route for c in server.calls]
    assert decided.line.startswith(f"resume resumed: session {session}")
    assert routes == ["session.synthetic"]
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "/question" in r.getMessage()]
    assert said == [(logging.INFO, NO_QUESTION_ROUTE)]


async def test_a_person_list_the_server_has_not_is_said_once_and_asked_no_more(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The from-source build has neither `/question` nor `/form`: each absent route is said once,
    a session found wanting no person; a session it does not know is still an error."""
    caplog.set_level(logging.INFO, "proxy")
    async with StandIn.from_source(password=PASSWORD) as server, aiohttp.ClientSession() as http:
        first, second = server.add_session(), server.add_session()
        api = UpstreamApi(http, URL(server.url))
        own = Credentials.configured(basic_authorization("opencode", PASSWORD))
        continuation = Continuation(http, api, LivenessProbe(api), URL(server.url), own)
        assert await continuation.waiting_on_person(first) is None
        assert await continuation.waiting_on_person(second) is None
        server.add_permission(server.add_running_call(second))
        assert await continuation.waiting_on_person(second) == "a permission asked"
        with pytest.raises(UpstreamRefused) as unknown:
            await continuation.waiting_on_person("ses_missing")
    assert (unknown.value.status, unknown.value.no_route) == (404, False)
    said = sorted(r.getMessage() for r in caplog.records if "an empty 404" in r.getMessage())
    assert said == [
        "the server has no GET /api/session/{id}/form (an empty 404): no form can wait there",
        NO_QUESTION_ROUTE,
    ]


async def test_never_for_a_child_session(aiohttp_client: Client, tmp_path: Path) -> None:
    async with StandIn(password=PASSWORD) as server:
        parent = server.add_session()
        child = server.add_session(parent_id=parent)
        call = server.add_running_call(child)
        line = (await crashed_mid_call(server, aiohttp_client, tmp_path, call)).line
        routes = [c.route for c in server.calls]
    assert "a child session" in line
    assert routes == []


async def test_readiness_asks_the_route_the_line_was_found_on_and_says_what_came_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The from-source build answers `/api/health` and 404 on `/api/info`: a continuation asks the
    route the line was found on; one that never answers is given up, saying what was asked."""
    monkeypatch.setattr(sending, "READY_TIMEOUT_S", 0.2)
    monkeypatch.setattr(sending, "POLL_S", 0.05)
    async with StandIn.from_source(password=PASSWORD) as server, aiohttp.ClientSession() as session:
        api, origin = UpstreamApi(session, URL(server.url)), URL(server.url)
        own = Credentials.configured(
            basic_authorization("alice", PASSWORD)
        )  # 2.x asks as opencode all the same

        def made(route: str) -> Continuation:
            return Continuation(session, api, LivenessProbe(api), origin, own, health_route=lambda: route)

        assert await made("/api/health").ready(None, None) is None
        unready = await made("/api/info").ready(None, None)
    assert unready == "asked for 0.2 s; last, GET /api/info: HTTP 404 (not found)"


async def test_an_unsafe_call_waits_and_a_continue_admits_one_synthetic(
    aiohttp_client: Client, tmp_path: Path
) -> None:
    async with StandIn(password=PASSWORD) as server:
        session = server.add_session()
        call = server.add_running_call(session, "shell", {"command": "make test"})
        decided = Said("resume ", f": session {call.session_id}: ")
        settings: dict[str, Any] = {"resume": True, "state_db": tmp_path / "state.db"}
        async with proxied(server, aiohttp_client, lock_dir=tmp_path, **settings) as (client, seen):
            server.publish("session.execution.started", {"sessionID": call.session_id})
            call_opened(server, call)
            await seen.until(lambda: any(e.kind == "session.tool.called" for e in seen.events))
            await server.crash()
            await server.restart()
            await decided.wait()
            assert decided.line.startswith(f"resume waiting: session {session}")
            assert "'make': not a command that only reads or waits" in decided.line
            assert server.calls == []
            asking = {"Authorization": basic_authorization("opencode", PASSWORD)}
            listed = (await (await client.get("/_settle/resume", headers=asking)).json())["waiting"]
            assert [(w["session"], w["calls"][0]["command"]) for w in listed] == [(session, "make test")]
            resumed = Said("resume resumed: ", f": session {call.session_id}: ")
            assert (await client.post(f"/_settle/resume/{session}")).status == 401, "behind the password"
            assert (await client.post(f"/_settle/resume/{session}", headers=asking)).status == 202
            await resumed.wait()
            again = await client.post(f"/_settle/resume/{session}", headers=asking)
            assert again.status == 409
            routes = [(c.route, c.session_id) for c in server.calls]
    assert routes == [("session.synthetic", session)]


async def test_a_call_the_server_failed_as_ambiguous_waits_for_a_person(
    aiohttp_client: Client, tmp_path: Path
) -> None:
    """The newest `serve --service` fails, at boot, a call it will not resume (`restart.ts`
    `resumeSuspendedSessionsWith`): its own settlement, so nothing is settled over it, and the
    turn is left for a person even with --resume-unsafe, whatever the call ran."""
    async with StandIn(password=PASSWORD) as server:
        session = server.add_session()
        call = server.add_running_call(session, "shell", {"command": "sleep 20"})

        def failed_at_boot() -> None:
            [stored] = [item for item in server.messages(session)[1]["content"] if item["type"] == "tool"]
            error = {"type": "aborted", "message": "Tool outcome is ambiguous after restart: shell"}
            stored["state"] = {"status": "error", "error": error, "input": stored["state"]["input"]}
            server.store.active.discard(session)

        decided = await crashed_mid_call(
            server, aiohttp_client, tmp_path, call, failed_at_boot, resume_unsafe=True
        )
        routes = [c.route for c in server.calls]
    assert decided.line.startswith(f"resume waiting: session {session}")
    assert "Tool outcome is ambiguous after restart: shell" in decided.line
    assert routes == []
