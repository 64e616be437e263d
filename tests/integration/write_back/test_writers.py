"""End to end: write-back makes the settlement durable in the real opencode 1.18.33, and never
touches a session that is running: the write-back proxies (phase 2 of the timeline in this
package's conftest), and what of their work survives a SIGKILL (phase 4).

Measured on 1.18.33 (pinned by the tests named):
- `POST /sync/replay` with a seq already taken, or one leaving a gap, is refused: HTTP 500
  `UnknownError`, nothing stored. A prompt admitted in the session takes the next seq and the
  server appends its own `tool.failed` for the open call right after `prompt.admitted`; so a
  replay racing a prompt is refused, and the writer's re-read finds the call settled by the
  server: one `tool.failed`, no gap (`test_replay_racing_a_prompt_leaves_one_failure`). A
  replay that lands first is not duplicated by the server's next-prompt settle
  (`test_next_prompt_after_write_back_completes`). A replay after the server's own settle would
  be accepted (the server does not check for duplicates): only the writer's check prevents it.
- `POST /sync/history` refuses -1 (400); it returns every event after the given seq for the
  aggregates named and the whole history of all others.
- A prompt sent right after a fetch makes the session active again within ~0.1-0.2 s, well
  inside the grace (`test_session_active_at_second_reading_is_not_written` checks the premise).
- `opencode export <id>` reads the database itself (server up or down, any cwd) and prints the
  v1 store only: a v1 session's unfinished assistant message is NOT left out (it is exported
  with its tool `running`, and after settlement with the settled tool); a v2 session exports
  its info with `messages: []`, before and after settlement (`test_export_*`, and
  `test_offline_export_before_and_after` in test_settle).
"""

from __future__ import annotations

import pytest

from ..expected import V1_MESSAGE_ERROR
from ..turns import RUNTIMES, Runtime
from .restarts import Crashed, Restarted
from .sessions import GRACE_S, RACES, UPSTREAM, WRITTEN, Key
from .settles import LiveSettle
from .shapes import (
    assert_contiguous,
    assert_next_turn,
    assert_replay_consistent,
    assert_settled,
    failures,
    is_open,
    message_in,
    tool_in,
    with_ids,
    written_lines,
)
from .writers import WrittenBack

pytestmark = pytest.mark.integration


# --- 1. --write-back api ------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_api_write_back_settles_the_direct_view(
    runtime: Runtime, crashed: Crashed, written: WrittenBack
) -> None:
    """A fetch through `--write-back api` makes opencode itself store the settled shape."""
    observed = crashed.stale[("api", runtime)]
    assert_settled(tool_in(written.direct[("api", runtime)], observed), observed)
    assert written_lines(written.logs["api"], observed.session_id), "the proxy logged no write"


def test_api_write_back_is_announced_on_event_stream(crashed: Crashed, written: WrittenBack) -> None:
    """v1: the PATCH reaches every client subscribed to `/event` of the session's directory."""
    observed = crashed.stale[("api", "v1")]
    settled = [p["properties"]["part"] for p in written.heard if not is_open(p["properties"]["part"])]
    assert settled, f"no settled message.part.updated for {observed.tool_id} on /event"
    assert_settled(settled[-1], observed)


def test_api_v1_message_stays_open_in_storage(crashed: Crashed, written: WrittenBack) -> None:
    """The API has no route to close a v1 message: `time.completed` stays unset (view-only)."""
    observed = crashed.stale[("api", "v1")]
    info = message_in(written.direct[("api", "v1")], observed)["info"]
    assert "completed" not in info["time"]


# --- 2. --write-back db -------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_db_write_back_settles_the_direct_view(
    runtime: Runtime, crashed: Crashed, written: WrittenBack
) -> None:
    """A fetch through `--write-back db` changes opencode.db under the running server, which
    serves the settled shape at once."""
    observed = crashed.stale[("db", runtime)]
    messages = written.direct[("db", runtime)]
    assert_settled(tool_in(messages, observed), observed)
    assert written_lines(written.logs["db"], observed.session_id), "the proxy logged no write"
    if runtime == "v1":
        info = message_in(messages, observed)["info"]
        assert info["error"] == V1_MESSAGE_ERROR
        assert info["time"]["completed"] >= info["time"]["created"]


@pytest.mark.parametrize("key", [*WRITTEN, *UPSTREAM], ids="-".join)
def test_settlement_survives_a_restart(
    key: Key, crashed: Crashed, written: WrittenBack, live_settle: LiveSettle, restarted: Restarted
) -> None:
    """After SIGKILL and start, opencode serves exactly the settlement that was written."""
    observed = crashed.stale[key]
    settled_then = (written.direct if key in WRITTEN else live_settle.direct)[key]
    assert_settled(tool_in(settled_then, observed), observed)
    assert tool_in(restarted.direct[key], observed) == tool_in(settled_then, observed)


@pytest.mark.parametrize("key", [k for k in (*WRITTEN, *UPSTREAM) if k[1] == "v2"], ids="-".join)
def test_v2_event_log_replays_one_failure(key: Key, crashed: Crashed, restarted: Restarted) -> None:
    assert_replay_consistent(restarted.replays[key], crashed.stale[key])


@pytest.mark.parametrize("key", WRITTEN, ids="-".join)
def test_next_prompt_after_write_back_completes(key: Key, crashed: Crashed, restarted: Restarted) -> None:
    """The session takes a next prompt normally; the settled tool stays settled, and for v2 the
    server's own next-prompt settle appends no second `tool.failed` after ours."""
    assert_next_turn(restarted.next_turns[key], crashed.stale[key])


def test_export_db_v1_before_and_after(crashed: Crashed, restarted: Restarted) -> None:
    """Measured: 1.18.33 exports the unfinished v1 message (tool `running`); after settlement the
    export holds the settled tool and the closed message."""
    observed = crashed.stale[("db", "v1")]
    before = message_in(crashed.exports_before[("db", "v1")]["messages"], observed)
    assert tool_in([before], observed) == observed.running.tool
    assert "completed" not in before["info"]["time"]
    after = message_in(restarted.exports_after[("db", "v1")]["messages"], observed)
    assert_settled(tool_in([after], observed), observed)
    assert after["info"]["error"] == V1_MESSAGE_ERROR


def test_export_v2_has_no_messages(crashed: Crashed, written: WrittenBack, restarted: Restarted) -> None:
    """Measured: `opencode export` reads only the v1 store. A v2 session exports its info and no
    messages: stale, settled, or (the race session) with a finished answer after the settled tool."""
    observed = crashed.stale[("db", "v2")]
    for export in (crashed.exports_before[("db", "v2")], restarted.exports_after[("db", "v2")]):
        assert export["info"]["id"] == observed.session_id
        assert export["messages"] == []
    answered = [
        kind
        for _, kind, _, _ in written.races[("race", "v2")].events
        if kind.startswith("session.next.text.ended")
    ]
    assert answered, "premise: the race session holds no finished answer"
    assert restarted.exports_after[("race", "v2")]["messages"] == []


# --- 3. never a running session -----------------------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_live_session_is_never_written(runtime: Runtime, written: WrittenBack) -> None:
    """A tool really running while both proxies are fetched and the grace has passed: untouched."""
    key = ("live", runtime)
    observed = written.live[key]
    assert written.live_stored_after[key] == written.live_stored_before[key], "the stored row changed"
    assert tool_in(written.live_direct_after[key], observed) == observed.running.tool
    for log in written.logs.values():
        assert not written_lines(log, observed.session_id)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_session_active_at_second_reading_is_not_written(
    runtime: Runtime, crashed: Crashed, written: WrittenBack
) -> None:
    """Inactive at the fetch, active again (a new prompt) at the second reading: no write."""
    observed, late = crashed.stale[("late", runtime)], written.late[("late", runtime)]
    assert late.active_after_s < GRACE_S, f"premise: active only after {late.active_after_s:.2f}s"
    skipped = [line for line in written.logs["db"].splitlines() if observed.session_id in line]
    assert any("skipped: the session became active" in line for line in skipped), skipped
    assert not written_lines(written.logs["db"], observed.session_id)
    if runtime == "v1":
        # v1 never settles the old part itself: the row must be exactly as before the fetch.
        assert late.stored_after == late.stored_before
        assert with_ids(late.stored_after[0], observed) == observed.running.tool
    else:
        # The server's own prompt settled the call: its failure and no second one.
        assert len(failures(late.events_after, observed.tool_id)) == 1
        assert_contiguous(late.events_after)


# --- the replay race ----------------------------------------------------------------------------


@pytest.mark.parametrize("key", RACES, ids=lambda key: key[0])
def test_replay_racing_a_prompt_leaves_one_failure(crashed: Crashed, written: WrittenBack, key: Key) -> None:
    """Measured: a prompt landing between the writer's read and its `/sync/replay` takes that seq;
    the replay is refused (500), the server fails the call itself right after `prompt.admitted`,
    and the writer's re-read sees that and appends nothing: one failure, no gap. The same whether
    the writer reads the log through `/sync/history` or from the server's database."""
    observed, race = crashed.stale[key], written.races[key]
    assert race.histories == (0 if key[0] == "race-db" else 2), "the log read where it should not be"
    assert race.outcome == [], race.outcome
    assert race.admitted_seq is not None, "the writer never tried to replay"
    assert race.replays[:1] == [(race.admitted_seq, 500)], race.replays
    assert [status for _, status in race.replays] == [500], "the writer appended after the server's settle"
    assert failures(race.events, observed.tool_id) == [race.admitted_seq + 1]
    assert_contiguous(race.events)
