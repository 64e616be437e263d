"""The official JS SDK as the client: its event subscriptions outlive a server crash through the proxy.

The SDK (`@opencode-ai/sdk` 1.19.3, `dist/*/gen/core/serverSentEvents.gen.js`) reconnects a
subscription only after an error: a stream that ends cleanly ends the subscription for good. So
the proxy must cut a client's stream when the server's was cut, or an SDK client open across a
crash stops there and never hears what the proxy settles afterwards.

Each subscription is a `node tests/integration/sdk_subscriber.mjs` process printing what the SDK
yields, once directly and once through the proxy, for `/global/event`, `/event` and
`/api/session/{id}/event`, across a SIGKILL of the server and a restart.

The SDK's default client (`createOpencodeClient({ baseUrl })`, no directory) subscribes to plain
`/event`, which follows the server's default instance: the directory the server runs in, here its
project. Through the proxy it must hear the settlement too, the settled part and the idle status.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.demo.model import MockModel

from .opencode_server import REPO_ROOT, OpencodeServer
from .polling import poll
from .turns import RUNTIMES, start_turn, wait_tool_running

pytestmark = pytest.mark.integration

SUBSCRIBER = Path(__file__).with_name("sdk_subscriber.mjs")
SDK = REPO_ROOT / "node_modules" / "@opencode-ai" / "sdk"
_OPEN_TIMEOUT_S = 30.0
_AFTER_CRASH_TIMEOUT_S = 90.0


@dataclass
class Subscription:
    """One SDK subscription running in node, and the lines it has printed so far."""

    name: str
    process: subprocess.Popen[bytes]
    output: Path

    @classmethod
    def start(cls, name: str, output: Path, base_url: str, kind: str, argument: str = "") -> Subscription:
        """`sdk_subscriber.mjs` subscribing to `kind` (with `argument`) at `base_url`, printing to `output`."""
        with output.open("wb") as sink:
            process = subprocess.Popen(
                ["node", str(SUBSCRIBER), base_url, kind, argument],
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        return cls(name, process, output)

    def lines(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self.output.read_bytes().splitlines() if line.strip()]

    def events(self) -> list[Any]:
        return [line["event"] for line in self.lines() if "event" in line]

    def opened(self) -> bool | None:
        return True if self.events() else None

    def reconnected(self) -> bool | None:
        """Whether events came after the SDK saw its stream fail (and so retried)."""
        lines = self.lines()
        errors = [index for index, line in enumerate(lines) if "error" in line]
        return True if errors and any("event" in line for line in lines[errors[0] + 1 :]) else None

    def heard(self, found: Callable[[list[Any]], bool]) -> bool | None:
        return True if found(self.events()) else None


@pytest.fixture
def subscribe(tmp_path: Path) -> Iterator[Any]:
    if shutil.which("node") is None or not SDK.exists():
        pytest.skip("node and `npm install` (for @opencode-ai/sdk) are needed")
    started: list[Subscription] = []

    def start(name: str, base_url: str, kind: str, argument: str = "") -> Subscription:
        started.append(
            subscription := Subscription.start(name, tmp_path / f"{name}.jsonl", base_url, kind, argument)
        )
        return subscription

    try:
        yield start
    finally:
        for subscription in started:
            subscription.process.kill()
            subscription.process.wait(timeout=10)


def _payload(event: Any) -> Any:
    """The plain event of a `/global/event` envelope, or the event itself."""
    return event.get("payload", event) if isinstance(event, dict) else event


def _v1_part_settled(part_id: str) -> Callable[[list[Any]], bool]:
    def found(events: list[Any]) -> bool:
        return any(
            _payload(e).get("type") == "message.part.updated"
            and _payload(e)["properties"]["part"]["id"] == part_id
            and _payload(e)["properties"]["part"]["state"]["status"] == "error"
            for e in events
        )

    return found


def _v1_session_idle(session_id: str) -> Callable[[list[Any]], bool]:
    def found(events: list[Any]) -> bool:
        return any(
            _payload(e).get("type") == "session.status"
            and _payload(e)["properties"].get("sessionID") == session_id
            and _payload(e)["properties"]["status"] == {"type": "idle"}
            for e in events
        )

    return found


def _v2_call_failed(call_id: str) -> Callable[[list[Any]], bool]:
    def found(events: list[Any]) -> bool:
        return any(
            e.get("type") == "session.next.tool.failed" and e["data"]["callID"] == call_id for e in events
        )

    return found


@pytest.mark.slow
def test_sdk_subscriptions_reconnect_after_a_crash_and_hear_the_settlement(
    mock_model: MockModel, opencode: OpencodeServer, proxy_url: str, subscribe: Any
) -> None:
    turns = {
        runtime: start_turn(runtime, opencode.url, opencode.project, f"sdk {runtime}") for runtime in RUNTIMES
    }
    running = {runtime: wait_tool_running(opencode.url, turn) for runtime, turn in turns.items()}
    streams = {
        "global": ("global", ""),
        "instance": ("instance", str(opencode.project)),
        "session": ("session", turns["v2"].session_id),
    }
    subscriptions = {
        (via, name): subscribe(f"{via}-{name}", base_url, kind, argument)
        for via, base_url in (("direct", opencode.url), ("proxy", proxy_url))
        for name, (kind, argument) in streams.items()
    }
    for subscription in subscriptions.values():
        poll(subscription.opened, what=f"{subscription.name} open", timeout=_OPEN_TIMEOUT_S)

    opencode.crash()
    opencode.restart()

    # Every subscription saw the stream fail and reconnected: events came after the error.
    for subscription in subscriptions.values():
        poll(
            subscription.reconnected,
            what=f"{subscription.name} reconnected after the crash",
            timeout=_AFTER_CRASH_TIMEOUT_S,
        )
    # Through the proxy, the reconnected subscriptions hear what the proxy settled.
    settled = {
        "global": _v1_part_settled(running["v1"].tool["id"]),
        "instance": _v1_part_settled(running["v1"].tool["id"]),
        "session": _v2_call_failed(running["v2"].tool["id"]),
    }
    for name, found in settled.items():
        subscription = subscriptions[("proxy", name)]
        poll(
            partial(subscription.heard, found),
            what=f"{subscription.name} told of the settlement",
            timeout=_AFTER_CRASH_TIMEOUT_S,
        )
    for subscription in subscriptions.values():
        assert not [line for line in subscription.lines() if "ended" in line], subscription.name


@pytest.mark.slow
def test_the_sdks_default_client_hears_the_settlement_through_the_proxy(
    mock_model: MockModel, opencode: OpencodeServer, proxy_url: str, subscribe: Any
) -> None:
    """Created without a directory, open across a SIGKILL: through the proxy it is told the part
    is settled and the session idle, as the server would have told it had it settled the part."""
    del mock_model
    turn = start_turn("v1", opencode.url, opencode.project, "sdk default client")
    running = wait_tool_running(opencode.url, turn)
    subscription = subscribe("proxy-default", proxy_url, "default")
    poll(subscription.opened, what="the default client open", timeout=_OPEN_TIMEOUT_S)

    opencode.crash()
    opencode.restart()

    poll(subscription.reconnected, what="the default client reconnected", timeout=_AFTER_CRASH_TIMEOUT_S)
    for what, found in (
        ("the settled part", _v1_part_settled(running.tool["id"])),
        ("the session idle", _v1_session_idle(turn.session_id)),
    ):
        poll(partial(subscription.heard, found), what=f"the default client told {what}", timeout=30.0)
    assert not [line for line in subscription.lines() if "ended" in line]
