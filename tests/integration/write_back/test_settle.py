"""End to end: `python -m proxy settle` on the database of the real opencode 1.18.33, running
(phase 3 of the timeline in this package's conftest) and stopped (phase 5).

Measured on 1.18.33 (pinned by the tests named):
- Rows and events written into opencode.db under the running server are taken up at once: the
  direct view shows them, and a next prompt without a restart continues the log after our
  events (`test_next_prompt_after_settle_under_the_running_server`).
- `opencode export <id>`, server down or up, prints the v1 store only (measured in full in
  test_writers' docstring; `test_offline_export_before_and_after` pins it for offline settle).
"""

from __future__ import annotations

import orjson
import pytest

from ..expected import V1_MESSAGE_ERROR
from ..turns import RUNTIMES, Observed, Runtime
from .restarts import Crashed
from .sessions import UPSTREAM, Key
from .settles import LiveSettle, Offline, Proxied
from .shapes import assert_next_turn, assert_replay_consistent, assert_settled, message_in, tool_in, with_ids
from .writers import WrittenBack

pytestmark = pytest.mark.integration


# --- 2b. offline settle with the server stopped ---------------------------------------------------


def test_offline_settle_exit_codes(offline: Offline) -> None:
    assert offline.first.code == 10, offline.first.err or offline.first.out
    assert "settled" in offline.first.out
    assert offline.second.code == 0, offline.second.err or offline.second.out
    assert "nothing to do" in offline.second.out


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_offline_settle_shows_in_direct_view(runtime: Runtime, offline: Offline) -> None:
    observed = offline.stale[("offline", runtime)]
    messages = offline.direct[("offline", runtime)]
    assert_settled(tool_in(messages, observed), observed)
    if runtime == "v1":
        assert message_in(messages, observed)["info"]["error"] == V1_MESSAGE_ERROR
    else:
        assert_replay_consistent(offline.replays[("offline", runtime)], observed)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_offline_settle_leaves_the_proxy_nothing_to_rewrite(runtime: Runtime, offline: Offline) -> None:
    """A proxy without write-back serves the stored v1 view unchanged: storage is consistent. A v2
    message is stored as the server's own `tool.failed` leaves it, without `time.completed` (the
    server closes it on its next step), so the proxy still closes that turn, and only that."""
    proxied = offline.proxied[("offline", runtime)]
    if runtime == "v1":
        assert proxied == Proxied(None, None, same_as_direct=True)
    else:
        assert proxied == Proxied("0", "unfinished-message", same_as_direct=False)


def test_offline_export_before_and_after(offline: Offline) -> None:
    observed = offline.stale[("offline", "v1")]
    before = message_in(offline.exports_before[("offline", "v1")]["messages"], observed)
    assert tool_in([before], observed) == observed.running.tool
    after = message_in(offline.exports_after[("offline", "v1")]["messages"], observed)
    assert_settled(tool_in([after], observed), observed)
    assert "completed" in after["info"]["time"]
    assert offline.exports_before[("offline", "v2")]["messages"] == []
    assert offline.exports_after[("offline", "v2")]["messages"] == []


# --- 4. concurrency and 5. refusal ----------------------------------------------------------------


def test_settle_refuses_while_the_server_runs(live_settle: LiveSettle) -> None:
    run = live_settle.refused
    assert run.code == 3, run.err or run.out
    assert f"pid {live_settle.server_pid}" in run.err
    assert "is open in another process" in run.err, "the refusal does not say how it knew"
    assert live_settle.refused_before.sessions_changed(live_settle.refused_after) == set()


def test_settle_with_upstream_settles_only_inactive_sessions(
    crashed: Crashed, written: WrittenBack, live_settle: LiveSettle
) -> None:
    assert live_settle.settled.code == 10, live_settle.settled.err or live_settle.settled.out
    for key in UPSTREAM:
        assert_settled(tool_in(live_settle.direct[key], crashed.stale[key]), crashed.stale[key])
    for key, observed in written.live.items():
        assert tool_in(live_settle.direct[key], observed) == observed.running.tool
    late_v1 = crashed.stale[("late", "v1")]
    assert tool_in(live_settle.direct[("late", "v1")], late_v1) == late_v1.running.tool
    upstream = {crashed.stale[key].session_id for key in UPSTREAM}
    busy = {observed.session_id for observed in live_settle.busy.values()}
    changed = live_settle.before.sessions_changed(live_settle.after)
    assert changed - busy == upstream, "rows changed outside the settled and the busy sessions"


@pytest.mark.parametrize("key", UPSTREAM, ids="-".join)
def test_next_prompt_after_settle_under_the_running_server(
    key: Key, crashed: Crashed, live_settle: LiveSettle
) -> None:
    """Rows and events written into the database of a running server are taken up at once: a
    next prompt, without a restart, works and continues the log after our events."""
    assert_next_turn(live_settle.next_turns[key], crashed.stale[key])


def test_concurrent_writes_keep_the_database_intact(crashed: Crashed, live_settle: LiveSettle) -> None:
    """The server writes its own parts while `settle --upstream` writes: nothing lost or torn."""
    assert live_settle.integrity == "ok"
    assert live_settle.before.lost_in(live_settle.after) == []
    assert live_settle.after.malformed() == []
    first, last = live_settle.busy_writes[0], live_settle.busy_writes[-1]
    for written_at in live_settle.settle_writes:
        assert first < written_at < last, (
            f"premise: settle wrote at {written_at:.3f}, not among the server's writes ({first:.3f}-{last:.3f})"
        )
    for key, messages in live_settle.busy_done.items():
        tool = tool_in(messages, live_settle.busy[key])
        assert tool["state"]["status"] == "completed", f"{key}: the server's own tool ended {tool['state']}"
    for key in UPSTREAM:
        _assert_old_or_settled(live_settle, crashed.stale[key])


def _assert_old_or_settled(live_settle: LiveSettle, observed: Observed) -> None:
    """The row holding the tool is byte for byte as before, or settled with everything else kept."""
    v1 = observed.turn.runtime == "v1"
    table, row_id = ("part", observed.tool_id) if v1 else ("session_message", observed.running.message_id)
    before = live_settle.before.tables[table][row_id][1]
    after = live_settle.after.tables[table][row_id][1]
    if after == before:
        return
    stored = orjson.loads(after)
    if v1:
        tool = with_ids(stored, observed)
    else:
        tool = next(item for item in stored["content"] if item.get("id") == observed.tool_id)
    assert_settled(tool, observed)
