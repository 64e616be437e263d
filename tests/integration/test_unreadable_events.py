"""The real server's own stream carries events the proxy cannot read, and liveness goes on.

A client (a plugin, the SDK) can PATCH any part, and opencode publishes the whole part on
`/global/event`, twice (plain and in its sync form): here one whose metadata is nested 3,000
levels deep (the decoder's `RecursionError`) and one with a 5 MiB text (past aiohttp's 512 KiB
line and the proxy's own 4 MiB limit). Before, either one ended the proxy's tracker silently
while health still said `following`, so after the next crash the `busy` it had kept was
believed for ever: the orphan was never settled, in views or by live settle.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from proxy.opencode.ids import ascending_id

from .event_tap import EventTap
from .http_client import get_json, request
from .opencode_server import OpencodeServer
from .polling import poll
from .proxy_process import ProxyProcess
from .turns import Turn, read_messages, start_v1_turn, wait_tool_running

pytestmark = pytest.mark.integration

DEPTH = 3000


def _patch_raw(base_url: str, turn: Turn, message_id: str, part: bytes) -> None:
    """PATCH a part written by hand: no encoder here writes 3,000 levels (orjson stops at 255)."""
    part_id = re.search(rb'"id":"(prt_[^"]+)"', part)
    assert part_id is not None
    url = f"{base_url}/session/{turn.session_id}/message/{message_id}/part/{part_id[1].decode()}"
    sent = urllib.request.Request(
        url, data=part, method="PATCH", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(sent, timeout=60) as answer:
        assert answer.status == 200


def _text_part(turn: Turn, message_id: str, *, text: bytes = b"x", metadata: bytes = b"{}") -> bytes:
    head = f'{{"id":"{ascending_id("prt")}","sessionID":"{turn.session_id}","messageID":"{message_id}",'
    return head.encode() + b'"type":"text","text":"' + text + b'","metadata":' + metadata + b"}"


def _unreadable(proxy: ProxyProcess) -> dict[str, float]:
    text = request("GET", f"{proxy.url}/_settle/metrics").body.decode()
    found = re.findall(r'settle_proxy_unreadable_events_total\{reason="([^"]+)"\} (\S+)', text)
    return {reason: float(count) for reason, count in found}


def _settles(event: Any, part_id: str) -> bool:
    payload = event.get("payload") if isinstance(event, dict) else None
    if not isinstance(payload, dict) or payload.get("type") != "message.part.updated":
        return False
    part = payload["properties"]["part"]
    return bool(part["id"] == part_id and part["state"]["status"] == "error")


def _settled(proxy: ProxyProcess, turn: Turn) -> Any:
    reply = request("GET", f"{proxy.url}{turn.messages_path}")
    return reply if int(reply.headers.get("x-settle-settled", "0")) >= 1 else None


def test_unreadable_events_on_the_real_stream_leave_the_orphan_settled_after_a_crash(
    opencode: OpencodeServer, tmp_path: Path
) -> None:
    proxy = ProxyProcess(opencode.url, tmp_path / "proxy.log")
    proxy.start()
    try:
        poll(
            lambda: (
                get_json(f"{proxy.url}/_settle/health")["liveness"]["event_stream"] == "following" or None
            ),
            what="the proxy following /global/event",
            timeout=30,
        )
        orphan = start_v1_turn(opencode.url, opencode.project, "the orphan to settle")
        orphan_part = wait_tool_running(opencode.url, orphan).tool["id"]
        other = start_v1_turn(opencode.url, opencode.project, "the session the odd parts go to")
        wait_tool_running(opencode.url, other)
        user_message = read_messages(opencode.url, other)[0]["info"]["id"]
        deep = b'{"deep":' + b"[" * DEPTH + b"]" * DEPTH + b"}"
        _patch_raw(opencode.url, other, user_message, _text_part(other, user_message, metadata=deep))
        _patch_raw(opencode.url, other, user_message, _text_part(other, user_message, text=b"y" * 5 * 2**20))
        both = {"RecursionError": 2.0, "too long": 2.0}  # each event comes plain and in its sync form
        poll(
            lambda: _unreadable(proxy) == both or None, what="both events skipped by the tracker", timeout=30
        )
        health = get_json(f"{proxy.url}/_settle/health")
        assert health["liveness"]["event_stream"] == "following"
        assert "restarts" not in health["liveness"], "skipped, not a failure of following"
        said = proxy.log()
        assert said.count("was skipped (RecursionError)") == 1
        assert said.count("was skipped (too long)") == 1

        opencode.crash()
        opencode.restart()
        reply = poll(lambda: _settled(proxy, orphan), what="the orphan settled through the proxy", timeout=60)
        part = next(p for m in reply.json() for p in m["parts"] if p.get("type") == "tool")
        assert part["state"]["status"] == "error"
        assert part["state"]["metadata"]["interrupted"] is True
        with EventTap(f"{proxy.url}/global/event") as client:  # live settle tells clients, too
            told = client.wait_for(
                lambda event: _settles(event, orphan_part), what="live settle telling a client", timeout=30
            )
        assert told["payload"]["properties"]["part"]["state"]["metadata"]["interrupted"] is True
    finally:
        proxy.stop()
