"""The 2.x stand-in answers as the 2.x source says: auth, identity, health, views, pending requests."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.opencode2.auth import auth_token, basic
from tests.opencode2.stand_in import StandIn


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _get(http: aiohttp.ClientSession, server: StandIn, path: str, **options: Any) -> tuple[int, Any]:
    options.setdefault("headers", server.headers)
    async with http.get(server.url + path, **options) as response:
        return response.status, await response.json(content_type=None)


async def test_every_api_route_wants_the_password_and_says_so_as_2x_does(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    async with http.get(stand_in.url + "/api/info") as response:
        assert response.status == 401
        assert response.headers["www-authenticate"] == 'Basic realm="Secure Area"'
        assert await response.json() == {"_tag": "UnauthorizedError", "message": "Authentication required"}
    wrong_user = {"Authorization": basic(stand_in.password, "admin")}
    assert (await _get(http, stand_in, "/api/session/active", headers=wrong_user))[0] == 401
    assert (await _get(http, stand_in, "/api/session/active", headers={"Authorization": basic("no")}))[
        0
    ] == 401
    assert (await _get(http, stand_in, "/api/session/active"))[0] == 200
    lower_case = {"Authorization": "basic " + basic(stand_in.password).split()[1]}
    assert (await _get(http, stand_in, "/api/session/active", headers=lower_case))[0] == 200


async def test_an_auth_token_is_read_before_the_header(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    token = auth_token(stand_in.password)
    assert (await _get(http, stand_in, f"/api/info?auth_token={token}", headers={}))[0] == 200
    bad = auth_token("wrong")
    assert (await _get(http, stand_in, f"/api/info?auth_token={bad}"))[0] == 401


async def test_a_session_cookie_works_from_the_same_origin_only(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    name = stand_in.process.auth.cookie_name(stand_in.process.port)
    cookie = {"Cookie": f"{name}={stand_in.process.auth.issue_session()}"}
    assert (await _get(http, stand_in, "/api/info", headers=cookie))[0] == 200
    foreign = {**cookie, "Origin": "http://127.0.0.1:1"}
    assert (await _get(http, stand_in, "/api/info", headers=foreign))[0] == 401


async def test_info_names_the_version_and_follows_set_version(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    status, info = await _get(http, stand_in, "/api/info")
    assert status == 200
    assert info == {
        "version": "2.1.2",
        "pid": stand_in.process.pid,
        "urls": [stand_in.url],
        "paths": {"tmp": "/tmp/opencode"},
        "capabilities": {"persistentPty": True},
    }
    stand_in.set_version("3.0.0")
    assert (await _get(http, stand_in, "/api/info"))[1]["version"] == "3.0.0"
    assert (await _get(http, stand_in, "/global/health"))[0] == 404


async def test_a_booting_server_answers_503_with_retry_after_once_authenticated(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    stand_in.set_booting(True)
    async with http.get(stand_in.url + "/api/info", headers=stand_in.headers) as response:
        assert response.status == 503
        assert response.headers["retry-after"] == "1"
        assert (await response.json())["_tag"] == "ServiceUnavailableError"
    assert (await _get(http, stand_in, "/api/info", headers={}))[0] == 401
    stand_in.set_booting(False)
    assert (await _get(http, stand_in, "/api/info"))[0] == 200


async def test_the_from_source_build_answers_api_health_with_local_and_nothing_else(
    http: aiohttp.ClientSession,
) -> None:
    """As measured on the `v2` branch built @2092350c (/work/shared/OPENCODE.md, "opencode v2 measured")."""
    async with StandIn.from_source() as server:
        status, health = await _get(http, server, "/api/health")
        assert (status, health) == (200, {"healthy": True, "version": "local", "pid": server.process.pid})
        for path in ("/api/info", "/global/health"):
            async with http.get(server.url + path, headers=server.headers) as response:
                assert response.status == 404, path


async def test_the_compressing_variant_gzips_what_a_client_accepts_gzipped(
    http: aiohttp.ClientSession,
) -> None:
    async with StandIn(compress=True) as server:
        for path in ("/api/session/active", "/api/event"):
            gzip = server.headers | {"Accept-Encoding": "gzip, deflate"}
            async with http.get(server.url + path, headers=gzip) as response:
                assert response.headers.get("Content-Encoding") == "gzip", path
            plain = server.headers | {"Accept-Encoding": "identity"}
            async with http.get(server.url + path, headers=plain) as response:
                assert "Content-Encoding" not in response.headers, path


async def test_the_web_app_fallback_answers_unknown_gets_with_html(http: aiohttp.ClientSession) -> None:
    async with StandIn(web_fallback=True) as server:
        for path in ("/global/health", "/global/event", "/api/nothing"):
            async with http.get(server.url + path) as response:
                assert response.status == 200
                assert response.content_type == "text/html"
        async with http.post(server.url + "/global/nothing") as response:
            assert response.status == 404


async def test_the_message_list_is_newest_first_and_pages_by_cursor(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    session = stand_in.add_session()
    stand_in.add_running_call(session)
    stored = [message["id"] for message in stand_in.messages(session)]
    status, page = await _get(http, stand_in, f"/api/session/{session}/message?limit=1")
    assert status == 200
    assert [m["id"] for m in page["data"]] == [stored[1]]
    raw = page["cursor"]["next"]
    cursor = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    assert cursor == {"id": stored[1], "order": "desc", "direction": "next"}
    status, following = await _get(http, stand_in, f"/api/session/{session}/message?limit=1&cursor={raw}")
    assert [m["id"] for m in following["data"]] == [stored[0]]
    _, oldest_first = await _get(http, stand_in, f"/api/session/{session}/message?order=asc")
    assert [m["id"] for m in oldest_first["data"]] == stored


async def test_the_message_list_refuses_what_2x_refuses(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    session = stand_in.add_session()
    stand_in.add_running_call(session)
    _, page = await _get(http, stand_in, f"/api/session/{session}/message")
    cursor = page["cursor"]["next"]
    status, body = await _get(http, stand_in, f"/api/session/{session}/message?cursor={cursor}&order=asc")
    assert (status, body) == (
        400,
        {"_tag": "InvalidCursorError", "message": "Cursor cannot be combined with order"},
    )
    assert (await _get(http, stand_in, f"/api/session/{session}/message?cursor=garbage"))[0] == 400
    for limit, said in [
        ("201", "Expected a value less than or equal to 200"),
        ("0", "Expected a value greater than or equal to 1"),
        ("abc", "Expected an integer"),
    ]:
        status, body = await _get(http, stand_in, f"/api/session/{session}/message?limit={limit}")
        assert (status, body) == (
            400,
            {"_tag": "InvalidRequestError", "message": f'{said}\n  at ["limit"]', "kind": "Query"},
        )
    empty = stand_in.add_session()
    assert await _get(http, stand_in, f"/api/session/{empty}/message") == (
        200,
        {"data": [], "cursor": {"previous": None, "next": None}},
    )
    status, body = await _get(http, stand_in, "/api/session/ses_missing/message")
    assert status == 404
    assert body == {
        "_tag": "SessionNotFoundError",
        "sessionID": "ses_missing",
        "message": "Session not found: ses_missing",
    }


async def test_a_single_message_is_served_in_data(stand_in: StandIn, http: aiohttp.ClientSession) -> None:
    session = stand_in.add_session()
    call = stand_in.add_running_call(session)
    status, body = await _get(http, stand_in, f"/api/session/{session}/message/{call.message_id}")
    assert status == 200
    part = body["data"]["content"][0]
    assert part["state"] == {"status": "running", "input": {"command": "sleep 20"}, "metadata": {}}
    assert set(part["time"]) == {"created", "ran"}
    assert "completed" not in body["data"]["time"]
    status, body = await _get(http, stand_in, f"/api/session/{session}/message/msg_missing")
    assert (status, body["_tag"]) == (404, "MessageNotFoundError")


async def test_a_streaming_call_holds_its_raw_input(stand_in: StandIn, http: aiohttp.ClientSession) -> None:
    session = stand_in.add_session()
    call = stand_in.add_running_call(session, streaming='{"comm')
    _, body = await _get(http, stand_in, f"/api/session/{session}/message/{call.message_id}")
    assert body["data"]["content"][0]["state"] == {"status": "streaming", "input": '{"comm'}
    assert set(body["data"]["content"][0]["time"]) == {"created"}


async def test_active_lists_the_sessions_the_process_runs(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    running, idle = stand_in.add_session(), stand_in.add_session()
    stand_in.add_running_call(running)
    stand_in.add_running_call(idle, active=False)
    assert await _get(http, stand_in, "/api/session/active") == (
        200,
        {"data": {running: {"type": "running"}}},
    )


async def test_pending_permissions_and_forms_are_listed_per_session_and_no_question_route(
    stand_in: StandIn, http: aiohttp.ClientSession
) -> None:
    session = stand_in.add_session()
    call = stand_in.add_running_call(session)
    assert await _get(http, stand_in, f"/api/session/{session}/form") == (200, {"data": []})
    request = stand_in.add_permission(call)
    assert await _get(http, stand_in, f"/api/session/{session}/permission") == (200, {"data": [request]})
    assert request["source"] == {"type": "tool", "messageID": call.message_id, "id": call.call_id}
    question = stand_in.add_question(call)
    assert await _get(http, stand_in, f"/api/session/{session}/form") == (200, {"data": [question]})
    assert question["metadata"] == {
        "kind": "question",
        "tool": {"messageID": call.message_id, "id": call.call_id},
    }
    for kind in ("permission", "form"):
        assert (await _get(http, stand_in, f"/api/session/ses_missing/{kind}"))[1] == {
            "_tag": "SessionNotFoundError",
            "sessionID": "ses_missing",
            "message": "Session not found: ses_missing",
        }


@pytest.mark.parametrize(
    ("method", "route"),
    [("GET", "/api/session/{}/question"), ("POST", "/api/session/{}/resume"), ("GET", "/api/health")],
)
async def test_routes_2_1_2_has_not_answer_an_empty_404(
    stand_in: StandIn, http: aiohttp.ClientSession, method: str, route: str
) -> None:
    """As 2.1.2 answers them (measured): 404, no content-type, no body."""
    session = stand_in.add_session()
    url = stand_in.url + route.format(session)
    async with http.request(method, url, headers=stand_in.headers) as response:
        assert (response.status, await response.read()) == (404, b"")
        assert "Content-Type" not in response.headers
