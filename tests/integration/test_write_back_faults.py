"""Write-back under faults, on the real opencode 1.18.33 (issue 6, item 6): a writer SIGKILLed
in the middle of a db pass leaves every stale tool exactly as it was or fully settled, and two
proxies writing back in front of one server write each part exactly once.

The module has its own server (its own data dir), so the offline `settle`, which settles the
whole database, sees only this module's sessions. One crash makes every stale session the
module needs; then fixtures act in a fixed timeline and record what they saw, and the tests
only assert on those records (the harness: `faults` reads and judges storage, `kills` lands
the kills, `pairs` runs two writers at once):

1. `crashed`: stale turns of every group run a bash tool; SIGKILL; start; the rows and event
   logs of every stale session are kept as they were (`before`).
2. `pairs`: two `--write-back db` proxies on the same database, then two `--write-back api`
   proxies, fetch the same stale sessions at the same instant (one barrier for all requests);
   every appended event is counted per part and per call. The api v1 sessions are made stale
   again between trials by writing their part rows back to the bytes the crash left (the
   server has no cache, measured), so one session gives many trials. Then the v1 PATCH race is
   forced in process: two `ApiWriter`s that both read before either PATCHes.
3. `killed`: writers of the kill group are SIGKILLed while a db pass is under way, alternately
   a proxy (`--write-back db --grace 0`, all sessions fetched at once) and the offline
   `settle --upstream`; after each kill the database is checked; then a proxy settles the rest
   and a last `settle --upstream` finds nothing to do.

Landing a kill inside a write transaction, not merely between two: the writer is frozen with
SIGSTOP (every thread stopped, read from /proc), and it is inside a write transaction exactly
when it holds SQLite's WAL write lock, an fcntl lock on byte 120 of `opencode.db-shm` that
/proc/locks lists with its pid. If it holds it and part of the pass (not all) has committed,
it is SIGKILLed while still frozen: the kill provably lands inside a transaction with the pass
half done. Otherwise it is continued (SIGCONT) and sampled again ~0.1 ms later; it runs niced
on the sampler's CPU, so only while the sampler sleeps. What is committed while the writer is
frozen is what a SIGKILL at that instant would leave, so every sample is also a crash point
whose storage is checked (about 1,500 per run, not just the few real kills); the real kill then
shows that storage after it is exactly the storage read while frozen.
A writer that commits a row apart from its event is caught this way (tried: both the kills and
the frozen samples found a settled part without its event or message).

Measured on 1.18.33 (pinned by the tests named):
- Before `SessionLocks` (proxy/writeback/api_writer.py), two api proxies fetching one stale v1 session at
  once PATCHed it twice in 15 of 20 trials here (8 of 20 with less tightly synchronised
  fetches): PATCH is an upsert with no precondition, and both proxies read the part before
  either wrote. Forced in process, both writers PATCH and the server stores both
  (`test_v1_patch_race_premise_and_lock`, premise half). With the lock, 0 of 20
  (`test_two_api_proxies_write_each_v1_part_once`).
- Two api proxies appending the same v2 `tool.failed`: one replay is refused (the seq is
  taken) and its writer's re-read finds the call failed: one event per call.
- The db writer's one `BEGIN IMMEDIATE` transaction per session, re-reading inside it, makes
  two db proxies write each part and each message once; SIGKILL inside it leaves nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from proxy.demo.model import MockModel

from .faults import (
    Crashed,
    Key,
    keys_of,
    read_stored,
)
from .freshness import wait_past_freshness
from .kill_rounds import Killed, kill_rounds, report
from .opencode_server import OpencodeServer, running_opencode
from .pairs import ForcedRace, Pairs, run_pairs
from .turns import observe_running

pytestmark = pytest.mark.integration

KILL_V1 = 5
KILL_V2 = 5
"""The kill group: enough sessions that several kills each find a pass half done."""
PAIR_DB = 2
"""v1 and v2 sessions each that two db proxies fetch at once."""
PAIR_API_V1 = 2
PAIR_API_V2 = 3
API_V1_TRIALS = 20
"""Race trials of two api proxies on a v1 part: the real stale sessions, then made stale again."""
KILL_ROUNDS = ("proxy", "settle", "proxy", "settle", "proxy", "settle")
"""Writers to SIGKILL mid-pass, in turn, while at least two kill-group sessions are left open."""
MIN_LANDED_PER_WRITER = 1
"""Kills that must land inside a transaction, for each writer, or the test proves nothing."""

KILL: list[Key] = [*keys_of("kill", "v1", KILL_V1), *keys_of("kill", "v2", KILL_V2)]
PAIR_DB_KEYS: list[Key] = [*keys_of("pair-db", "v1", PAIR_DB), *keys_of("pair-db", "v2", PAIR_DB)]
PAIR_API_KEYS: list[Key] = [*keys_of("pair-api", "v1", PAIR_API_V1), *keys_of("pair-api", "v2", PAIR_API_V2)]
STALE: list[Key] = [*KILL, *PAIR_DB_KEYS, *PAIR_API_KEYS]


@pytest.fixture(scope="module")
def server(mock_model: MockModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpencodeServer]:
    """This module's own server; stopped with all its tools at the end."""
    with running_opencode(tmp_path_factory.mktemp("write-back-faults"), mock_model.base_url) as opencode:
        yield opencode


@pytest.fixture(scope="module")
def crashed(server: OpencodeServer) -> Crashed:
    """Start every turn first (their start-ups overlap), wait for each tool, SIGKILL, start."""
    stale = observe_running(
        server.url, server.project, {key: (key[1], "-".join(map(str, key))) for key in STALE}
    )
    server.crash()
    crashed_at = int(time.time() * 1000)
    server.restart()
    wait_past_freshness(server.url, crashed_at)  # every proxy's first fetch then settles
    return Crashed(stale, read_stored(server.database, list(stale.values())))


@pytest.fixture(scope="module")
def pairs(server: OpencodeServer, crashed: Crashed, tmp_path_factory: pytest.TempPathFactory) -> Pairs:
    """Two db proxies, then two api proxies, on the same sessions at once; then the forced race."""
    logs = tmp_path_factory.mktemp("write-back-pairs")
    return run_pairs(
        server, crashed, logs, db_keys=PAIR_DB_KEYS, api_keys=PAIR_API_KEYS, api_v1_trials=API_V1_TRIALS
    )


@pytest.fixture(scope="module")
def killed(
    server: OpencodeServer, crashed: Crashed, pairs: Pairs, tmp_path_factory: pytest.TempPathFactory
) -> Killed:
    """Runs after `pairs`: the last `settle` settles the whole database."""
    del pairs  # only its order matters: every other stale session is settled by now
    return kill_rounds(server, crashed, KILL, KILL_ROUNDS, tmp_path_factory.mktemp("write-back-kills"))


def test_kills_landed_inside_a_transaction_mid_pass(killed: Killed) -> None:
    """The premise: each writer was SIGKILLed inside a write transaction with part of its pass
    committed and part still to do (else the checks below would prove nothing)."""
    for writer in ("proxy", "settle"):
        landed = [r for r in killed.rounds if r.writer == writer and r.kill.landed]
        assert len(landed) >= MIN_LANDED_PER_WRITER, f"{writer}: {report(killed)}"
        for round_ in landed:
            assert 1 <= round_.kill.committed < round_.targets, report(killed)


def test_integrity_after_every_kill(killed: Killed) -> None:
    assert [r.integrity for r in killed.rounds] == ["ok"] * len(killed.rounds)
    assert killed.final_integrity == "ok"


def test_every_session_old_or_fully_settled_after_every_kill(killed: Killed) -> None:
    """Never half-written: the rows exactly as the crash left them, or settled together with
    their events, never a settled row without its event or an event without its row; after
    each SIGKILL, and at every frozen sample before it (each one a crash point)."""
    for number, round_ in enumerate(killed.rounds):
        torn = {sid: state for sid, state in round_.states.items() if state not in ("old", "settled")}
        assert torn == {}, f"round {number} ({round_.writer}) after the kill"
        assert round_.kill.torn_while_frozen == {}, f"round {number} ({round_.writer}) while frozen"


def test_the_transaction_open_at_the_kill_left_nothing(killed: Killed) -> None:
    """Storage after the SIGKILL is exactly what was committed while the writer was frozen
    inside its transaction: the open transaction was rolled back, nothing else moved."""
    for round_ in killed.rounds:
        if round_.kill.landed:
            assert round_.after_kill == round_.kill.at_kill, report(killed)


def test_event_logs_stay_contiguous_after_every_kill(killed: Killed) -> None:
    """Every session's seqs run 0..n without a gap and `event_sequence` names the last."""
    for round_ in killed.rounds:
        assert round_.log_problems == []
    assert killed.final_log_problems == []


def test_a_later_run_settles_the_rest_exactly_once(crashed: Crashed, killed: Killed) -> None:
    """After the kills an uninterrupted pass settles what is left, each part, message and call
    once in all (killed passes included), and `settle` then finds nothing to do."""
    assert set(killed.final_states.values()) == {"settled"}, killed.final_states
    for stale in crashed.sessions(KILL):
        expected = {"part": 1, "message": 1} if stale.runtime == "v1" else {"call": 1}
        assert killed.final_counts[stale.session_id] == expected, stale.session_id
    code, output = killed.last_settle
    assert code == 0, output
    assert "nothing to do" in output


def test_two_db_proxies_write_each_part_once(pairs: Pairs) -> None:
    """Both on one database, both fetching at once: one `message.part.updated.1` and one
    `message.updated.1` per v1 part and message, one `tool.failed` per v2 call."""
    assert len(pairs.db) == 2 * PAIR_DB
    assert any(trial.racing == 2 for trial in pairs.db), "premise: the two proxies never raced"
    for trial in pairs.db:
        expected = {"part": 1, "message": 1} if trial.key[1] == "v1" else {"call": 1}
        assert trial.counts == expected, trial
        assert trial.state == "settled", trial


def test_two_api_proxies_append_each_v2_failure_once(pairs: Pairs) -> None:
    """The seq check of `/sync/replay` lets one append through; the other writer's re-read
    finds the call failed."""
    assert any(trial.racing == 2 for trial in pairs.api_v2), "premise: the two proxies never raced"
    assert [trial.counts for trial in pairs.api_v2] == [{"call": 1}] * PAIR_API_V2
    assert {trial.state for trial in pairs.api_v2} == {"settled"}


def test_two_api_proxies_write_each_v1_part_once(pairs: Pairs) -> None:
    """One PATCH per part in every trial (15 of 20 were doubled before `SessionLocks`). The
    API cannot close a v1 message: no `message.updated.1`."""
    assert len(pairs.api_v1) == API_V1_TRIALS
    raced = sum(trial.racing == 2 for trial in pairs.api_v1)
    assert raced >= API_V1_TRIALS // 2, f"premise: the two proxies raced in {raced} trials only"
    assert [trial.counts for trial in pairs.api_v1] == [{"part": 1, "message": 0}] * API_V1_TRIALS
    assert {trial.state for trial in pairs.api_v1} == {"settled part"}


def test_v1_patch_race_premise_and_lock(pairs: Pairs) -> None:
    """Premise: two writers that both read the part before either PATCHes both PATCH, and the
    server stores both (no precondition on PATCH). With a lock directory in common, the second
    re-reads after the first has written and PATCHes nothing."""
    assert pairs.race_separate_locks == ForcedRace(patches=2, written=[1, 1], part_events=2)
    assert pairs.race_shared_lock.patches == 1
    assert sorted(pairs.race_shared_lock.written) == [0, 1]
    assert pairs.race_shared_lock.part_events == 1


def test_pairs_keep_the_database_whole(pairs: Pairs) -> None:
    assert pairs.integrity == "ok"
    assert pairs.log_problems == []
