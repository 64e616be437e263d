"""What the resume tests read: a proxy's recent decisions, and the model's continuation requests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .http_client import request
from .mock_model import MockModel, RecordedRequest
from .opencode_server import REPO_ROOT
from .polling import poll
from .test_sdk_streams import SUBSCRIBER, Subscription
from .turns import Turn

NAMED_CALL = "- bash: `echo hello && sleep 600`"
"""How the continuation names the mock's interrupted call."""


def decisions(proxy_url: str) -> list[dict[str, Any]]:
    """`GET /_settle/resume`'s recent decisions (the proxy keeps serving while the server is down)."""
    reply = request("GET", f"{proxy_url}/_settle/resume", timeout=15)
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
            output = root / f"sdk-{name}.jsonl"
            with output.open("wb") as sink:
                process = subprocess.Popen(
                    ["node", str(SUBSCRIBER), base_url, kind, argument],
                    cwd=REPO_ROOT,
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                )
            started[name] = Subscription(name, process, output)
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
