"""opencode's vocabulary is spelled in one module: every other module of the proxy asks it.

An event type the proxy reads or sends is a name of `proxy.opencode.vocabulary`; so are the v1
session statuses. These tests read the proxy's source (with `ast`, so comments and docstrings
that mention an event do not count) and fail on a string constant that spells one elsewhere.
The known types are the vocabulary's own and every type opencode 1.18.33 was captured sending
(`tests/fixtures/opencode-1.18.33/`), so a module that starts reading a new event by its
literal is caught too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from proxy.opencode import vocabulary
from proxy.opencode.vocabulary import (
    EVENT_PREFIXES,
    EVENT_TYPES,
    SESSION_STATUS,
    TOOL_FAILED,
    V1_STATUS_ACTIVE,
    event_name,
    for_replay,
    tool_failed,
)

ROOT = Path(__file__).resolve().parents[3]
PROXY = ROOT / "proxy"
FIXTURES = ROOT / "tests" / "fixtures" / "opencode-1.18.33"
FIXTURES_2X = ROOT / "tests" / "fixtures" / "opencode-2.x"
OWN = Path(vocabulary.__file__).resolve()
NOT_OPENCODE = ("relay", "system")
"""Layers that know nothing of opencode: a word such as "idle" there is their own."""


def _captured_types() -> set[str]:
    found: set[str] = set()
    for capture in [*FIXTURES.iterdir(), *FIXTURES_2X.glob("*.json")]:
        for kind in re.findall(r'"type": ?"([a-z]+(?:\.[a-zA-Z0-9_]+)+)"', capture.read_text()):
            found.add(event_name(kind))
    return found


KNOWN_TYPES = frozenset(EVENT_TYPES) | _captured_types()


def _spells_event(value: str) -> bool:
    if event_name(value) in KNOWN_TYPES:
        return True
    return value.endswith(".") and (
        value in EVENT_PREFIXES or any(kind.startswith(value) for kind in KNOWN_TYPES)
    )


def _constants(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def _elsewhere(spells: object) -> list[str]:
    assert callable(spells)
    return [
        f"{path.relative_to(ROOT)}:{line}: {value!r}"
        for path in sorted(PROXY.rglob("*.py"))
        if path.resolve() != OWN
        for line, value in _constants(path)
        if spells(value, path)
    ]


def test_the_captures_name_the_events_the_proxy_reads() -> None:
    assert {SESSION_STATUS, TOOL_FAILED} <= _captured_types()


def test_no_module_but_the_vocabulary_spells_an_opencode_event_type() -> None:
    assert _elsewhere(lambda value, _: _spells_event(value)) == []


def test_no_opencode_module_spells_a_v1_session_status() -> None:
    def spells(value: str, path: Path) -> bool:
        layer = path.relative_to(PROXY).parts[0]
        return layer not in NOT_OPENCODE and value in V1_STATUS_ACTIVE

    assert _elsewhere(spells) == []


def test_the_v2_failure_is_one_event_live_and_as_replayed() -> None:
    item = {"id": "call_1", "time": {"completed": 7}, "provider": {"executed": True}}
    live = tool_failed("ses_1", "msg_1", item)
    replayed = for_replay(live, "ses_1", 12)
    assert live["type"] == "session.next.tool.failed"
    assert live["data"] == {
        "timestamp": 7,
        "sessionID": "ses_1",
        "assistantMessageID": "msg_1",
        "callID": "call_1",
        "error": {"type": "unknown", "message": "Tool execution interrupted"},
        "provider": {"executed": True},
    }
    assert replayed == {
        "id": live["id"],
        "aggregateID": "ses_1",
        "seq": 12,
        "type": "session.next.tool.failed.1",
        "data": live["data"],
    }


def test_a_part_update_names_its_part_settled_only_in_a_settled_status() -> None:
    def update(status: object, kind: str = "message.part.updated") -> str | None:
        return vocabulary.settled_part_id(
            kind, {"part": {"id": "prt_1", "type": "tool", "state": {"status": status}}}
        )

    assert [update(status) for status in ("error", "completed", "running", "pending", None)] == [
        "prt_1",
        "prt_1",
        None,
        None,
        None,
    ]
    assert update("error", kind="message.updated") is None


def test_only_a_tool_part_is_named_settled() -> None:
    text = {"id": "prt_1", "type": "text", "state": {"status": "completed"}}
    assert vocabulary.settled_part_id("message.part.updated", {"part": text}) is None
