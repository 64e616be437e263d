"""What the resume tests read: a proxy's recent decisions, and the model's continuation requests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from proxy.demo.model import MockModel, Plan, RecordedRequest
from proxy.resume.text import resume_text

from .http_client import request as http_request
from .opencode_server import OpencodeServer, directory_header
from .polling import poll
from .proxy_process import ProxyProcess
from .test_sdk_streams import Subscription
from .tui import Terminal
from .turns import RUNTIMES, Observed, Turn, read_messages, start_turn, start_v1_turn, wait_tool_running

NAMED_CALL = "- bash: `echo hello && sleep 600`"
"""How the continuation names the mock's interrupted call."""
PARENT_PROMPT = "resume a task"
CHILD_PROMPT = "the child's work"
WRITING_TEXT = resume_text([], {})
"""The continuation of a turn cut off while the model wrote (no call to name)."""


def decisions(proxy_url: str) -> list[dict[str, Any]]:
    """`GET /_settle/resume`'s recent decisions (the proxy keeps serving while the server is down)."""
    reply = http_request("GET", f"{proxy_url}/_settle/resume", timeout=15)
    assert reply.status == 200, reply.body
    found: list[dict[str, Any]] = reply.json()["decisions"]
    return found


def decided(proxy_url: str, turn: Turn, count: int = 1) -> list[dict[str, Any]] | None:
    """The proxy's decisions about the turn's session once there are `count`, else None (keep waiting)."""
    mine = [d for d in decisions(proxy_url) if d["session"] == turn.session_id]
    return mine if len(mine) >= count else None


def final(proxy_url: str, turn: Turn) -> dict[str, Any] | None:
    """The proxy's last decision about the session once it is final (resumed, skipped, gave up)."""
    mine = decided(proxy_url, turn)
    if mine is None or mine[-1]["outcome"] == "not-started":
        return None
    return mine[-1]


def continuations(model: MockModel, turn: Turn, since: float) -> list[RecordedRequest]:
    """The model's requests for the turn's session since `since` that carry a resume's text."""
    return [
        r
        for r in model.requests()
        if r.at >= since
        and r.prompt == turn.prompt
        and "bash" in r.tools
        and r.latest_prompt is not None
        and "were interrupted" in r.latest_prompt
    ]


def requests_since(model: MockModel, turn: Turn, since: float) -> list[RecordedRequest]:
    return [r for r in model.requests() if r.at >= since and r.prompt == turn.prompt and "bash" in r.tools]


@contextmanager
def sdk_subscriptions(
    root: Path, streams: dict[str, tuple[str, str, str]]
) -> Iterator[dict[str, Subscription]]:
    """One official-SDK subscription per name, (base URL, stream kind, argument) as
    `sdk_subscriber.mjs` takes them; all killed however the block ends."""
    started: dict[str, Subscription] = {}
    try:
        for name, (base_url, kind, argument) in streams.items():
            started[name] = Subscription.start(name, root / f"sdk-{name}.jsonl", base_url, kind, argument)
        for subscription in started.values():
            poll(subscription.opened, what=f"{subscription.name} open", timeout=30)
        yield started
    finally:
        for subscription in started.values():
            subscription.process.kill()
            subscription.process.wait(timeout=10)


def after_reconnect(subscription: Subscription) -> list[Any]:
    """The events the SDK yielded after it first saw its stream fail (the crash)."""
    lines = subscription.lines()
    first_error = next(index for index, line in enumerate(lines) if "error" in line)
    return [line["event"] for line in lines[first_error + 1 :] if "event" in line]


def following(proxy: ProxyProcess) -> bool | None:
    health = http_request("GET", f"{proxy.url}/_settle/health", timeout=15).json()
    return True if health["liveness"]["source"] == "events" else None


def child_of(server: OpencodeServer, parent: Turn) -> str | None:
    """The child session the parent's `task` call started, once the call names it."""
    for message in read_messages(server.url, parent):
        for part in message["parts"]:
            child = (
                part.get("state", {}).get("metadata", {}).get("sessionId")
                if part.get("tool") == "task"
                else None
            )
            if isinstance(child, str):
                return child
    return None


def start_task(server: OpencodeServer, model: MockModel) -> tuple[Turn, Turn]:
    """A v1 turn whose `task` call runs a child session, whose own bash call then runs."""
    task = {"description": "child work", "prompt": CHILD_PROMPT, "subagent_type": "general"}
    model.plan(PARENT_PROMPT, Plan(tool="task", arguments=task))
    parent = start_v1_turn(server.url, server.project, PARENT_PROMPT)
    child_id = poll(partial(child_of, server, parent), what="the task's child session", timeout=60)
    child = Turn("v1", child_id, server.project, CHILD_PROMPT)
    wait_tool_running(server.url, child)
    return parent, child


def permission_asked(server: OpencodeServer, directory: Path) -> bool | None:
    reply = http_request("GET", f"{server.url}/permission", headers=directory_header(directory))
    return True if reply.status == 200 and reply.json() else None


def event_kind(event: Any) -> tuple[str, dict[str, Any]]:
    payload = event.get("payload", event)
    return str(payload.get("type")), payload.get("properties") or payload.get("data") or {}


def answer_started(server: OpencodeServer, turn: Turn) -> bool | None:
    """Whether the turn's assistant message exists and is not finished (the model is writing)."""
    for message in read_messages(server.url, turn):
        info = message["info"] if turn.runtime == "v1" else message
        if info.get("role", info.get("type")) == "assistant" and "completed" not in info["time"]:
            return True
    return None


def sent_for(model: MockModel, turn: Turn, since: float, text: str) -> list[RecordedRequest]:
    """The model's requests for the turn's session since `since` whose newest user text is `text`."""
    return [r for r in requests_since(model, turn, since) if r.latest_prompt == text]


def start_writing(server: OpencodeServer, model: MockModel) -> dict[str, Turn]:
    """A turn in each runtime whose model is still writing (no call yet); its resume is answered
    with text at once."""
    model.plan(WRITING_TEXT, Plan(tool="none"))
    turns: dict[str, Turn] = {}
    for runtime in RUNTIMES:
        model.plan(f"resume writing {runtime}", Plan(text_every=1.0))
        turns[runtime] = start_turn(runtime, server.url, server.project, f"resume writing {runtime}")
    for turn in turns.values():
        poll(partial(answer_started, server, turn), what="the model writing", timeout=60)
    return turns


@dataclass(frozen=True)
class Crash:
    """One SIGKILL mid-tool with proxies, a TUI and SDK clients watching (`test_resume.crash`)."""

    server: OpencodeServer
    proxies: dict[str, ProxyProcess]
    turns: dict[str, Observed]
    asking: Turn
    parent: Turn
    child: Turn
    tui: Terminal
    sdk: dict[str, Subscription]
    writing: dict[str, Turn]
    """Turns cut while the model wrote, by runtime."""
    crashed_at: float


def finals_of_the_pair(crash: Crash, turn: Turn, timeout: float) -> list[dict[str, Any]]:
    """The final decisions of the two alike proxies (`first`, `second`) on `turn`, once both decided."""
    return [
        poll(partial(final, crash.proxies[name].url, turn), what=f"{name}'s decision", timeout=timeout)
        for name in ("first", "second")
    ]


def v1_story(events: list[Any], observed: Observed) -> list[str]:
    """What an SDK client of `/global/event` saw of the observed v1 session after the crash: each
    status, `idle`, and the assistant messages newer than the interrupted one, `answering` until
    they are `answered`."""
    story = []
    for event in events:
        kind, properties = event_kind(event)
        info = properties.get("info") or {}
        if properties.get("sessionID", info.get("sessionID")) != observed.session_id:
            continue
        if kind == "session.status":
            story.append(properties["status"]["type"])
        elif kind == "session.idle":
            story.append("idle")
        elif (
            kind == "message.updated" and info.get("role") == "assistant" and info["id"] > observed.message_id
        ):
            story.append("answered" if "completed" in info["time"] else "answering")
    return story
