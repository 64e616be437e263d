"""The 2.x stand-in's events, crash and restart, and the drain that settles stale work as 2.x does."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.opencode2.settle import Settle
from tests.opencode2.stand_in import StandIn


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _post(http: aiohttp.ClientSession, server: StandIn, path: str, body: Any = None) -> tuple[int, Any]:
    async with http.post(server.url + path, json=body, headers=server.headers) as response:
        text = await response.text()
        return response.status, json.loads(text) if text else None


async def _chunk(stream: aiohttp.ClientResponse) -> bytes:
    """One SSE frame or comment, through its blank line."""
    lines = []
    while (line := await stream.content.readline()) not in (b"\n", b""):
        lines.append(line)
    return b"".join(lines)


async def test_the_event_stream_opens_with_server_connected_then_frames_and_heartbeats(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    async with http.get(stand_in.url + "/api/event", headers=stand_in.headers) as stream:
        assert stream.headers["Content-Type"] == "text/event-stream"
        assert stream.headers["Cache-Control"] == "no-cache, no-transform"
        first = await _chunk(stream)
        assert first.startswith(b"data: ")
        assert json.loads(first[6:])["type"] == "server.connected"
        await stand_in.wait_for_subscribers(1)
        stand_in.heartbeat()
        assert await _chunk(stream) == b": heartbeat\n"
        event = stand_in.publish("session.execution.started", {"sessionID": "ses_x"})
        assert json.loads((await _chunk(stream))[6:]) == event
        assert event["durable"] == {"aggregateID": "ses_x", "seq": 1, "version": 1}


async def test_a_crash_cuts_the_stream_clears_liveness_and_keeps_the_messages(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    session = stand_in.add_session()
    stand_in.add_running_call(session)
    before = json.dumps(stand_in.messages(session))
    async with http.get(stand_in.url + "/api/event", headers=stand_in.headers) as stream:
        await _chunk(stream)
        await stand_in.wait_for_subscribers(1)
        await stand_in.crash()
        with pytest.raises(aiohttp.ClientPayloadError):
            await stream.content.read()
    with pytest.raises(aiohttp.ClientConnectionError):
        await http.get(stand_in.url + "/api/info", headers=stand_in.headers)
    old_password, old_pid = stand_in.password, stand_in.process.pid
    await stand_in.restart()
    assert stand_in.password != old_password
    assert stand_in.process.pid == old_pid + 1
    async with http.get(
        stand_in.url + "/api/info", headers={"Authorization": f"Basic {old_password}"}
    ) as refused:
        assert refused.status == 401
    async with http.get(stand_in.url + "/api/session/active", headers=stand_in.headers) as active:
        assert await active.json() == {"data": {}}
    assert json.dumps(stand_in.messages(session)) == before
    assert stand_in.published == []


async def test_a_fixed_password_survives_a_restart_and_a_restart_may_boot_first(
    http: aiohttp.ClientSession,
) -> None:
    async with StandIn(password="fixed") as server:
        await server.crash()
        await server.restart(booting=True)
        assert server.password == "fixed"
        async with http.get(server.url + "/api/info", headers=server.headers) as booting:
            assert booting.status == 503


async def _drain(http: aiohttp.ClientSession, server: StandIn, session: str) -> None:
    """Start the session's drain as a client of 2.1.2 does: a synthetic input (2.1.2 has no `/resume`)."""
    status, _ = await _post(http, server, f"/api/session/{session}/synthetic", {"text": "Go on."})
    assert status == 200


async def test_a_synthetic_input_settles_the_stale_call_as_2x_does_then_continues(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    session = stand_in.add_session()
    call = stand_in.add_running_call(session)
    await stand_in.crash()
    await stand_in.restart()
    await _drain(http, stand_in, session)
    failed = stand_in.published[0]
    assert failed["type"] == "session.tool.failed"
    error = {"type": "aborted", "message": "Tool execution interrupted: shell"}
    assert failed["data"] == {
        "sessionID": session,
        "assistantMessageID": call.message_id,
        "id": call.call_id,
        "error": error,
        "executed": False,
    }
    interrupted = stand_in.messages(session)[1]
    part = interrupted["content"][0]
    assert part["state"] == {"status": "error", "error": error, "input": {"command": "sleep 20"}}
    assert part["time"]["completed"] == failed["created"]
    assert part["executed"] is False
    step = next(event for event in stand_in.published if event["type"] == "session.step.started")
    assert interrupted["time"]["completed"] == step["created"]
    types = [m["type"] for m in stand_in.messages(session)]
    assert types == ["user", "assistant", "synthetic", "assistant", "idle"]
    assert stand_in.messages(session)[-1]["outcome"] == "succeeded"
    assert [call.route for call in stand_in.calls] == ["session.synthetic"]


async def test_a_streamed_input_becomes_an_empty_object(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    session = stand_in.add_session()
    stand_in.add_running_call(session, streaming='{"comm', active=False)
    await _drain(http, stand_in, session)
    assert stand_in.messages(session)[1]["content"][0]["state"]["input"] == {}


async def test_a_subagent_call_names_its_child_and_keeps_its_metadata(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    session = stand_in.add_session()
    stand_in.add_subagent_call(session, "ses_child", active=False)
    await _drain(http, stand_in, session)
    data = stand_in.published[0]["data"]
    assert data["error"]["message"] == "Tool execution interrupted: subagent (sessionID: ses_child)"
    assert data["metadata"] == {"sessionID": "ses_child"}
    assert stand_in.messages(session)[1]["content"][0]["state"]["metadata"] == {"sessionID": "ses_child"}


async def test_the_early_settle_names_no_child_and_drops_metadata_and_may_say_call_id(
    http: aiohttp.ClientSession,
) -> None:
    async with StandIn("2.0.3", settle=Settle.EARLY, call_key="callID") as server:
        session = server.add_session()
        call = server.add_subagent_call(session, "ses_child", active=False)
        await _drain(http, server, session)
        data = server.published[0]["data"]
        assert data["error"]["message"] == "Tool execution interrupted: subagent"
        assert "metadata" not in data
        assert data["callID"] == call.call_id
        assert "metadata" not in server.messages(session)[1]["content"][0]["state"]


async def test_a_running_compaction_fails_before_the_calls_are_settled(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    session = stand_in.add_session()
    stand_in.add_running_call(session, active=False)
    compaction = stand_in.add_running_compaction(session)
    await _drain(http, stand_in, session)
    assert [event["type"] for event in stand_in.published[:2]] == [
        "session.compaction.failed",
        "session.tool.failed",
    ]
    error = {"type": "compaction.interrupted", "message": "Compaction was interrupted"}
    assert stand_in.published[0]["data"] == {
        "sessionID": session,
        "reason": "auto",
        "inputID": compaction,
        "error": error,
    }
    failed = stand_in.messages(session)[2]
    assert {key: failed[key] for key in ("id", "status", "error")} == {
        "id": compaction,
        "status": "failed",
        "error": error,
    }


async def test_synthetic_settles_first_delivers_then_answers_the_same_id_with_the_first_item(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    """As 2.1.2 does (measured): a synthetic input sent again under its id is answered with the
    item first admitted, and admitted no more; a prompt under that id is refused."""
    session = stand_in.add_session()
    stand_in.add_running_call(session, active=False)
    text = "The call `shell` was interrupted; its outcome is unknown."
    body: dict[str, Any] = {"id": "msg_resume_1", "text": text, "description": "settle-proxy", "resume": True}
    status, admitted = await _post(http, stand_in, f"/api/session/{session}/synthetic", body)
    assert status == 200
    assert admitted["data"]["type"] == "synthetic"
    assert admitted["data"]["payload"] == {"text": text, "description": "settle-proxy"}
    assert admitted["data"]["delivery"] == "steer"
    assert set(admitted["data"]["time"]) == {"created"}
    types = [m["type"] for m in stand_in.messages(session)]
    assert types == ["user", "assistant", "synthetic", "assistant", "idle"]
    assert stand_in.messages(session)[1]["content"][0]["state"]["status"] == "error"
    again = body | {"text": "other"}
    assert await _post(http, stand_in, f"/api/session/{session}/synthetic", again) == (200, admitted)
    assert len(stand_in.messages(session)) == 5
    status, refused = await _post(http, stand_in, f"/api/session/{session}/prompt", again)
    assert (status, refused["_tag"], refused["resource"]) == (409, "ConflictError", "msg_resume_1")
    assert refused["message"].startswith("Prompt message ID conflicts")
    routes = [call.route for call in stand_in.calls]
    assert routes == ["session.synthetic", "session.synthetic", "session.prompt"]


async def test_prompt_takes_a_flat_body_and_resume_false_only_admits(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    session = stand_in.add_session()
    stand_in.add_running_call(session, active=False)
    nested = {"prompt": {"text": "hi"}}
    assert (await _post(http, stand_in, f"/api/session/{session}/prompt", nested))[0] == 400
    status, admitted = await _post(
        http, stand_in, f"/api/session/{session}/prompt", {"text": "hi", "resume": False}
    )
    assert (status, admitted["data"]["type"]) == (200, "user")
    assert stand_in.published == []
    assert stand_in.messages(session)[1]["content"][0]["state"]["status"] == "running"


async def test_interrupt_stops_a_running_session_and_is_a_no_op_when_idle(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    session = stand_in.add_session()
    stand_in.add_running_call(session)
    assert await _post(http, stand_in, f"/api/session/{session}/interrupt") == (200, {"interrupted": True})
    assert stand_in.published[0]["data"]["error"] == {
        "type": "aborted",
        "message": "Tool execution interrupted",
    }
    assert stand_in.published[-1]["data"] == {"sessionID": session, "reason": "user"}
    assert stand_in.messages(session)[-1]["outcome"] == "interrupted"
    assert await _post(http, stand_in, f"/api/session/{session}/interrupt") == (200, {"interrupted": False})
    for resume in ("true", "false"):
        idle = await _post(http, stand_in, f"/api/session/{session}/interrupt?resume={resume}")
        assert idle == (200, {"interrupted": False})
    assert (await _post(http, stand_in, "/api/session/ses_missing/interrupt"))[0] == 404
    assert await _post(http, stand_in, f"/api/session/{session}/interrupt?resume=maybe") == (
        400,
        {
            "_tag": "InvalidRequestError",
            "message": 'Expected "true" | "false"\n  at ["resume"]',
            "kind": "Query",
        },
    )


@pytest.mark.parametrize("resume", [None, "false", "true"])
async def test_interrupt_resumes_with_the_input_it_holds_only_when_asked(
    stand_in: StandIn, http: aiohttp.ClientSession, resume: str | None
) -> None:
    session = stand_in.add_session()
    stand_in.add_running_call(session)
    steer = {"id": "msg_steer_1", "text": "Do this instead."}
    assert (await _post(http, stand_in, f"/api/session/{session}/synthetic", steer))[0] == 200
    assert "msg_steer_1" not in [m["id"] for m in stand_in.messages(session)], "held while it runs"
    query = "" if resume is None else f"?resume={resume}"
    answer = await _post(http, stand_in, f"/api/session/{session}/interrupt{query}")
    assert answer == (200, {"interrupted": True})
    types = [m["type"] for m in stand_in.messages(session)]
    if resume == "true":
        assert types == ["user", "assistant", "idle", "synthetic", "assistant", "idle"]
        assert stand_in.messages(session)[-1]["outcome"] == "succeeded"
    else:
        assert types == ["user", "assistant", "idle"]
        assert stand_in.store.inbox[session][0]["id"] == "msg_steer_1"
