"""Response bodies for the fake upstream, scaled up from real opencode 1.18.33 captures.

Every message, part and event is a copy of a captured one (only ids, times and counts change),
so the proxy parses, validates and rewrites exactly the shapes the real server sends. Both the
fake upstream (which serves the bodies) and the runner (which requests them) import the case
definitions from here, so a session id or path can never disagree between the two.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "opencode-1.18.33"
DIRECTORY = "/home/dev/work/proj"
TOOLS_PER_MESSAGE = 10
CONFIG_BYTES = 2048
CONFIG_PATH = "/config"
EVENT_PATH = "/event"
BLOB_PATH = "/bench/blob"
# `sentNs` is CLOCK_MONOTONIC, which is system-wide on Linux: the client on the same host
# subtracts it from its own reading to get the one-way delivery latency of each event.
SENT_MARK = '"__bench__"'

Json = Any


class Api(StrEnum):
    """The two opencode runtimes, whose message views and liveness routes differ."""

    V1 = "v1"
    V2 = "v2"


class Variant(StrEnum):
    """What the proxy finds in a message list, which decides how much work it does."""

    CLEAN = "clean"  # every tool completed: nothing to rewrite
    STALE = "stale"  # one tool still running in an inactive session: rewritten
    ACTIVE = "active"  # the same running tool, but the server lists the session as active


@dataclass(frozen=True, slots=True)
class MessageCase:
    """One message-list route of the fake upstream."""

    api: Api
    tools: int
    variant: Variant

    @property
    def name(self) -> str:
        return f"{self.api}-msg-{self.tools}-{self.variant}"

    @property
    def session_id(self) -> str:
        return f"ses_bench{self.api}{self.variant}{self.tools:07d}"

    @property
    def path(self) -> str:
        prefix = "/api/session" if self.api is Api.V2 else "/session"
        return f"{prefix}/{self.session_id}/message"


def message_cases(tool_counts: Iterable[int], apis: Iterable[Api] = tuple(Api)) -> list[MessageCase]:
    """All variants for each runtime and size, in a stable order."""
    return [MessageCase(api, tools, variant) for api in apis for tools in tool_counts for variant in Variant]


def compact(value: Json) -> bytes:
    """Serialize like the real server: no whitespace."""
    return json.dumps(value, separators=(",", ":")).encode()


def load_fixture(fixtures: Path, name: str) -> Json:
    return json.loads((fixtures / name).read_text())


def _id(prefix: str, serial: int) -> str:
    """An opencode-looking id (prefix, 12 hex digits of time, 14 more characters) unique per serial."""
    return f"{prefix}_{0x229400000000 + serial:012x}bench{serial:09d}"


def config_body() -> bytes:
    """A ~2 KB opencode config: the kind of small JSON a client fetches on every screen."""
    models: dict[str, Json] = {}
    config = {
        "$schema": "https://opencode.ai/config.json",
        "model": "mock/m0",
        "share": "manual",
        "autoupdate": False,
        "provider": {"mock": {"npm": "@ai-sdk/openai-compatible", "name": "Mock", "models": models}},
    }
    while len(compact(config)) < CONFIG_BYTES:
        models[f"m{len(models)}"] = {"name": f"Mock model {len(models)}", "limit": {"context": 128000}}
    return compact(config)


class V2Builder:
    """v2 `GET /api/session/{id}/message`: `{"data":[newest first…],"cursor":…}`."""

    def __init__(self, fixtures: Path) -> None:
        stale = load_fixture(fixtures, "v2-message-stale-running.json")
        settled = load_fixture(fixtures, "v2-message-interrupted.json")["data"][0]
        self.cursor = stale["cursor"]
        self.user = stale["data"][1]
        self.open_message = {k: v for k, v in stale["data"][0].items() if k != "content"}
        self.running_tool = stale["data"][0]["content"][0]
        self.done_message = {k: v for k, v in settled.items() if k != "content"}
        self.done_tool = copy.deepcopy(settled["content"][0])
        del self.done_tool["state"]["error"]
        self.done_tool["state"]["status"] = "completed"
        self.done_tool["state"]["content"] = [{"type": "text", "text": "hello\n"}]

    def body(self, case: MessageCase) -> bytes:
        turns = case.tools // TOOLS_PER_MESSAGE
        data: list[Json] = []
        for turn in reversed(range(turns)):
            is_open = case.variant is not Variant.CLEAN and turn == turns - 1
            data.append(self._assistant(turn, is_open))
            data.append(self._user(turn))
        return compact({"data": data, "cursor": self.cursor})

    def _user(self, turn: int) -> Json:
        user = copy.deepcopy(self.user)
        user["id"] = _id("msg", 2 * turn)
        return user

    def _assistant(self, turn: int, is_open: bool) -> Json:
        message = copy.deepcopy(self.open_message if is_open else self.done_message)
        message["id"] = _id("msg", 2 * turn + 1)
        content = []
        for index in range(TOOLS_PER_MESSAGE):
            running = is_open and index == TOOLS_PER_MESSAGE - 1
            tool = copy.deepcopy(self.running_tool if running else self.done_tool)
            tool["id"] = f"call_bench_{turn * TOOLS_PER_MESSAGE + index}"
            content.append(tool)
        message["content"] = content
        return message


class V1Builder:
    """v1 `GET /session/{id}/message`: `[{info, parts}, …]`, oldest first."""

    def __init__(self, fixtures: Path) -> None:
        stale = load_fixture(fixtures, "v1-message-stale-running.json")
        aborted = load_fixture(fixtures, "v1-message-aborted.json")
        self.user = stale[0]
        self.open_info = stale[1]["info"]
        self.step_start, self.running_tool = stale[1]["parts"]
        self.done_info = {k: v for k, v in aborted[1]["info"].items() if k != "error"}
        self.done_tool = aborted[1]["parts"][1]
        self.session_info = load_fixture(fixtures, "v1-session-info-after-restart.json")

    def body(self, case: MessageCase) -> bytes:
        turns = case.tools // TOOLS_PER_MESSAGE
        messages: list[Json] = []
        for turn in range(turns):
            is_open = case.variant is not Variant.CLEAN and turn == turns - 1
            messages.append(self._user(case.session_id, turn))
            messages.append(self._assistant(case.session_id, turn, is_open))
        return compact(messages)

    def info(self, case: MessageCase) -> bytes:
        """`GET /session/{id}`: the v1 liveness lookup starts here to learn the directory."""
        return compact({**self.session_info, "id": case.session_id, "directory": DIRECTORY})

    def _user(self, session_id: str, turn: int) -> Json:
        message = copy.deepcopy(self.user)
        message_id = _id("msg", 2 * turn)
        message["info"].update(id=message_id, sessionID=session_id)
        for part in message["parts"]:
            part.update(id=_id("prt", 100 * turn), sessionID=session_id, messageID=message_id)
        return message

    def _assistant(self, session_id: str, turn: int, is_open: bool) -> Json:
        message_id = _id("msg", 2 * turn + 1)
        info = copy.deepcopy(self.open_info if is_open else self.done_info)
        info.update(id=message_id, sessionID=session_id, parentID=_id("msg", 2 * turn))
        parts = [copy.deepcopy(self.step_start)]
        for index in range(TOOLS_PER_MESSAGE):
            running = is_open and index == TOOLS_PER_MESSAGE - 1
            parts.append(copy.deepcopy(self.running_tool if running else self.done_tool))
        for serial, part in enumerate(parts, start=100 * turn + 1):
            part.update(id=_id("prt", serial), sessionID=session_id, messageID=message_id)
            if part["type"] == "tool":
                part["callID"] = f"call_bench_{serial}"
        return {"info": info, "parts": parts}


def v2_active_body(cases: Iterable[MessageCase]) -> bytes:
    """`GET /api/session/active`: the v2 sessions with a running turn."""
    active = {
        c.session_id: {"type": "running"} for c in cases if c.api is Api.V2 and c.variant is Variant.ACTIVE
    }
    return compact({"data": active})


def v1_status_body(cases: Iterable[MessageCase]) -> bytes:
    """`GET /session/status?directory=…`: the busy v1 sessions; an absent one is idle."""
    return compact(
        {c.session_id: {"type": "busy"} for c in cases if c.api is Api.V1 and c.variant is Variant.ACTIVE}
    )


def event_template(fixtures: Path) -> tuple[bytes, bytes]:
    """A captured `message.part.updated` SSE frame, split where the send stamp goes."""
    part = load_fixture(fixtures, "v1-message-aborted.json")[1]["parts"][1]
    event = {
        "id": "evt_2294392e30016SkrL2HnBe2f7V",
        "type": "message.part.updated",
        "properties": {
            "sessionID": part["sessionID"],
            "part": part,
            "time": 1795988624099,
            "bench": "__bench__",
        },
    }
    head, tail = compact(event).split(SENT_MARK.encode())
    return b"data: " + head, tail + b"\n\n"


def sent_ns(event: Json) -> int | None:
    """The send stamp of a benchmark event, or None for other events (e.g. server.connected)."""
    bench = event.get("properties", {}).get("bench") if isinstance(event, dict) else None
    return bench["sentNs"] if isinstance(bench, dict) else None
