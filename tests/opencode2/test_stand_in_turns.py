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


async def test_resume_settles_the_stale_call_as_2x_does_then_continues(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    session = stand_in.add_session()
    call = stand_in.add_running_call(session)
    await stand_in.crash()
    await stand_in.restart()
    assert await _post(http, stand_in, f"/api/session/{session}/resume") == (204, None)
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
    assert [m["type"] for m in stand_in.messages(session)] == ["user", "assistant", "assistant", "idle"]
    assert stand_in.messages(session)[-1]["outcome"] == "succeeded"
    assert [call.route for call in stand_in.calls] == ["session.resume"]


async def test_a_streamed_input_becomes_an_empty_object(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    session = stand_in.add_session()
    stand_in.add_running_call(session, streaming='{"comm', active=False)
    await _post(http, stand_in, f"/api/session/{session}/resume")
    assert stand_in.messages(session)[1]["content"][0]["state"]["input"] == {}


async def test_a_subagent_call_names_its_child_and_keeps_its_metadata(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    session = stand_in.add_session()
    stand_in.add_subagent_call(session, "ses_child", active=False)
    await _post(http, stand_in, f"/api/session/{session}/resume")
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
        await _post(http, server, f"/api/session/{session}/resume")
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
    await _post(http, stand_in, f"/api/session/{session}/resume")
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


async def test_synthetic_settles_first_delivers_then_refuses_the_same_id(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    session = stand_in.add_session()
    stand_in.add_running_call(session, active=False)
    body = {"id": "msg_resume_1", "text": "The call `shell` was interrupted; its outcome is unknown."}
    status, admitted = await _post(http, stand_in, f"/api/session/{session}/synthetic", body)
    assert status == 200
    assert admitted["data"]["type"] == "synthetic"
    assert admitted["data"]["payload"] == {"text": body["text"]}
    assert admitted["data"]["delivery"] == "steer"
    types = [m["type"] for m in stand_in.messages(session)]
    assert types == ["user", "assistant", "synthetic", "assistant", "idle"]
    assert stand_in.messages(session)[1]["content"][0]["state"]["status"] == "error"
    status, refused = await _post(http, stand_in, f"/api/session/{session}/synthetic", body)
    assert (status, refused["_tag"], refused["resource"]) == (409, "ConflictError", "msg_resume_1")
    assert len(stand_in.messages(session)) == 5
    assert [call.route for call in stand_in.calls] == ["session.synthetic", "session.synthetic"]


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
    assert (await _post(http, stand_in, "/api/session/ses_missing/resume"))[0] == 404
