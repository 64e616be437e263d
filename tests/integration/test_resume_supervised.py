"""`settle-proxy run --resume` with the real opencode 1.18.33: the server's own pid SIGKILLed
mid-tool (as the OOM killer does), restarted by the proxy, and each interrupted turn resumed with
a prompt that names the call and says its process was ended; a resumed turn interrupted again is
resumed again, until `--resume-attempts` is spent, and then left settled.

The model asks for the long tool once per prompt, so every resumed turn runs one again and the
test can crash it there. Each step waits on a positive signal: the tools tied to their calls,
the server restarted, the proxy's decision in `/_settle/resume`.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from functools import partial

import pytest

from proxy.demo.model import MockModel, Plan

from .opencode_server import OpencodeServer, running_opencode
from .polling import poll
from .resumes import NAMED_CALL, continuations, decided
from .test_run_supervised import following, health, tied
from .turns import RUNTIMES, Turn, find_running_tool, is_active, read_messages, start_turn, wait_tool_running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = "resume under run"
ATTEMPTS = 2
TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def supervised(mock_model: MockModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpencodeServer]:
    options = (
        *("--resume", "--write-back", "api", "--orphans", "terminate"),
        *("--resume-attempts", str(ATTEMPTS), "--grace", "0.5", "--log-format", "json"),
    )
    with running_opencode(
        tmp_path_factory.mktemp("resume-run"), mock_model.base_url, supervised=options
    ) as server:
        yield server


def crash_once_tied(server: OpencodeServer, tools: int, restarts: int) -> None:
    """SIGKILL the server's own pid once `tools` tool processes are tied to their calls, and wait
    until the proxy has started it again."""
    records = server.state_home / "settle-proxy" / "processes.db"
    poll(partial(tied, records, tools), what=f"{tools} tool processes tied to their calls", timeout=30)
    os.kill(health(server)["server"]["pid"], signal.SIGKILL)

    def restarted() -> bool | None:
        try:
            found = health(server)
        except TimeoutError:
            return None
        return True if found["server"]["restarts"] == restarts and found["upstream"]["reachable"] else None

    poll(restarted, what=f"restart {restarts}", timeout=TIMEOUT_S)


def running_again(server: OpencodeServer, turn: Turn, calls: int) -> bool | None:
    """Whether the session holds `calls` bash calls and one of them runs (a resumed turn's own)."""
    messages = read_messages(server.url, turn)
    found = sum(
        1
        for m in messages
        for item in (m["parts"] if turn.runtime == "v1" else m.get("content", []))
        if item.get("type") == "tool"
    )
    return True if found == calls and find_running_tool(messages, turn.runtime) is not None else None


def test_resumed_after_each_crash_until_the_budget_is_spent(
    supervised: OpencodeServer, mock_model: MockModel
) -> None:
    poll(partial(following, supervised), what="the proxy following the server", timeout=60)
    for runtime in RUNTIMES:
        mock_model.plan(f"{PROMPT} {runtime}", Plan(each_prompt=True))
    turns = [
        start_turn(runtime, supervised.url, supervised.project, f"{PROMPT} {runtime}") for runtime in RUNTIMES
    ]
    for turn in turns:
        wait_tool_running(supervised.url, turn)
    started = time.time()
    for crash in range(1, ATTEMPTS + 2):
        crash_once_tied(supervised, tools=len(turns) * crash, restarts=crash)
        for turn in turns:
            made = poll(
                partial(decided, supervised.url, turn, crash), what=f"decision {crash}", timeout=TIMEOUT_S
            )
            last = made[-1]
            if crash <= ATTEMPTS:
                assert (last["outcome"], last["attempt"]) == ("resumed", crash), last
                poll(
                    partial(running_again, supervised, turn, crash + 1),
                    what="the resumed turn",
                    timeout=TIMEOUT_S,
                )
            else:
                assert last["outcome"] == "skipped"
                assert (
                    last["why"]
                    == f"{ATTEMPTS} prompt(s) sent for this turn already (--resume-attempts {ATTEMPTS})"
                )
    for turn in turns:
        continued = continuations(mock_model, turn, started)
        assert len(continued) == ATTEMPTS
        for request in continued:
            assert request.latest_prompt is not None
            assert f"{NAMED_CALL} (its process was ended after the server stopped)" in request.latest_prompt
        assert not is_active(supervised.url, turn)
        assert find_running_tool(read_messages(supervised.url, turn), turn.runtime) is None
