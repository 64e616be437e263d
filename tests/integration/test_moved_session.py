"""A v1 session moved to another worktree of its project is asked about where it runs now.

opencode 1.18.33 can move a session (`POST /experimental/control-plane/move-session`, 204, to
a worktree of the same git project; the TUI's `/move`). Its turns then run, and report busy,
only in the new directory's instance. A proxy that has to ask on every fetch (here: the server
has a password and the proxy has none, so `/global/event` is refused it) once remembered the
old directory; it must not take the old instance's "idle" for the session's.

The module's server is its own (a git project with a worktree, and a password).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .http_client import get_json, request, with_credentials
from .mock_model import MockModel, Plan
from .opencode_server import OpencodeServer, directory_header, opencode_binary
from .proxy_process import ProxyProcess
from .turns import (
    Turn,
    find_running_tool,
    read_messages,
    send_prompt,
    start_v1_turn,
    wait_tool_running,
    wait_turn_done,
)

pytestmark = pytest.mark.integration

PASSWORD = "moving"
GRACE_S = 0.5
SETTLED_HEADER = "x-settle-settled"
FETCHES = 10
MOVE_PATH = "/experimental/control-plane/move-session"


@dataclass(frozen=True)
class Moving:
    server: OpencodeServer
    project: Path
    worktree: Path


def _git(directory: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=directory,
        check=True,
        capture_output=True,
        timeout=30,
    )


@pytest.fixture(scope="module")
def moving(mock_model: MockModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Moving]:
    server = OpencodeServer(
        opencode_binary(), tmp_path_factory.mktemp("moving"), mock_model.base_url, password=PASSWORD
    )
    project = server.project
    worktree = project.parent / "main-feature"
    _git(project, "init", "-q")
    _git(project, "add", "opencode.json")
    _git(project, "commit", "-q", "-m", "init")
    _git(project, "worktree", "add", "-q", str(worktree))
    try:
        server.start()
        server._warm_project(worktree)
        yield Moving(server, project, worktree)
    finally:
        server.stop()


def move(base: str, session_id: str, directory: Path) -> None:
    reply = request(
        "POST", base + MOVE_PATH, json={"sessionID": session_id, "destination": {"directory": str(directory)}}
    )
    assert reply.status == 204, f"move-session -> {reply.status}: {reply.body[:300]!r}"


def busy_in(base: str, session_id: str, directory: Path | None) -> bool:
    headers = directory_header(directory) if directory is not None else {}
    status = request("GET", f"{base}/session/status", headers=headers).json().get(session_id)
    return status is not None and status.get("type") != "idle"


def status_of(messages: list[dict[str, Any]], part_id: str) -> str:
    (found,) = [part for message in messages for part in message["parts"] if part["id"] == part_id]
    return str(found["state"]["status"])


def test_a_moved_session_is_asked_in_its_new_directory(
    moving: Moving, mock_model: MockModel, tmp_path: Path
) -> None:
    base = moving.server.url
    proxy = ProxyProcess(
        moving.server.origin, tmp_path / "proxy.log", args=("--write-back", "api", "--grace", str(GRACE_S))
    )
    proxy.start()
    sessions: list[str] = []
    try:
        through = with_credentials(proxy.url, "opencode", PASSWORD)
        mock_model.plan("before the move", Plan(command="echo hi && sleep 2"))
        first = start_v1_turn(base, moving.project, "before the move")
        sessions.append(first.session_id)
        wait_tool_running(base, first)
        # The proxy asks about the session while it runs in the project, and learns that directory.
        shown = request("GET", through + first.messages_path)
        assert SETTLED_HEADER not in shown.headers
        assert find_running_tool(shown.json(), "v1") is not None
        wait_turn_done(base, first)

        move(base, first.session_id, moving.worktree)
        assert get_json(f"{base}/session/{first.session_id}")["directory"] == str(moving.worktree)
        moved = Turn("v1", first.session_id, moving.worktree, "after the move")
        mock_model.plan("after the move", Plan(command="echo hello && sleep 600", each_prompt=True))
        send_prompt(base, moved, "after the move")
        running = wait_tool_running(base, moved)
        part_id = str(running.tool["id"])

        # The measured premise: only the new directory's instance knows the session is busy.
        premise = {
            "old directory": busy_in(base, first.session_id, moving.project),
            "no directory": busy_in(base, first.session_id, None),
            "new directory": busy_in(base, first.session_id, moving.worktree),
        }
        print(f"\nmoved session busy per instance: {premise}")
        assert premise == {"old directory": False, "no directory": False, "new directory": True}

        for number in range(FETCHES):
            path = first.messages_path if number % 2 == 0 else first.message_path(running.message_id)
            reply = request("GET", through + path)
            assert reply.status == 200
            assert SETTLED_HEADER not in reply.headers, f"{path}: the live tool was shown settled"
            body = reply.json()
            messages = body if isinstance(body, list) else [body]
            assert status_of(messages, part_id) == "running"
        time.sleep(GRACE_S + 2.0)
        assert status_of(read_messages(base, moved), part_id) == "running"
        assert busy_in(base, first.session_id, moving.worktree)
        assert "wrote back" not in proxy.log()
    finally:
        proxy.stop()
        for session_id in sessions:
            request("POST", f"{base}/session/{session_id}/abort", headers=directory_header(moving.worktree))
