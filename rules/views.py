"""Whole message views as opencode serves them, settled at once.

This is the entry point for code that already has a parsed body (another framework, a
script): `settle_view(document, api, liveness)` returns the settled document and what
changed, with no I/O. The view shapes:

- v1 list `[{info, parts}]`, v1 single `{info, parts}`;
- v2 list `{"data": [message], "cursor": {...}}` (the context view has no cursor),
  v2 single `{"data": message}`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rules.changes import Change
from rules.engine import Settlement, settle
from rules.liveness import Liveness
from rules.models import Api
from rules.registry import DEFAULT_RULES
from rules.rule import Rule
from rules.runtimes import Runtime, runtime_of


@dataclass(frozen=True, slots=True)
class SettledMessages:
    """The messages of a view that the rules changed: each one's position and settlement."""

    settled: tuple[tuple[int, Settlement], ...]
    changes: tuple[Change, ...] = field(init=False, repr=False, compare=False)
    """Every change, message by message. It and the figures below are gathered once, since a
    settled view is read again for each client that polls it (headers, counts, write-back)."""
    rules: tuple[str, ...] = field(init=False, repr=False, compare=False)
    """The rules that changed something, each once, in the order of their first change."""
    settled_parts: int = field(init=False, repr=False, compare=False)
    """How many tool parts were settled (changes to messages themselves are not counted)."""

    def __post_init__(self) -> None:
        changes = tuple(change for _, settlement in self.settled for change in settlement.changes)
        object.__setattr__(self, "changes", changes)
        object.__setattr__(self, "rules", tuple(dict.fromkeys(change.rule for change in changes)))
        object.__setattr__(self, "settled_parts", sum(1 for change in changes if change.on_tool))

    @property
    def last_alive(self) -> int:
        """The latest moment any settled tool of the view is known to have been alive (epoch ms)."""
        return max(settlement.last_alive for _, settlement in self.settled)


@dataclass(frozen=True, slots=True)
class ViewSettlement:
    """A settled view: the new document, and what changed in it."""

    document: Any
    messages: SettledMessages

    @property
    def changes(self) -> tuple[Change, ...]:
        return self.messages.changes


def messages_of(document: Any, api: Api, *, single: bool) -> list[Any]:
    """The messages of a view, in the view's order; `UnexpectedShape` if it is not a view."""
    return runtime_of(api).messages_of(document, single=single)


def with_messages(document: Any, api: Api, messages: list[Any], *, single: bool) -> Any:
    """`document` with its messages replaced; every other field kept in place."""
    return runtime_of(api).with_messages(document, messages, single=single)


def settle_view(
    document: Any,
    api: Api,
    liveness: Liveness,
    *,
    single: bool = False,
    rules: Sequence[Rule] = DEFAULT_RULES,
    runtime: Runtime[Any] | None = None,
) -> ViewSettlement | None:
    """Settle every message of a parsed view, in the shape of `runtime` (default: the one
    1.18.33 serves `api` in); None when nothing changes."""
    messages = messages_of(document, api, single=single)
    settled = tuple(
        (index, found)
        for index, message in enumerate(messages)
        if (found := settle(message, api, liveness, rules, runtime=runtime)) is not None
    )
    if not settled:
        return None
    for index, found in settled:
        messages[index] = found.message
    return ViewSettlement(with_messages(document, api, messages, single=single), SettledMessages(settled))
