"""The soak: `settle-proxy run --resume --write-back api -- opencode serve` (the real 1.18.33, the
mock model) SIGKILLed at seeded random moments, round after round (`soak.py` says how), with
clients attached: an official-SDK follower on `/global/event` throughout, one on each v2 session's
own stream, and in the first and the last round the real TUI and a web UI page (attached to every
round they would double its time). After each round, `soak_checks.py`.

`SETTLE_SOAK_ROUNDS` (default 3, one of each kind) sets how many rounds; a failing round prints
its seed: `SETTLE_SOAK_SEED=<seed> SETTLE_SOAK_ROUNDS=1 scripts/test tests/integration/test_soak.py`
plays it first. The long soak: `SETTLE_SOAK_ROUNDS=50 scripts/test tests/integration/test_soak.py`.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from proxy.demo.model import MockModel

from .opencode_server import OpencodeServer, opencode_binary, running_opencode
from .polling import poll
from .resumes import sdk_subscriptions
from .soak import OPTIONS, Killer, RoundPlan, play, soak_plans, start_turns
from .soak_checks import Lifetimes, continuation_problems, state_problems, told_problems, wait_round_over
from .soak_clients import Clients, WebPages, watched_problems
from .test_run_supervised import following
from .tui import Terminals

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def clients(tmp_path: Path) -> Iterator[tuple[Path, Terminals, WebPages]]:
    with Terminals(tmp_path, opencode_binary()) as terminals, WebPages(tmp_path / "chromium") as pages:
        yield tmp_path, terminals, pages


def soak_round(
    server: OpencodeServer,
    model: MockModel,
    clients: Clients,
    killer: Killer,
    *,
    plan: RoundPlan,
    usage: Lifetimes,
) -> list[str]:
    """One round: its turns and clients, its kills, then every check; the problems found."""
    print(plan.describe(), flush=True)
    since = time.time()
    turns = start_turns(server, model, plan)
    clients.follow_sessions(server.url, [turns.tools["v2"], turns.writing["v2"]], plan.number)
    watchers = clients.attach(server.url, turns.observed["v1"], plan.number) if plan.watched else None
    told_since = len(clients.follower.lines())
    try:
        play(server, model, killer, plan, turns)
        problems = wait_round_over(server, plan, turns)
        problems += state_problems(server, turns)
        problems += continuation_problems(model, since, plan, turns)
        problems += told_problems(clients, told_since, plan, turns)
        if watchers is not None:
            problems += watched_problems(clients, watchers, resumed=plan.resumed)
    finally:
        clients.close_sessions()
        if watchers is not None:
            clients.detach(watchers)
    return problems + usage.problems(server.pid)


def _raised(error: Exception) -> str:
    """The error, where it was raised and what it came from: a round's one line of it."""
    where = traceback.extract_tb(error.__traceback__)[-1]
    cause = f" (from {error.__cause__!r})" if error.__cause__ else ""
    return (
        f"{type(error).__name__}: {error}{cause}, at {Path(where.filename).name}:{where.lineno} {where.name}"
    )


def test_soak(mock_model: MockModel, clients: tuple[Path, Terminals, WebPages]) -> None:
    root, terminals, pages = clients
    plans = soak_plans()
    with running_opencode(root / "opencode", mock_model.base_url, supervised=OPTIONS) as server:
        poll(partial(following, server), what="the proxy following the server", timeout=60)
        with sdk_subscriptions(root, {"global": (server.url, "global", "")}) as followers:
            soaked = Clients(root, followers["global"], terminals, pages)
            killer, usage = Killer(server), Lifetimes()
            failed = []
            for plan in plans:
                try:
                    problems = soak_round(server, mock_model, soaked, killer, plan=plan, usage=usage)
                except Exception as error:  # the round cannot go on: say which, with its seed
                    failed.append(f"FAILED {plan.describe()}\n  {_raised(error)}")
                    break
                if problems:
                    failed.append("\n  ".join([f"FAILED {plan.describe()}", *problems]))
                    print(failed[-1], flush=True)
    print("proxy usage after each round (pid: fds, threads, RSS KiB):", usage.seen)
    assert not failed, "\n".join(failed)
