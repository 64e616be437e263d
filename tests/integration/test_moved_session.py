"""A v1 session moved to another worktree of its project is asked about where it runs now.

opencode 1.18.33 can move a session (`POST /experimental/control-plane/move-session`, 204, to
a worktree of the same git project; the TUI's `/move`). Its turns then run, and report busy,
only in the new directory's instance. A proxy that has to ask on every fetch (here: the server
has a password and the proxy has none, so `/global/event` is refused it) once remembered the
old directory; it must not take the old instance's "idle" for the session's. A race moves a
session before each of its turns while clients fetch it through such a proxy and through one
that follows the event stream.

The module's server is its own (a git project with a worktree, and a password).
"""

from __future__ import annotations

import functools
import itertools
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy.demo.model import MockModel, Plan

from .http_client import get_json, request, with_credentials
from .opencode_server import OpencodeServer, directory_header, opencode_binary
from .proxy_process import ProxyProcess, wait_all_decided
from .races import Race, Urls, fetcher
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
        # No fetch was settled (the header says so, checked above), and a proxy schedules a
        # write-back only with a settled view (this one, without the server's password, follows no
        # stream): nothing is pending, so what is stored now is what stays.
        assert status_of(read_messages(base, moved), part_id) == "running"
        assert busy_in(base, first.session_id, moving.worktree)
        assert "wrote back" not in proxy.log()
    finally:
        proxy.stop()
        for session_id in sessions:
            request("POST", f"{base}/session/{session_id}/abort", headers=directory_header(moving.worktree))


MOVING_RACE_S = 25.0
MOVING_COMMANDS = ("echo hi", "echo hi && sleep 0.5")
MOVING_FETCHERS = 2


def _moving_lane(race: Race, base: str, mock_model: MockModel, moving: Moving) -> None:
    """One v1 session, moved to the other directory before each of its turns."""
    directories = (moving.project, moving.worktree)
    turn: Turn | None = None
    try:
        for number in itertools.count():
            if race.stop.is_set():
                return
            prompt = f"moving race #{number}"
            mock_model.plan(prompt, Plan(command=MOVING_COMMANDS[number % 2], each_prompt=True))
            directory = directories[number % 2]
            if turn is None:
                turn = start_v1_turn(base, directory, prompt)
            else:
                move(base, turn.session_id, directory)
                turn = Turn("v1", turn.session_id, directory, prompt)
                send_prompt(base, turn, prompt)
            with race.lock:
                race.current["moving"] = turn
                race.turns.append(turn)
            statuses = [
                p["state"]["status"]
                for m in wait_turn_done(base, turn)
                for p in m["parts"]
                if p["type"] == "tool"
            ]
            if set(statuses) != {"completed"}:
                race.failed(race.errors, f"turn {prompt} left tool statuses {statuses}")
                return
            race.count("moves" if number else "turns")
    except Exception as error:
        race.failed(race.errors, f"moving lane: {type(error).__name__}: {error}")


def test_a_session_that_keeps_moving_is_never_shown_settled(
    moving: Moving, mock_model: MockModel, tmp_path: Path
) -> None:
    """Turns run back to back in one v1 session that moves between the project and its worktree
    before each turn, while clients fetch it through a proxy that asks on every fetch (and writes
    back) and through one that follows the event stream: no false settle, no write."""
    base = moving.server.url
    asking = ProxyProcess(
        moving.server.origin, tmp_path / "asking.log", ("--write-back", "api", "--grace", str(GRACE_S))
    )
    following = ProxyProcess(
        moving.server.origin, tmp_path / "following.log", environment={"OPENCODE_SERVER_PASSWORD": PASSWORD}
    )
    race = Race()
    try:
        asking.start()
        following.start()
        urls = [
            Urls(base, with_credentials(proxy.url, "opencode", PASSWORD)) for proxy in (asking, following)
        ]
        lane = functools.partial(_moving_lane, race, base, mock_model, moving)
        fetchers = [functools.partial(fetcher, race, url) for url in urls for _ in range(MOVING_FETCHERS)]
        all_stopped = race.run([lane, *fetchers], MOVING_RACE_S)
        # `asking` writes back only what a fetch showed settled (none may be: `false_settles`);
        # `following` also confirms from its stream: wait until it has decided all it will.
        wait_all_decided(urls[1].proxy, within=GRACE_S + 10)
        logs = asking.log() + following.log()
    finally:
        asking.stop()
        following.stop()
    print(f"\nmoving race: {dict(race.counts)}")
    assert all_stopped, "a lane or fetcher did not stop"
    assert race.errors == [], race.errors[:5]
    assert race.false_settles == [], race.false_settles[:5]
    assert race.counts["moves"] > 0
    assert race.counts["proxy fetches showing a live tool"] > 0, "no fetch caught a tool running"
    assert "wrote back" not in logs
