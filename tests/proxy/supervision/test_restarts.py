"""When a server that exited is started again: supervisord's `startsecs`. Issue 38's soak saw
restarts grow from 3.8 s to 18.9 s over five crashes of a server that had served 20 to 40 s each."""

from __future__ import annotations

from proxy.supervision.restarts import BACKOFF_S, STARTSECS_S, Restarts


def test_a_server_that_never_answered_is_a_failed_start_and_not_restarted() -> None:
    restarts = Restarts()
    pause = restarts.exited(None)
    assert pause.seconds is None
    assert "failed start" in pause.why


def test_every_crash_of_a_server_that_served_restarts_after_the_first_pause() -> None:
    restarts = Restarts(answered_ever=True)
    assert [restarts.exited(served).seconds for served in (20.0, 40.0, 25.0, 31.0, 22.0)] == [
        BACKOFF_S[0]
    ] * 5
    assert "at least 10 s (startsecs)" in restarts.exited(STARTSECS_S).why


def test_exits_in_a_row_of_a_server_that_did_not_serve_wait_longer_until_one_serves() -> None:
    restarts = Restarts(answered_ever=True)
    assert [restarts.exited(brief).seconds for brief in (1.0, None, 2.0, 0.5)] == list(BACKOFF_S[:4])
    assert "exit 5 in a row" in restarts.preview(None).why  # counted, not yet counted in
    assert restarts.exited(STARTSECS_S + 1).seconds == BACKOFF_S[0]
    assert restarts.exited(1.0).seconds == BACKOFF_S[0]  # the row starts again
    for _ in range(len(BACKOFF_S) + 2):
        last = restarts.exited(None)
    assert last.seconds == BACKOFF_S[-1]


def test_the_preview_counts_nothing() -> None:
    restarts = Restarts(answered_ever=True)
    for _ in range(3):
        restarts.preview(1.0)
    assert restarts.failures == 0
