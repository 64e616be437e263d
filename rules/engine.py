"""Run the rules over one raw message: the single entry point for the proxy and the library."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from rules.changes import Change, apply_changes, changed_object
from rules.liveness import Liveness
from rules.models import Api, JSONObject
from rules.registry import DEFAULT_RULES, needs_settling
from rules.rule import Rule
from rules.runtimes import Runtime, UnexpectedShape, runtime_of

__all__ = ["Settlement", "UnexpectedShape", "settle"]


@dataclass(frozen=True, slots=True)
class Settlement:
    """A message after the rules ran: the new JSON and the changes that produced it."""

    message: JSONObject
    changes: tuple[Change, ...]
    last_alive: int
    """The latest moment anything in the message is known to have been alive (epoch ms)."""

    def settled(self, change: Change) -> JSONObject:
        """The object `change` settled, as it is now: the tool item, or the message's header."""
        found: JSONObject = changed_object(self.message, change)
        return found


def settle(
    raw_message: Any,
    api: Api,
    liveness: Liveness,
    rules: Sequence[Rule] = DEFAULT_RULES,
    *,
    runtime: Runtime[Any] | None = None,
) -> Settlement | None:
    """Return the settled message, or None when no rule has anything to change. `runtime` is the
    shape the server settles in (default: the one 1.18.33 serves `api` in).

    Messages no rule's trigger matches are skipped before validation: on a long history almost
    every message is such, and validating them all would dominate the cost of a rewrite.
    """
    if liveness.active or not needs_settling(raw_message, api, rules):
        return None
    runtime = runtime or runtime_of(api)
    try:
        message = runtime.model.model_validate(raw_message)
    except ValidationError as error:
        raise UnexpectedShape(f"{api} message does not validate: {error.error_count()} error(s)") from error
    changes = tuple(change for rule in rules for change in rule(message, liveness))
    if not changes:
        return None
    return Settlement(apply_changes(raw_message, changes), changes, runtime.last_alive(message))
