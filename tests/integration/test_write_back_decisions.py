"""Against the real opencode 1.18.33: with `--log-format json`, each write-back decision is a JSON
line carrying `session`, `message`, `part`, `mode`, `api`, `rule`, `outcome` and `why`, so that a
part can be followed from the view that settled it to the write that made it durable.

One crash/restart cycle: a stale v1 and v2 turn, fetched once through `--write-back api`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.demo.model import MockModel

from .opencode_server import running_opencode
from .polling import poll
from .proxy_process import ProxyProcess
from .turns import RUNTIMES, observe_running, read_messages

pytestmark = pytest.mark.integration

FIELDS = {"session", "message", "part", "mode", "api", "rule", "outcome", "why"}
_WRITE_TIMEOUT_S = 30.0


def _json_lines(log: str) -> list[dict[str, Any]]:
    lines = []
    for line in log.splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def test_every_write_back_decision_is_a_structured_line(mock_model: MockModel, tmp_path: Path) -> None:
    with running_opencode(tmp_path / "server", mock_model.base_url) as server:
        stale = observe_running(server.url, server.project, {rt: (rt, f"decisions {rt}") for rt in RUNTIMES})
        server.crash()
        server.restart()
        proxy = ProxyProcess(
            server.origin,
            tmp_path / "proxy.log",
            args=("--write-back", "api", "--grace", "0.5", "--log-format", "json"),
        )
        try:
            proxy.start()

            def decided() -> list[dict[str, Any]] | None:
                """Read each view not written back yet, as a client polls it (one read within the
                freshness margin of the crash is left open, and decided afresh on the next)."""
                lines = [e for e in _json_lines(proxy.log()) if e["logger"].startswith("proxy.writeback")]
                written = {e.get("part") for e in lines if e.get("outcome") == "written"}
                for observed in stale.values():
                    if observed.tool_id not in written:
                        read_messages(proxy.url, observed.turn)
                return lines if {o.tool_id for o in stale.values()} <= written else None

            lines = poll(decided, what="both stale tools written back", timeout=_WRITE_TIMEOUT_S)
        finally:
            proxy.stop()
    for line in lines:
        assert line.keys() >= FIELDS, line
    for runtime, observed in stale.items():
        (write,) = [e for e in lines if e["outcome"] == "written" and e["part"] == observed.tool_id]
        assert {key: write[key] for key in ("session", "message", "mode", "api", "rule")} == {
            "session": observed.session_id,
            "message": observed.message_id,
            "mode": "api",
            "api": runtime,
            "rule": "orphaned-tool",
        }
        # The API cannot close the message itself: that is a skip, said with its id.
        skips = [e for e in lines if e["outcome"] == "skipped" and e["session"] == observed.session_id]
        assert [(e["message"], e["part"]) for e in skips] == [(observed.message_id, None)], skips
