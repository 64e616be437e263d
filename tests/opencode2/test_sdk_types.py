"""The frames the proxy slips into a 2.x client's `/api/event` after a crash, checked against the
v2 SDK's own TypeScript types for them.

The types are those of opencode's generated v2 JS client, `@opencode-ai/client` (the v2 TUI reads
`/api/event` with it), in `packages/client/src/promise/generated/types.ts` of anomalyco/opencode's
`v2` branch at 2092350c (the build `docs/opencode-2x.md` measured), generated from the event schema
`SessionEvent.Tool.Failed` and `SessionEvent.Execution.Interrupted` of
`packages/schema/src/session-event.ts` at the same commit. Only their facts are written down here:
which properties each type declares, which are required, and the literal values it allows.

`durable` (`{aggregateID, seq, version}`) is the one required property the frames lack, on
purpose: its `seq` is the server's place in its own log, which only the server can give, and a
made-up one would claim a durable event the server never wrote. The v2 TUI needs none: its client
parses each frame with `JSON.parse(data) as A` (no schema check,
`packages/client/src/promise/generated/client.ts`, `sse`), reads `durable` only behind
`"durable" in event.value` (`packages/tui/src/context/client.tsx`, `connect`), and its reducer
(`packages/tui/src/context/data.tsx`, `handleEvent`) reads `data` alone for both events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from proxy.opencode.events_2x import api_execution_interrupted, api_tool_failed
from rules import V2X, Api, Liveness, settle_view
from tests.fixtures.opencode2 import load

COMMIT = "2092350cfa1059699f4d861c950086dee5f63708"
TYPES = f"packages/client/src/promise/generated/types.ts@{COMMIT[:8]}"
"""Where every type below is declared (anomalyco/opencode, the `v2` branch)."""

SESSION = "ses_dc52e3b44ffeeqkVYR72qR3vLc"
DIRECTORY = "/tmp/v2/run1/proj"
"""The measured session's, from `measured-2092350c-events-next-prompt.json`."""


@dataclass(frozen=True)
class OneOf:
    """A literal type, or a union of literals: the only values allowed."""

    values: tuple[str | int, ...]


@dataclass(frozen=True)
class Obj:
    """An object type: its required and optional properties, each a type; `name` is the type's
    identifier in `TYPES`, or where in one it is written inline."""

    name: str
    required: Mapping[str, Type]
    optional: Mapping[str, Type] = field(default_factory=dict)


Type = type | Obj | OneOf
"""`str` is TypeScript's `string`, `float` its `number`, `bool` its `boolean`, `dict` a record
(`{ [x: string]: … }`), `list` a tuple or array."""

LOCATION_REF = Obj("LocationRef", {"directory": str}, {"workspaceID": str})
STRUCTURED_ERROR = Obj("SessionStructuredError", {"type": str, "message": str}, {"status": float})


def durable(version: int) -> Obj:
    """The `durable` property of a durable event of the schema version `version`."""
    return Obj("durable", {"aggregateID": str, "seq": float, "version": OneOf((version,))})


def envelope(name: str, kind: str, version: int, data: Obj) -> Obj:
    """The properties every `/api/event` event type of `TYPES` declares around its `data`."""
    required: dict[str, Type] = {
        "id": str,
        "created": float,
        "type": OneOf((kind,)),
        "durable": durable(version),
        "data": data,
    }
    return Obj(name, required, {"metadata": dict, "location": LOCATION_REF})


SESSION_TOOL_FAILED = envelope(
    "SessionToolFailed",
    "session.tool.failed",
    2,
    Obj(
        "SessionToolFailed.data",
        {"sessionID": str, "assistantMessageID": str, "id": str, "error": STRUCTURED_ERROR, "executed": bool},
        {"content": list, "metadata": dict, "resultState": dict},
    ),
)
SESSION_EXECUTION_INTERRUPTED = envelope(
    "SessionExecutionInterrupted",
    "session.execution.interrupted",
    1,
    Obj(
        "SessionExecutionInterrupted.data",
        {"sessionID": str, "reason": OneOf(("user", "shutdown", "superseded"))},
    ),
)

MISSING_ON_PURPOSE = frozenset({"durable"})
"""Required properties the proxy's frames leave out: the server's own sequence (see the top)."""


def violations(
    value: Any, expected: Type, where: str, *, allowed_missing: frozenset[str] = frozenset()
) -> list[str]:
    """Where `value` breaks `expected`, one line each (none: it is a value of the type)."""
    if isinstance(expected, OneOf):
        return [] if value in expected.values else [f"{where}: {value!r} is none of {expected.values}"]
    if isinstance(expected, type):
        numeric = expected is float and isinstance(value, int | float)
        if isinstance(value, bool) is (expected is bool) and (numeric or isinstance(value, expected)):
            return []
        return [f"{where}: {value!r} is not a {expected.__name__}"]
    if not isinstance(value, dict):
        return [f"{where}: {value!r} is not an object ({expected.name})"]
    declared = {**expected.required, **expected.optional}
    missing = set(expected.required) - set(value) - allowed_missing
    found = [f"{where}.{key}: missing" for key in expected.required if key in missing]
    found += [f"{where}.{key}: not declared by {expected.name}" for key in value if key not in declared]
    for key, kind in declared.items():
        if key in value:
            found += violations(value[key], kind, f"{where}.{key}")
    return found


def settled_call() -> dict[str, Any]:
    """The shell call measured running on 2092350c after the kill, settled as the proxy settles it."""
    message = load("measured-2092350c-message-running.json")
    view = settle_view(message, Api.V2, Liveness(SESSION, active=False), single=True, runtime=V2X)
    assert view is not None
    item: dict[str, Any] = view.document["data"]["content"][0]
    return item


def tool_failed() -> dict[str, Any]:
    """The `session.tool.failed` frame the proxy builds for that call."""
    item = settled_call()
    message_id = load("measured-2092350c-message-running.json")["data"]["id"]
    return api_tool_failed(SESSION, message_id, item, directory=DIRECTORY)


def execution_interrupted() -> dict[str, Any]:
    """The `session.execution.interrupted` frame the proxy sends after it."""
    return api_execution_interrupted(SESSION, settled_call()["time"]["completed"], DIRECTORY)


FRAMES = [
    pytest.param(tool_failed, SESSION_TOOL_FAILED, id="session.tool.failed"),
    pytest.param(execution_interrupted, SESSION_EXECUTION_INTERRUPTED, id="session.execution.interrupted"),
]


@pytest.mark.parametrize(("build", "expected"), FRAMES)
def test_the_frame_is_a_value_of_the_sdk_type_but_for_durable(build: Any, expected: Obj) -> None:
    frame = build()
    assert violations(frame, expected, expected.name, allowed_missing=MISSING_ON_PURPOSE) == []
    assert "durable" not in frame
    assert violations(frame, expected, expected.name) == [f"{expected.name}.durable: missing"]


@pytest.mark.parametrize(("build", "expected"), FRAMES)
def test_a_frame_without_a_required_property_is_caught(build: Any, expected: Obj) -> None:
    """The check can fail: drop any other required property, of the frame or of its `data`, and it says so."""
    data = expected.required["data"]
    assert isinstance(data, Obj)
    for key in set(expected.required) - MISSING_ON_PURPOSE:
        frame = build()
        del frame[key]
        assert violations(frame, expected, "f", allowed_missing=MISSING_ON_PURPOSE) == [f"f.{key}: missing"]
    for key in data.required:
        frame = build()
        del frame["data"][key]
        assert violations(frame, expected, "f", allowed_missing=MISSING_ON_PURPOSE) == [
            f"f.data.{key}: missing"
        ]


def test_a_wrong_literal_or_an_undeclared_property_is_caught() -> None:
    ended = execution_interrupted()
    ended["data"]["reason"] = "crash"
    failed = tool_failed()
    failed["data"]["callID"] = failed["data"].pop("id")
    failed["data"]["executed"] = 0
    assert violations(ended, SESSION_EXECUTION_INTERRUPTED, "e", allowed_missing=MISSING_ON_PURPOSE) == [
        "e.data.reason: 'crash' is none of ('user', 'shutdown', 'superseded')"
    ]
    assert violations(failed, SESSION_TOOL_FAILED, "f", allowed_missing=MISSING_ON_PURPOSE) == [
        "f.data.id: missing",
        "f.data.callID: not declared by SessionToolFailed.data",
        "f.data.executed: 0 is not a bool",
    ]


def test_the_server_own_frame_is_a_value_of_the_type_durable_and_all() -> None:
    """The types as written down here hold for what the real server sent at 2092350c, when it
    settled the same call at the next prompt; the proxy's frame says what it said, but `durable`
    and the event's own id and time."""
    events = load("measured-2092350c-events-next-prompt.json")
    server = next(event for event in events if event["type"] == "session.tool.failed")
    assert violations(server, SESSION_TOOL_FAILED, "server") == []
    assert server["data"] == tool_failed()["data"]
