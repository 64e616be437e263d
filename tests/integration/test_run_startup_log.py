"""`settle-proxy run` starts the server and follows its `/global/event` once it knows which server
it is: while the server is still starting, the log says once that it is not known yet (it cannot
be reached), and never that a stream was lost (before, it said "event stream /global/event lost:
Cannot connect" four times)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .http_client import get_json
from .mock_model import MockModel
from .opencode_server import running_opencode
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
    waited = [line for line in log if "is not known yet (it cannot be reached" in line]
    said = "\n".join(about_the_stream + waited)
    assert len(waited) == 1, said
    assert [line for line in about_the_stream if "lost" in line] == [], said
    assert any("following /global/event" in line for line in about_the_stream)
