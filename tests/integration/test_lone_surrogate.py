"""A string cut inside an emoji, on the real opencode 1.18.33: stored and served as the escape
`\\ud83d`, which strict JSON decoders refuse; the proxy still settles the view and keeps it.

The mock model gives the bash call a description that ends in a lone surrogate (as a model or a
tool that truncates text by UTF-16 units can); the server keeps it, and after a crash mid-tool
the whole message list holding it must still be settled through the proxy.
"""

from __future__ import annotations

import json

import orjson
import pytest

from .http_client import request as http_request
from .mock_model import MockModel, Plan
from .opencode_server import OpencodeServer
from .turns import start_turn, wait_tool_running

pytestmark = pytest.mark.integration

CUT = "demo \ud83d"
ESCAPED = b'"description":"demo \\ud83d"'


def test_a_view_with_a_lone_surrogate_is_settled_and_keeps_it(
    opencode: OpencodeServer, mock_model: MockModel, proxy_url: str
) -> None:
    turns = {}
    for runtime in ("v1", "v2"):
        prompt = f"cut inside an emoji {runtime}"
        mock_model.plan(prompt, Plan(description=CUT))
        turns[runtime] = start_turn(runtime, opencode.url, opencode.project, prompt)
    for turn in turns.values():
        assert wait_tool_running(opencode.url, turn).tool
    opencode.crash()
    opencode.restart()
    for runtime, turn in turns.items():
        direct = http_request("GET", opencode.url + turn.messages_path)
        assert ESCAPED in direct.body, "the server serves the lone surrogate as JSON.stringify writes it"
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(direct.body)
        through = http_request("GET", proxy_url + turn.messages_path)
        assert through.status == 200
        assert through.headers["X-Settle-Settled"] == "1", runtime
        assert ESCAPED in through.body
        messages = json.loads(through.body)
        items = [
            item
            for message in (messages if runtime == "v1" else messages["data"])
            for item in message.get("parts" if runtime == "v1" else "content", [])
            if item.get("type") == "tool"
        ]
        assert [item["state"]["status"] for item in items] == ["error"]
        assert items[0]["state"]["input"]["description"] == CUT
