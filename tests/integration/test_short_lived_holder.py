"""A short-lived holder of the database held a confirmation back; once it exits, clients are told
(real opencode 1.18.33, the proxy standalone in front of it).

A process that opened `opencode.db` before the calls (here a Python one holding it as a sqlite3
shell or `opencode export` would) still runs when the server is SIGKILLed mid-tool and restarted:
a tool alive after its start may run in it, so the proxy leaves the calls open and says why. It
exits a few seconds after the restart: the proxy must then confirm again, and a client of
`/global/event` (v1) and of the v2 session's stream connected meanwhile must be told the calls
settled and the v1 session idle.

The crash comes once a client of the proxy's `/global/event` was shown the v1 part running: the
proxy owes a stream only what one was shown open, and a poll of the server can see the part
running before the proxy's own reading of the stream has.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from proxy.demo.model import MockModel

from .event_tap import EventTap, part_status, session_status
from .opencode_server import running_opencode
from .polling import poll
from .proxy_process import ProxyProcess, running
from .resumes import following
from .turns import Observed, start_turn, wait_tool_running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HELD_BACK = "{what} left open, another process on the server's database"
HOLD = "import sys; held = open(sys.argv[1], 'rb'); sys.stdin.read()"
"""Holds the file open until its standard input closes."""


@contextmanager
def holding(database: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process holding `database` open until its stdin is closed (ended however the block ends)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(database)], stdin=subprocess.PIPE)
    try:
        yield holder
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(timeout=10)


def held_back(proxy: ProxyProcess, v1: Observed, v2: Observed) -> bool | None:
    """Both sessions' confirmations held back, each said in its own line."""
    log = proxy.log()
    lines = [
        f"live settle of {v1.turn.session_id}: {HELD_BACK.format(what='open parts')}",
        f"live settle of {v2.turn.session_id}: {HELD_BACK.format(what='open calls')}",
    ]
    return True if all(line in log for line in lines) else None


def part_running(payload: Any, part_id: str) -> bool:
    return part_status(payload, part_id) == "running"


def part_settled(payload: Any, part_id: str) -> bool:
    return part_status(payload, part_id) == "error"


def idle(payload: Any, session_id: str) -> bool:
    return session_status(payload, session_id) == "idle"


def call_failed(payload: Any, call_id: str) -> bool:
    return bool(
        payload.get("type") == "session.next.tool.failed" and payload["data"].get("callID") == call_id
    )


def test_clients_are_told_once_a_short_lived_holder_of_the_database_exits(
    mock_model: MockModel, tmp_path: Path
) -> None:
    with running_opencode(tmp_path / "server", mock_model.base_url) as server:
        proxy = ProxyProcess(server.url, tmp_path / "proxy.log", ("--grace", "0.5"))
        with holding(server.database) as holder, running([proxy]):
            poll(partial(following, proxy), what="the proxy following the server", timeout=60)
            with EventTap(f"{proxy.url}/global/event") as before:
                turns = [
                    start_turn(runtime, server.url, server.project, "run the demo")
                    for runtime in ("v1", "v2")
                ]
                v1, v2 = (Observed(turn, wait_tool_running(server.url, turn)) for turn in turns)
                before.wait_for(
                    partial(part_running, part_id=v1.running.tool["id"]),
                    what="a client of the proxy shown the v1 part running",
                    timeout=30,
                )
                server.crash()
            server.restart()
            poll(partial(following, proxy), what="the proxy following the restarted server", timeout=60)
            global_stream = EventTap(f"{proxy.url}/global/event")
            session_stream = EventTap(f"{proxy.url}/api/session/{v2.turn.session_id}/event")
            with global_stream, session_stream:
                poll(partial(held_back, proxy, v1, v2), what="both confirmations held back", timeout=60)
                assert not any(part_settled(p, v1.running.tool["id"]) for p in global_stream.payloads())
                assert holder.stdin is not None
                holder.stdin.close()  # the holder exits, 3 s or so after the restart
                holder.wait(timeout=10)
                global_stream.wait_for(
                    partial(part_settled, part_id=v1.running.tool["id"]), what="the v1 part told", timeout=60
                )
                global_stream.wait_for(
                    partial(idle, session_id=v1.turn.session_id), what="the v1 session told idle", timeout=30
                )
                session_stream.wait_for(
                    partial(call_failed, call_id=v2.running.tool["id"]), what="the v2 call told", timeout=60
                )
    assert "the process that held it back is gone; confirming again" in proxy.log()
