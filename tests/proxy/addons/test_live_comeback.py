"""A client stream open across a crash comes back at any moment of a resume, and ends up holding
the settled call and the resume's prompt (issue 28).

The server's events after the crash, in the order a resume makes it send them: the write-back of
the settled part, then the prompt (the session busy, the user message and its text, the session
renamed), then the resumed turn's answer and the session idle again. A client (the web UI, the
TUI: they never fetch again) holds what it was told before the crash, then what its new stream
carries: the proxy's replay, then the server's events from its reconnect on. Its stream comes
back before the write-back, between the write-back and the prompt, or after the prompt,
deterministically: each event is handed to the addon as the tracker hands it, and to the client
only once its stream is back.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy import testing
from proxy.addons.live import LiveSettle
from proxy.opencode.tracker import GlobalEvent
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
MOMENTS = {"before the write-back": 0, "between the write-back and the prompt": 1, "after the prompt": 5}


def prompt_and_answer() -> list[tuple[str, dict[str, Any]]]:
    return [
        ("session.status", {"status": {"type": "busy"}}),
        ("message.updated", {"info": USER}),
        ("message.part.updated", {"part": PROMPT_TEXT}),
        ("session.updated", {"info": {"id": V1, "title": "resumed"}}),
        ("message.updated", {"info": ANSWER}),
        ("message.part.updated", {"part": ANSWER_TEXT}),
        ("message.updated", {"info": {**ANSWER, "time": {"created": 4, "completed": 5}}}),
        ("session.status", {"status": {"type": "idle"}}),
        ("session.idle", {}),
    ]


class Client:
    """What a client builds from its stream: parts and messages by id, and the session's status."""

    def __init__(self) -> None:
        self.parts: dict[str, Any] = {PART["id"]: PART}
        self.messages: dict[str, Any] = {MESSAGE["info"]["id"]: MESSAGE["info"]}
        self.status = "busy"

    def take(self, payload: dict[str, Any]) -> None:
        kind, properties = payload["type"], payload["properties"]
        if kind == "message.part.updated":
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
    part: dict[str, Any] = frames[0]["payload"]["properties"]["part"]
    return part


@pytest.mark.parametrize("moment", MOMENTS)
async def test_a_client_back_at_any_moment_holds_the_settled_call_and_the_prompt(
    live: LiveSettle, moment: str
) -> None:
    live.event(GlobalEvent("/cwd", "prj", "message.part.updated", {"sessionID": V1, "part": PART, "time": 1}))
    live.following()  # the server crashed and is back
    await live.tasks.idle()  # the part is confirmed orphaned, and announced
    settled = await settled_part(live)
    events = [("message.part.updated", {"part": settled, "time": 2}), *prompt_and_answer()]
    client = Client()
    back = MOMENTS[moment]
    for kind, properties in events[:back]:
        live.event(GlobalEvent("/cwd", "prj", kind, {"sessionID": V1, **properties}))
    flow = testing.flow("GET", "/global/event", response_headers=SSE)
    async with testing.streaming(live, flow):
        assert flow.injected is not None
        while not flow.injected.empty():
            client.take(orjson.loads(flow.injected.get_nowait().removeprefix(b"data: "))["payload"])
        for kind, properties in events[back:]:  # on the client's own stream too, as the server sent them
            live.event(GlobalEvent("/cwd", "prj", kind, {"sessionID": V1, **properties}))
            client.take({"type": kind, "properties": {"sessionID": V1, **properties}})
    assert client.parts[PART["id"]]["state"]["status"] == "error", "the interrupted call still runs"
    assert client.parts[PART["id"]] == settled
    assert client.messages.get(USER["id"]) == USER, "the resume's prompt is missing"
    assert client.parts.get(PROMPT_TEXT["id"]) == PROMPT_TEXT
    assert client.status == "idle"
