"""The rules that run, in order, and everything derived from them.

Adding a rule means registering it (`REGISTRY.register(rule)`, or a `Registry` of one's own
given to whoever runs the rules): the checks that decide which messages are looked at are its
rules' triggers, and a writer asks it which rules make a durable change, so no other module
names a rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

from rules.models import Api
from rules.orphaned_tool import OrphanedTool
from rules.rule import Rule, Trigger
from rules.stale_compaction import StaleCompaction
from rules.unfinished_message import UnfinishedMessage

__all__ = ["DEFAULT_RULES", "REGISTRY", "Registry", "needs_settling", "triggers_of"]


class Registry(Sequence[Rule]):
    """An ordered set of rules with distinct names; its triggers are kept, each once."""

    def __init__(self, rules: Iterable[Rule] = ()) -> None:
        self._rules: list[Rule] = []
        self._triggers: tuple[Trigger, ...] = ()
        self._durable: dict[Api, Registry] = {}
        for rule in rules:
            self.register(rule)

    def register(self, rule: Rule) -> Rule:
        """Run `rule` after the ones registered so far (a name already taken is refused)."""
        if any(known.name == rule.name for known in self._rules):
            raise ValueError(f"a rule named {rule.name!r} is already registered")
        self._rules.append(rule)
        self._triggers = tuple(dict.fromkeys(known.trigger for known in self._rules))
        self._durable.clear()
        return rule

    @property
    def triggers(self) -> tuple[Trigger, ...]:
        """The triggers of the rules, each once, in the rules' order."""
        return self._triggers

    def durable(self, api: Api) -> Registry:
        """The rules whose changes a write-back can make durable in `api`'s storage."""
        if api not in self._durable:
            self._durable[api] = Registry(rule for rule in self._rules if api in rule.durable)
        return self._durable[api]

    @overload
    def __getitem__(self, index: int) -> Rule: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Rule]: ...

    def __getitem__(self, index: int | slice) -> Rule | Sequence[Rule]:
        return self._rules[index]

    def __len__(self) -> int:
        return len(self._rules)

    def __iter__(self) -> Iterator[Rule]:
        return iter(self._rules)


REGISTRY = Registry((OrphanedTool(), UnfinishedMessage(), StaleCompaction()))
DEFAULT_RULES: Sequence[Rule] = REGISTRY
"""The rules that run by default: the registry's, as registered when they run."""


def triggers_of(rules: Sequence[Rule]) -> tuple[Trigger, ...]:
    """The triggers of `rules`, each once (kept by a `Registry`, found for any other sequence)."""
    if isinstance(rules, Registry):
        return rules.triggers
    return tuple(dict.fromkeys(rule.trigger for rule in rules))


def needs_settling(raw_message: Any, api: Api, rules: Sequence[Rule] = DEFAULT_RULES) -> bool:
    """Whether any of `rules` could have something to say about `raw_message` (cheap, on raw JSON)."""
    return any(trigger.matches(raw_message, api) for trigger in triggers_of(rules))
