"""The registry: rules in order, their triggers deciding what the rules see, and which of them
a writer may make durable."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from rules import (
    DEFAULT_RULES,
    REGISTRY,
    Api,
    Change,
    Liveness,
    Message,
    Registry,
    Trigger,
    needs_settling,
    runtime_for,
    settle,
    triggers_of,
)
from tests.fixtures import load

IDLE = Liveness("ses", active=False)


class Pinned:
    """A sign no built-in rule looks for: a v2 message carrying `"pinned": true`."""

    def positions(self, body: bytes, api: Api) -> Iterator[int]:
        position = body.find(b'"pinned":true')
        if position >= 0:
            yield position

    def matches(self, raw_message: Any, api: Api) -> bool:
        return type(raw_message) is dict and raw_message.get("pinned") is True


class Unpins:
    name: ClassVar[str] = "unpins"
    trigger: ClassVar[Trigger] = Pinned()
    durable: ClassVar[frozenset[Api]] = frozenset({Api.V2})

    def __call__(self, message: Message, liveness: Liveness) -> list[Change]:
        runtime = runtime_for(message)
        return [
            Change(self.name, runtime.target(message), {"pinned": False}, "unpinned", runtime.header_path)
        ]


def finished_v2_message() -> dict[str, Any]:
    message: dict[str, Any] = {"id": "msg_1", "type": "assistant", "time": {"created": 1, "completed": 2}}
    message["content"] = [{"type": "text", "id": "prt_1", "text": "done"}]
    return message


def test_a_rule_runs_on_a_message_only_its_own_trigger_matches() -> None:
    message = {**finished_v2_message(), "pinned": True}
    assert settle(message, Api.V2, IDLE) is None  # no built-in rule has anything to say
    found = settle(message, Api.V2, IDLE, rules=(Unpins(),))
    assert found is not None
    assert found.message["pinned"] is False
    assert [change.rule for change in found.changes] == ["unpins"]


def test_the_pre_check_is_the_rules_triggers() -> None:
    message = {**finished_v2_message(), "pinned": True}
    registry = Registry(DEFAULT_RULES)
    assert not needs_settling(message, Api.V2, registry)
    registry.register(Unpins())
    assert needs_settling(message, Api.V2, registry)
    assert not needs_settling(message, Api.V2)  # the default registry is untouched
    assert triggers_of(registry)[-1] is Unpins.trigger


def test_a_trigger_shared_by_two_rules_is_looked_for_once() -> None:
    assert len(triggers_of(REGISTRY)) == len(REGISTRY)
    assert len(triggers_of([*REGISTRY, *REGISTRY])) == len(REGISTRY)


def test_writers_are_told_which_rules_make_a_durable_change() -> None:
    assert [rule.name for rule in REGISTRY.durable(Api.V1)] == ["orphaned-tool", "unfinished-message"]
    assert [rule.name for rule in REGISTRY.durable(Api.V2)] == ["orphaned-tool"]
    registry = Registry(REGISTRY)
    registry.register(Unpins())
    assert [rule.name for rule in registry.durable(Api.V2)] == ["orphaned-tool", "unpins"]


def test_a_name_is_registered_once() -> None:
    registry = Registry([Unpins()])
    with pytest.raises(ValueError, match="unpins"):
        registry.register(Unpins())


def test_the_v2_durable_rules_leave_an_unfinished_message_unfinished() -> None:
    """v2 keeps a message as its event log says, and the log has no event that finishes one."""
    messages = load("v2-message-stale-running.json")["data"]
    assert any(settle(m, Api.V2, IDLE) is not None for m in messages)
    for message in messages:
        found = settle(message, Api.V2, IDLE, rules=REGISTRY.durable(Api.V2))
        assert found is None or {change.rule for change in found.changes} == {"orphaned-tool"}
