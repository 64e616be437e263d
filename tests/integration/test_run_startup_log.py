"""`settle-proxy run` starts the server and follows its `/global/event` once it knows which server
it is: while the server is still starting, the log says nothing of it that is not so (before, it
said "event stream /global/event lost: Cannot connect" four times, later once that it "cannot be
reached" before it was even started); the server's own lines are prefixed with its program's
name (`opencode.exe`, as the binary the suite runs is called), and the proxy's line once it answers
names the address clients use."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.demo.model import MockModel

from .http_client import get_json
from .opencode_server import opencode_binary, running_opencode
from .polling import poll

pytestmark = pytest.mark.integration


def test_a_starting_server_is_waited_for_once_and_nothing_is_said_lost(
    mock_model: MockModel, tmp_path: Path
) -> None:
    with running_opencode(tmp_path, mock_model.base_url, supervised=()) as server:
        poll(
            lambda: get_json(f"{server.url}/_settle/health")["liveness"]["source"] == "events" or None,
            what="the proxy following the server's /global/event",
            timeout=60,
        )
        log = server.log_path.read_text(errors="replace").splitlines()
    about_the_stream = [line for line in log if "/global/event" in line]
    unreachable = [line for line in log if "cannot be reached" in line]
    said = "\n".join(about_the_stream + unreachable)
    assert unreachable == [], said  # nothing said of a server being started that does not answer yet
    assert [line for line in about_the_stream if "lost" in line] == [], said
    assert any("following /global/event" in line for line in about_the_stream)
    own = [line for line in log if "listening on http://127.0.0.1:" in line]
    assert own, "\n".join(log)
    assert all(line.startswith(f"{opencode_binary().name}| ") for line in own), own
    assert any(f"clients use {server.url})" in line for line in log if "server answering, pid" in line)
