"""A client stream open across a crash comes back at any moment of a resume, and ends up holding
the settled call and the resume's prompt (issue 28).

The server's events after the crash, in the order a resume makes it send them: the write-back of
the settled part, then the prompt (the session busy, the user message and its text, the session
renamed), then the resumed turn's answer and the session idle again. A client (the web UI, the
TUI: they never fetch again) holds what it was told before the crash, then what its new stream
carries: the proxy's replay, then the server's events from its reconnect on. Its stream comes
back before the write-back, between the write-back and the prompt, or after the prompt,
deterministically: each event is handed to the addon as the tracker hands it, and to the client
only once its stream is back. The server's order is 1.18.33's (`sse-global-event-run1.txt` in the
shared fixtures): the user message, its text, the session busy, the answer begun, then the user
message again with the turn's summary.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import orjson
import pytest

from proxy import testing
from proxy.addons.live import clients as live_clients
from proxy.addons.live.addon import LiveSettle
from proxy.opencode.tracker import FollowedEvent
from rules.runtimes import V1_ERROR
from tests.proxy.addons.live_streams import MESSAGE, PART, V1

SSE = {"Content-Type": "text/event-stream"}
USER: dict[str, Any] = {"id": "msg_zprompt", "sessionID": V1, "role": "user", "time": {"created": 3}}
PROMPT_TEXT: dict[str, Any] = {
    "id": "prt_zprompt",
    "sessionID": V1,
    "messageID": USER["id"],
    "type": "text",
    "text": "The calls were interrupted.",
}
ANSWER: dict[str, Any] = {
    **MESSAGE["info"],
    "id": "msg_zanswer",
    "parentID": USER["id"],
    "time": {"created": 4},
}
ANSWER_TEXT: dict[str, Any] = {**PROMPT_TEXT, "id": "prt_zanswer", "messageID": ANSWER["id"], "text": "done"}
SUMMARISED = {**USER, "summary": {"diffs": []}}
MOMENTS = {"before the write-back": 0, "between the write-back and the prompt": 1, "after the prompt": 7}


def prompt_and_answer() -> list[tuple[str, dict[str, Any]]]:
    return [
        ("message.updated", {"info": USER}),
        ("message.part.updated", {"part": PROMPT_TEXT}),
        ("session.updated", {"info": {"id": V1, "title": "resumed"}}),
        ("session.status", {"status": {"type": "busy"}}),
        ("message.updated", {"info": ANSWER}),
        ("message.updated", {"info": SUMMARISED}),
        ("message.part.updated", {"part": ANSWER_TEXT}),
        ("message.updated", {"info": {**ANSWER, "time": {"created": 4, "completed": 5}}}),
        ("session.status", {"status": {"type": "idle"}}),
        ("session.idle", {}),
    ]


class Client:
    """What a client builds from its stream: parts and messages by id, and the session's status.

    As the web UI does, a part of a message it does not hold is dropped (its `message.part.updated`
    case in 1.18.33's bundled app returns when the message is unknown and the session not loading).
    """

    def __init__(self) -> None:
        self.parts: dict[str, Any] = {PART["id"]: PART}
        self.messages: dict[str, Any] = {MESSAGE["info"]["id"]: MESSAGE["info"]}
        self.status = "busy"

    def take(self, payload: dict[str, Any]) -> None:
        kind, properties = payload["type"], payload["properties"]
        if kind == "message.part.updated" and properties["part"]["messageID"] in self.messages:
            self.parts[properties["part"]["id"]] = properties["part"]
        elif kind == "message.updated":
            self.messages[properties["info"]["id"]] = properties["info"]
        elif kind == "session.status":
            self.status = properties["status"]["type"]


async def settled_part(live: LiveSettle) -> dict[str, Any]:
    """The part as the proxy settles it (what the server's write-back then writes)."""
    async with testing.streaming(live, testing.flow("GET", "/global/event", response_headers=SSE)) as flow:
        assert flow.injected is not None
        frames = [orjson.loads(flow.injected.get_nowait().removeprefix(b"data: ")) for _ in range(3)]
    (part,) = [
        f["payload"]["properties"]["part"] for f in frames if f["payload"]["type"] == "message.part.updated"
    ]
    return cast(dict[str, Any], part)


async def comes_back(live: LiveSettle, events: list[tuple[str, dict[str, Any]]], back: int) -> Client:
    """The server sends `events`; the client's stream comes back after the first `back` of them:
    what it then holds, from the proxy's replay and its own stream."""
    client = Client()
    for kind, properties in events[:back]:
        live.event(FollowedEvent("/cwd", "prj", kind, {"sessionID": V1, **properties}))
    flow = testing.flow("GET", "/global/event", response_headers=SSE)
    async with testing.streaming(live, flow):
        assert flow.injected is not None
        while not flow.injected.empty():
            client.take(orjson.loads(flow.injected.get_nowait().removeprefix(b"data: "))["payload"])
        for kind, properties in events[back:]:  # on the client's own stream too, as the server sent them
            live.event(FollowedEvent("/cwd", "prj", kind, {"sessionID": V1, **properties}))
            client.take({"type": kind, "properties": {"sessionID": V1, **properties}})
    return client


def holds_the_settled_call_and_the_prompt(client: Client, settled: dict[str, Any]) -> None:
    assert client.parts[PART["id"]] == settled, "the interrupted call still runs"
    assert client.messages.get(USER["id"]) == SUMMARISED, "the resume's prompt is missing"
    assert client.parts.get(PROMPT_TEXT["id"]) == PROMPT_TEXT
    assert client.status == "idle"


@pytest.mark.parametrize("moment", MOMENTS)
async def test_a_client_back_at_any_moment_holds_the_settled_call_and_the_prompt(
    live: LiveSettle, moment: str
) -> None:
    live.event(
        FollowedEvent("/cwd", "prj", "message.part.updated", {"sessionID": V1, "part": PART, "time": 1})
    )
    live.following()  # the server crashed and is back
    await live.tasks.idle()  # the part is confirmed orphaned, and announced
    settled = await settled_part(live)
    events = [("message.part.updated", {"part": settled, "time": 2}), *prompt_and_answer()]
    client = await comes_back(live, events, MOMENTS[moment])
    assert client.parts[PART["id"]]["state"]["status"] == "error", "the interrupted call still runs"
    holds_the_settled_call_and_the_prompt(client, settled)


def with_ids(events: list[tuple[str, dict[str, Any]]]) -> list[FollowedEvent]:
    """The events as the followed stream reads them, with the server's ascending ids."""
    return [
        FollowedEvent("/cwd", "prj", kind, {"sessionID": V1, **properties}, id=f"evt_{index:04d}0")
        for index, (kind, properties) in enumerate(events)
    ]


def connected(after: int) -> bytes:
    """The client stream's first event, made when the server took it: after event `after`."""
    return b'data: {"payload":{"id":"evt_%04d5","type":"server.connected","properties":{}}}\n\n' % after


@pytest.mark.parametrize("behind", [1, 4, 7])
async def test_a_client_back_while_the_followed_stream_lags_is_sent_what_it_missed_before_its_own(
    live: LiveSettle, behind: int
) -> None:
    """The server took the client's stream after the prompt, when the followed stream had read all
    but its last `behind` events: those reach the client by neither the replay nor its own stream
    unless the proxy sends them, and before the client's own events (the user message announced
    again, the session idle): never an older state after a newer one."""
    live.following()
    live.event(
        FollowedEvent("/cwd", "prj", "message.part.updated", {"sessionID": V1, "part": PART, "time": 1})
    )
    live.following()  # the server crashed and is back
    await live.tasks.idle()
    settled = await settled_part(live)
    events = with_ids([("message.part.updated", {"part": settled, "time": 2}), *prompt_and_answer()])
    back = MOMENTS["after the prompt"]
    for event in events[: back - behind]:
        live.event(event)
    client, flow = Client(), testing.flow("GET", "/global/event", response_headers=SSE)
    async with testing.streaming(live, flow):
        assert flow.injected is not None
        assert flow.opened is not None
        holding = flow.opened(connected(after=back - 1))
        assert holding is not None
        for event in events[
            back - behind : back + 1
        ]:  # the followed stream reads on, up to one the client has
            live.event(event)
        await asyncio.wait_for(holding, 5)
        while not flow.injected.empty():
            client.take(orjson.loads(flow.injected.get_nowait().removeprefix(b"data: "))["payload"])
        for event in events[back:]:  # the client's own stream, held until then
            client.take({"type": event.kind, "properties": event.properties})
    holds_the_settled_call_and_the_prompt(client, settled)


async def test_a_client_back_goes_on_when_the_followed_stream_is_not_read_up_to_it(
    live: LiveSettle, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(live_clients, "CATCH_UP_WAIT", 0.01)
    live.following()
    live.event(
        FollowedEvent("/cwd", "prj", "message.part.updated", {"sessionID": V1, "part": PART, "time": 1})
    )
    live.following()  # the server crashed and is back
    await live.tasks.idle()
    flow = testing.flow("GET", "/global/event", response_headers=SSE)
    with caplog.at_level(logging.DEBUG, logger=live_clients.__name__):
        async with testing.streaming(live, flow):
            assert flow.opened is not None
            holding = flow.opened(connected(after=0))
            assert holding is not None
            await asyncio.wait_for(holding, 5)
    (line,) = [r for r in caplog.records if "missed before the server took it" in r.getMessage()]
    assert line.fields["decision"] == "went on before catching up"  # type: ignore[attr-defined]


@pytest.mark.parametrize("moment", ["between the write-back and the prompt", "after the prompt"])
async def test_a_client_back_after_a_write_back_of_a_call_the_stream_never_showed_open_is_replayed_it(
    live: LiveSettle, moment: str
) -> None:
    """The proxy began to follow after the call started (it never saw it open, so it announced
    nothing); a write-back settles it, and the server says so on its stream, before the client's
    stream comes back: the client, which never fetches again, must still be told, and the prompt."""
    live.following()
    live.following()  # the server crashed and is back; the stream never showed the call open
    await live.tasks.idle()
    state = {**PART["state"], "status": "error", "error": V1_ERROR, "metadata": {"interrupted": True}}
    settled = {**PART, "state": {**state, "time": {"start": 1, "end": 2}}}
    events = [("message.part.updated", {"part": settled, "time": 2}), *prompt_and_answer()]
    holds_the_settled_call_and_the_prompt(await comes_back(live, events, MOMENTS[moment]), settled)
