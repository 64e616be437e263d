"""Kill rounds: writers SIGKILLed in the middle of a db pass on the sessions of one group, the
storage checked after each kill, then an uninterrupted pass and a last `settle` (the why and the
measurements: the docstring of tests/integration/test_write_back_faults.py)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import opencode_db
from .faults import (
    PASS_TIMEOUT_S,
    Crashed,
    Key,
    Stored,
    fetch_messages,
    log_problems,
    read_stored,
    state_of,
    stored_now,
    written_counts,
)
from .kills import Kill, kill_proxy, kill_settle
from .opencode_server import OpencodeServer
from .polling import WaitTimeout, poll
from .proxy_process import ProxyProcess
from .settle_cli import run_settle
from .turns import Observed


@dataclass(frozen=True)
class Round:
    """One writer started on the kill group's open sessions and SIGKILLed mid-pass (if caught)."""

    writer: str
    targets: int
    """Sessions still open when the round began."""
    kill: Kill
    after_kill: dict[str, Stored]
    """The targets' storage after the SIGKILL (must be `kill.at_kill`: the open transaction left nothing)."""
    integrity: str
    states: dict[str, str]
    """Every kill-group session: "old", "settled" or "torn: <why>"."""
    log_problems: list[str]


@dataclass(frozen=True)
class Killed:
    """Phase 3: the kill rounds, then the kill group after a final pass and a last `settle`."""

    rounds: list[Round]
    final_states: dict[str, str]
    final_counts: dict[str, dict[str, int]]
    final_integrity: str
    final_log_problems: list[str]
    last_settle: tuple[int, str]
    """Exit code and output of `settle --upstream` after the final pass."""
    seconds: float


def kill_rounds(
    server: OpencodeServer, crashed: Crashed, keys: Sequence[Key], writers: Sequence[str], logs: Path
) -> Killed:
    """A round for each of `writers` ("proxy" or "settle") while at least two of the sessions of
    `keys` are open, a final uninterrupted proxy pass, then `settle --upstream`, which settles
    the whole database: every other stale session must be settled by then."""
    started = time.monotonic()
    sessions = crashed.sessions(keys)
    rounds = []
    for number, writer in enumerate(writers):
        open_now = [
            s for s in sessions if state_of(s, crashed.before[s.session_id], stored_now(server, s)) == "old"
        ]
        if len(open_now) < 2:
            break
        rounds.append(
            _kill_round(server, crashed, writer, open_now, logs / f"round-{number}.log", group=sessions)
        )
    _final_pass(server, crashed, sessions, logs / "final.log")
    last = run_settle(server.database, "--upstream", server.url, timeout=PASS_TIMEOUT_S * 2)
    after = read_stored(server.database, sessions)
    result = Killed(
        rounds=rounds,
        final_states={
            s.session_id: state_of(s, crashed.before[s.session_id], after[s.session_id]) for s in sessions
        },
        final_counts={
            s.session_id: written_counts(s, crashed.before[s.session_id], after[s.session_id])
            for s in sessions
        },
        final_integrity=opencode_db.integrity(server.database),
        final_log_problems=log_problems(server.database),
        last_settle=(last.code, last.out + last.err),
        seconds=time.monotonic() - started,
    )
    print(f"\nkill rounds ({result.seconds:.1f}s): {report(result)}")  # the figures, with -s
    return result


def _kill_round(
    server: OpencodeServer,
    crashed: Crashed,
    writer: str,
    targets: list[Observed],
    log: Path,
    *,
    group: list[Observed],
) -> Round:
    database = server.database
    if writer == "proxy":
        kill = kill_proxy(server, targets, crashed.before, log)
    else:
        kill = kill_settle(server, targets, crashed.before, log)
    after = read_stored(database, group)
    return Round(
        writer=writer,
        targets=len(targets),
        kill=kill,
        after_kill={s.session_id: after[s.session_id] for s in targets},
        integrity=opencode_db.integrity(database),
        states={s.session_id: state_of(s, crashed.before[s.session_id], after[s.session_id]) for s in group},
        log_problems=log_problems(database),
    )


def _final_pass(server: OpencodeServer, crashed: Crashed, sessions: list[Observed], log: Path) -> None:
    """A proxy nobody kills fetches every session; wait until none is left old (bounded: the
    tests then say which was not settled)."""
    proxy = ProxyProcess(
        server.url, log, ("--write-back", "db", "--db", str(server.database), "--grace", "0")
    )
    try:
        proxy.start()
        for stale in sessions:
            assert fetch_messages(proxy.url, stale.turn).status == 200

        def none_old() -> bool | None:
            after = read_stored(server.database, sessions)
            states = [state_of(s, crashed.before[s.session_id], after[s.session_id]) for s in sessions]
            return None if "old" in states else True

        with contextlib.suppress(WaitTimeout):
            poll(none_old, what="the final pass", timeout=PASS_TIMEOUT_S, interval=0.1)
    finally:
        proxy.stop()


def report(killed: Killed) -> str:
    return "; ".join(
        f"{r.writer}: {r.targets} open, {'killed in a transaction' if r.kill.landed else 'not caught'} "
        f"with {r.kill.committed} committed, {r.kill.samples} crash points checked"
        for r in killed.rounds
    )
