"""Changes a rule asks for, and how they are applied without disturbing the rest.

A change is an RFC 7386 JSON merge patch aimed at one object inside a message. Applying a
merge patch replaces existing keys in place and appends new ones, so the order of keys a
client sees is the server's order, and every field the patch does not name is kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rules.models import JSONObject
from rules.targets import Target

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Change:
    """One edit: `patch` merged into the object found at `path` inside a message.

    `target` names what the edit touches; `path` is only for applying it (`apply_changes`,
    `changed_object`), so no caller decodes it.
    """

    rule: str
    target: Target
    patch: JSONObject
    reason: str
    path: Path

    @property
    def on_tool(self) -> bool:
        """Whether the change settles a tool item (rather than the message itself)."""
        return self.target.part is not None


def merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> JSONObject:
    """Return `target` with `patch` merged in (RFC 7386); `target` itself is not modified."""
    merged = dict(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping):
            current = merged.get(key)
            merged[key] = merge_patch(current if isinstance(current, Mapping) else {}, value)
        else:
            merged[key] = value
    return merged


def apply_changes(message: Mapping[str, Any], changes: Iterable[Change]) -> JSONObject:
    """Return a copy of `message` with every change applied; untouched branches are shared."""
    result = dict(message)
    for change in changes:
        result = _apply_at(result, change.path, change.patch)
    return result


def changed_object(message: Mapping[str, Any], change: Change) -> Any:
    """The object of `message` that `change` is aimed at: the item, or the message's header."""
    node: Any = message
    for key in change.path:
        node = node[key]
    return node


def _apply_at(node: Any, path: Path, patch: JSONObject) -> Any:
    if not path:
        return merge_patch(node, patch)
    head, rest = path[0], path[1:]
    copy: Any = list(node) if isinstance(node, list) else dict(node)
    copy[head] = _apply_at(node[head], rest, patch)
    return copy
