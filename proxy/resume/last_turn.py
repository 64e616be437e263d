"""What a session's message view says about its last turn: was it cut off, and where.

Pure: a parsed view in, an `InterruptedTurn` (or the reason there is none) out. Where a view
keeps what is asked here (headers, roles, tools, the settled shape) is the runtime's to say that
the server's dialect reads it with (`proxy.resume.sending.Server.rules`): 2.x settles a call
otherwise than 1.18's v2 does, in the same layout. Every runtime gives every message an ascending
id (`msg_…`, sorted by creation), so the newest message is the one with the greatest id, whatever
order the view lists them in (v1 oldest first, v2 newest).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.opencode.vocabulary import is_open_tool
from rules import AMBIGUOUS, Api, Runtime, UnexpectedShape

__all__ = [
    "InterruptedCall",
    "InterruptedTurn",
    "LastTurn",
    "last_turn",
    "message_after",
    "user_message_after",
]


@dataclass(frozen=True, slots=True)
class InterruptedCall:
    """A tool call the crash cut off: still open in the server's storage, or settled as interrupted."""

    call_id: str
    """The v1 part id, or the v2 call id."""
    tool: str
    input: dict[str, Any]
    still_open: bool
    """True while storage still shows it running (it must be settled before any resume)."""
    status: str | None = None
    """Its status as read (`pending`/`streaming`: cut while the model wrote its input; `error`)."""
    refused: str | None = None
    """The server's own word when it failed the call as ambiguous after a restart (2.x `serve
    --service`): it did not continue the turn, and neither does the proxy by itself."""


@dataclass(frozen=True, slots=True)
class InterruptedTurn:
    """The newest assistant message of a session, when a crash cut it off."""

    session_id: str
    api: Api
    message_id: str
    calls: tuple[InterruptedCall, ...]
    """Empty when the model was cut off while it wrote (no tool call yet)."""
    agent: str | None
    model: dict[str, str] | None
    """v1 `{"providerID", "modelID"}` of the assistant message (v2 keeps it on the session)."""
    prompted_by: str | None
    """The id of the user message this assistant message answers (the newest before it)."""


@dataclass(frozen=True, slots=True)
class LastTurn:
    """What the newest messages say: the interrupted turn, if any, and whether anything is newer."""

    turn: InterruptedTurn | None
    newer: str | None
    """The id of a message newer than the newest assistant message (a person wrote, or a resume
    was already sent), else None."""


def last_turn(
    view: Any, rules: Runtime[Any], session_id: str, *, seen: str | None = None, cut_off: str | None = None
) -> LastTurn:
    """The session's last turn as `view` (a parsed message list, read with `rules`) shows it.

    `seen` is the newest message the stream spoke of before the crash; `cut_off` names a message
    an earlier read already showed cut off: a write-back may since have closed it (v1 `db` and v2
    set `time.completed` on an unfinished message), and it stays cut off. A message newer than
    either was made since (a person's turn, another proxy's resume, even one already over): it
    is the `newer` one, and no turn of the crash is told.
    """
    messages = _messages(view, rules)
    ordered = sorted(
        (m for m in messages if isinstance(_id(m, rules), str)), key=lambda m: str(_id(m, rules))
    )
    known = cut_off or seen
    if known is not None and ordered and (newest_id := str(_id(ordered[-1], rules))) > known:
        return LastTurn(None, newest_id)
    assistants = [index for index, m in enumerate(ordered) if _role(m, rules) == "assistant"]
    if not assistants:
        return LastTurn(None, None)
    index = assistants[-1]
    newest = ordered[index]
    newer = str(_id(ordered[-1], rules)) if index < len(ordered) - 1 else None
    users = [m for m in ordered[:index] if _role(m, rules) == "user"]
    calls = tuple(call for item in _items(newest, rules) if (call := _interrupted(item, rules)) is not None)
    header = _header(newest, rules)
    unfinished = "completed" not in (header.get("time") or {}) or cut_off == _id(newest, rules)
    if not calls and not unfinished:
        return LastTurn(None, newer)
    turn = InterruptedTurn(
        session_id,
        rules.api,
        str(_id(newest, rules)),
        calls,
        _text(header.get("agent") or header.get("mode")),
        rules.chosen_model(header),
        str(_id(users[-1], rules)) if users else None,
    )
    return LastTurn(turn, newer)


def user_message_after(view: Any, rules: Runtime[Any], message_id: str) -> str | None:
    """The id of the newest user message newer than `message_id` in `view`, if there is one."""
    return message_after(view, rules, message_id, "user")


def message_after(view: Any, rules: Runtime[Any], message_id: str, role: str) -> str | None:
    """The id of the newest message of `role` ("user", "assistant") newer than `message_id`."""
    newer = [
        str(_id(m, rules))
        for m in _messages(view, rules)
        if _role(m, rules) == role and isinstance(_id(m, rules), str) and str(_id(m, rules)) > message_id
    ]
    return max(newer, default=None)


def _messages(view: Any, rules: Runtime[Any]) -> list[dict[str, Any]]:
    try:
        messages = rules.messages_of(view, single=False)
    except UnexpectedShape:
        return []
    return [m for m in messages if isinstance(m, dict)]


def _header(message: dict[str, Any], rules: Runtime[Any]) -> dict[str, Any]:
    header = rules.header(message)
    return header if isinstance(header, dict) else {}


def _id(message: dict[str, Any], rules: Runtime[Any]) -> Any:
    return _header(message, rules).get("id")


def _role(message: dict[str, Any], rules: Runtime[Any]) -> Any:
    return _header(message, rules).get(rules.role_key)


def _items(message: dict[str, Any], rules: Runtime[Any]) -> list[dict[str, Any]]:
    items = message.get(rules.item_key)
    return (
        [i for i in items if isinstance(i, dict) and i.get("type") == "tool"]
        if isinstance(items, list)
        else []
    )


def _interrupted(item: dict[str, Any], rules: Runtime[Any]) -> InterruptedCall | None:
    state = _dict(item.get("state"))
    if is_open_tool(item, rules.api):
        still_open = True
    elif state.get("status") == "error" and rules.settled_as_interrupted(state):
        still_open = False
    else:
        return None
    given = state.get("input")
    status = state.get("status")
    error = _dict(state.get("error")).get("message")
    return InterruptedCall(
        str(item.get("id")),
        str(item.get(rules.tool_key)),
        given if isinstance(given, dict) else {},
        still_open,
        status if isinstance(status, str) else None,
        error if isinstance(error, str) and error.startswith(AMBIGUOUS) else None,
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
