"""`settle-proxy run --write-back api -- opencode serve` with the real opencode 1.18.33, the
supervising proxy itself SIGKILLed mid-tool (its server and the tool die with it) and a new one
started on the same data: a follower of `/global/event` that reconnects to the new proxy kept its
state from before (the session busy). The new proxy never saw the call, but reads what the one
before kept in the state database of what its stream showed open; with no client fetching
anything, the follower must end with the part settled, the message closed and the session idle,
as after a server crash, the view settled and written back, and a real TUI open across the
proxy's crash loses its busy bar (a view settled for a client of a proxy that kept nothing, and
the write-back's own announcement, which would tell it as well, are covered in-process:
`tests/proxy/addons/test_live_unseen.py`)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest

from proxy.demo.model import MockModel

from .event_tap import EventTap, part_status, session_status
from .opencode_server import opencode_binary, running_opencode
from .polling import poll
from .test_run_supervised import following, health, written
from .test_tui import assert_settled, shows_running, shows_settled, watch
from .tui import Terminals
from .turns import fetch_settled, start_v1_turn, wait_tool_running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OPTIONS = ("--write-back", "api", "--grace", "0.5")


def closed(payload: Any, message_id: str) -> bool:
    event = payload.get("payload") or {}
    info = (event.get("properties") or {}).get("info") or {}
    return (
        event.get("type") == "message.updated"
        and info.get("id") == message_id
        and "completed" in info["time"]
    )


def test_a_follower_of_the_new_proxy_ends_with_the_message_closed_and_the_session_idle(
    mock_model: MockModel, tmp_path: Path
) -> None:
    with (
        running_opencode(tmp_path, mock_model.base_url, supervised=OPTIONS) as server,
        Terminals(tmp_path, opencode_binary()) as terminals,
    ):
        poll(partial(following, server), what="the proxy following the server's events", timeout=60)
        with EventTap(f"{server.origin}/global/event") as before:
            turn = start_v1_turn(server.url, server.project, "run the demo")
            tui = terminals.attach("across_proxy_crash", server.url, turn.session_id, turn.directory)
            running = wait_tool_running(server.url, turn)
            before.wait_for(lambda p: session_status(p, turn.session_id) == "busy", what="busy", timeout=30)
            tui.wait_screen(shows_running, what="the TUI to show the live tool running", timeout=60)
        server.crash()  # the supervising proxy SIGKILLed: its server and the tool die with it
        server.restart()  # a new proxy on the same data
        poll(partial(following, server), what="the new proxy following the server's events", timeout=60)
        with EventTap(f"{server.origin}/global/event") as after:  # the follower reconnects
            after.wait_for(
                lambda p: session_status(p, turn.session_id) == "idle",
                what="the session told idle",
                timeout=60,
            )
            statuses = [s for p in after.payloads() if (s := session_status(p, turn.session_id)) is not None]
            told = after.payloads()
        fetch_settled(f"{server.url}{turn.messages_path}", timeout=30)
        direct = health(server)["upstream"]["url"]
        poll(partial(written, direct, turn), what="the call written back", timeout=30)
        seen = watch({tui: shows_settled})["across_proxy_crash"]
    assert statuses[-1] == "idle"
    assert any(closed(payload, running.message_id) for payload in told)
    assert any(part_status(payload, running.tool["id"]) == "error" for payload in told)
    assert "kept by the proxy that ran before: 1 open parts" in server.log_path.read_text(errors="replace")
    assert_settled(seen, "open through settle-proxy run across the proxy's own crash")
