"""The write-back timeline: write-back makes the settlement durable in the real opencode 1.18.33,
and never touches a session that is running.

The package has its own server (its own data dir), so the offline `settle`, which settles the
whole database, sees only this package's sessions. Crash/restart cycles are slow, so the package
walks one timeline of phases, each a package-scoped fixture that acts on the server and records
what it saw; the tests only assert on those records and never act, so their order does not
matter and each can fail on its own:

1. `crashed`: stale turns of every group run a bash tool; SIGKILL; `opencode export` while down; start.
2. `written`: proxies with `--write-back api` and `--write-back db` fetch their groups' sessions
   while an `/event` subscriber listens; live turns are fetched through both; `late` sessions get a
   prompt between the two liveness readings; a v2 replay races a prompt (the API writer in
   process, against the real server).
3. `live_settle`: `settle` refuses while the server runs; `settle --upstream` settles only the
   inactive sessions while short turns make the server write its own parts; then a next prompt
   in the sessions it settled, without a restart.
4. `restarted`: SIGKILL and start again: still settled; v2 event replay; export; a next prompt
   (a short command) in each written session.
5. `offline`: new stale turns; SIGKILL; `settle` with the server stopped (exit 10, then 0);
   start; both runtimes' direct views, a proxy's view, the v2 event replay, export.

The fixtures live here, not in the test modules, so that the package's test modules share the
one timeline; each phase's work is in the module named for it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from proxy.demo.model import MockModel, Plan

from ..opencode_server import OpencodeServer, running_opencode
from .restarts import Crashed, Restarted, crash, restart
from .sessions import BUSY, LATE, NEXT_COMMAND, NEXT_PROMPT, SHORT_COMMAND, prompt_of
from .settles import LiveSettle, Offline, settle_live, settle_offline
from .writers import WrittenBack, write_back


@pytest.fixture(scope="package")
def server(mock_model: MockModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpencodeServer]:
    """The timeline's own server; stopped with all its tools at the end."""
    for key in LATE:
        mock_model.plan(prompt_of(key), Plan(each_prompt=True))
    mock_model.plan(NEXT_PROMPT, Plan(command=NEXT_COMMAND, each_prompt=True))
    for key in BUSY:
        mock_model.plan(prompt_of(key), Plan(command=SHORT_COMMAND))
    with running_opencode(tmp_path_factory.mktemp("write-back"), mock_model.base_url) as opencode:
        yield opencode


@pytest.fixture(scope="package")
def crashed(server: OpencodeServer) -> Crashed:
    return crash(server)


@pytest.fixture(scope="package")
def written(
    server: OpencodeServer, crashed: Crashed, tmp_path_factory: pytest.TempPathFactory
) -> WrittenBack:
    return write_back(server, crashed, tmp_path_factory.mktemp("write-back-proxies"))


@pytest.fixture(scope="package")
def live_settle(server: OpencodeServer, crashed: Crashed, written: WrittenBack) -> LiveSettle:
    return settle_live(server, crashed, written)


@pytest.fixture(scope="package")
def restarted(
    server: OpencodeServer, crashed: Crashed, written: WrittenBack, live_settle: LiveSettle
) -> Restarted:
    del written, live_settle  # only their order matters: phase 4 restarts what they wrote
    return restart(server, crashed)


@pytest.fixture(scope="package")
def offline(
    server: OpencodeServer, restarted: Restarted, tmp_path_factory: pytest.TempPathFactory
) -> Offline:
    del restarted  # only its order matters: phase 5 crashes the server again
    return settle_offline(server, tmp_path_factory.mktemp("plain-proxy"))
