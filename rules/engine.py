"""Run the rules over one raw message: the single entry point for the proxy and the library."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from rules.changes import Change, apply_changes
from rules.liveness import Liveness
from rules.models import Api, JSONObject, Message, V1Message, V2Message
from rules.registry import DEFAULT_RULES
from rules.rule import Rule
from rules.tools import message_last_alive, needs_settling


class UnexpectedShape(ValueError):
    """The message is not the shape the rules know; it must be passed on unchanged."""


@dataclass(frozen=True, slots=True)
class Settlement:
    """A message after the rules ran: the new JSON and the changes that produced it."""

    message: JSONObject
    changes: tuple[Change, ...]
    last_alive: int
    """The latest moment anything in the message is known to have been alive (epoch ms)."""


_MODELS: Mapping[Api, type[Message]] = {Api.V1: V1Message, Api.V2: V2Message}


def settle(
    raw_message: Any, api: Api, liveness: Liveness, rules: Sequence[Rule] = DEFAULT_RULES
) -> Settlement | None:
    """Return the settled message, or None when no rule has anything to change.

    Messages with neither an open tool nor an unfinished turn are skipped before validation:
    on a long history almost every message is such, and validating them all would dominate
    the cost of a rewrite.
    """
    if liveness.active or not needs_settling(raw_message, api):
        return None
    try:
        message = _MODELS[api].model_validate(raw_message)
    except ValidationError as error:
        raise UnexpectedShape(f"{api} message does not validate: {error.error_count()} error(s)") from error
    changes = tuple(change for rule in rules for change in rule(message, liveness))
    if not changes:
        return None
    return Settlement(apply_changes(raw_message, changes), changes, message_last_alive(message))
