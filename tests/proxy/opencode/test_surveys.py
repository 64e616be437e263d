"""Surveys reused while they vouch: one taken after a message's last sign of life is reused for
good, any other for `MAX_AGE_S`, retaken in the background before then; what is unknown is said once."""

import shutil
from collections.abc import Callable
from typing import Any

import pytest
from yarl import URL

from proxy.opencode import other_processes as processes
from proxy.opencode import surveys
from proxy.opencode.other_processes import START_MARGIN_MS, Survey
from tests.proxy.system.fake_proc import BOOT_S, DB, PORT, FakeProc

UPSTREAM = URL(f"http://127.0.0.1:{PORT}")


async def test_a_survey_is_reused_for_a_while_and_what_is_unknown_is_said_once(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(processes, "PROC", proc.root)
    around = surveys.OtherProcesses(UPSTREAM)
    first = await around.current()
    assert await around.current() is first
    monkeypatch.setattr(surveys, "MAX_AGE_S", 0.0)
    assert await around.current() is not first
    assert await around.bound() is None
    warnings = [record for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "is not among those readable here" in warnings[0].getMessage()


class Clock:
    """A settable wall clock (epoch seconds), and a count of the surveys taken."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, proc: FakeProc, now: float) -> None:
        self.now = now
        self.surveys = 0
        monkeypatch.setattr(processes, "PROC", proc.root)
        taking = processes.survey

        def counted(*args: Any, **kwargs: Any) -> Survey:
            self.surveys += 1
            return taking(*args, **kwargs)

        monkeypatch.setattr(processes, "survey", counted)

    def __call__(self) -> float:
        return self.now


def vouching_past(moment_ms: int) -> Callable[[int], bool]:
    """What a reading that can call dead only what was last alive before `moment_ms` asks."""
    return lambda bound: bound >= moment_ms


NOW_S = BOOT_S + 100_000.0


async def test_a_survey_that_vouches_is_reused_however_old(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc.process(100, "socket:[111]", DB)
    clock = Clock(monkeypatch, proc, NOW_S)
    around = surveys.OtherProcesses(UPSTREAM, clock=clock)
    last_alive = int(NOW_S * 1000) - 5_000
    assert await around.bound(vouching_past(last_alive)) == NOW_S * 1000
    clock.now += 3_600
    assert await around.bound(vouching_past(last_alive)) == NOW_S * 1000
    assert (clock.surveys, around.busy) == (1, False)
    assert await around.bound(vouching_past(int(clock.now * 1000) - 2_000)) == clock.now * 1000
    assert clock.surveys == 2


async def test_one_that_cannot_vouch_is_retaken_in_the_background_before_it_expires(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc.process(100, "socket:[111]")  # holds no database: nothing can be known yet
    clock = Clock(monkeypatch, proc, NOW_S)
    around = surveys.OtherProcesses(UPSTREAM, clock=clock)
    assert await around.bound(vouching_past(0)) is None
    clock.now += surveys.MAX_AGE_S / 2
    assert await around.bound(vouching_past(0)) is None
    assert (clock.surveys, around.busy) == (1, False)
    clock.now += surveys.MAX_AGE_S * 0.4
    assert await around.bound(vouching_past(0)) is None  # answered at once, from the last survey
    assert around.busy
    await around.idle()
    assert clock.surveys == 2
    clock.now += surveys.MAX_AGE_S * 2
    assert await around.bound(vouching_past(0)) is None
    assert clock.surveys == 3


async def test_a_holder_that_ended_holds_nothing_back_once_its_survey_expired(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc.process(100, "socket:[111]", DB)
    started = int(NOW_S * 1000) - 60_000
    proc.process(200, DB, started_at=started)
    clock = Clock(monkeypatch, proc, NOW_S)
    around = surveys.OtherProcesses(UPSTREAM, clock=clock)
    last_alive = int(NOW_S * 1000) - 10_000
    assert await around.bound(vouching_past(last_alive)) == started - START_MARGIN_MS
    shutil.rmtree(proc.root / "200")
    clock.now += surveys.MAX_AGE_S / 2
    assert await around.bound(vouching_past(last_alive)) == started - START_MARGIN_MS
    clock.now += surveys.MAX_AGE_S
    assert await around.bound(vouching_past(last_alive)) == clock.now * 1000


async def test_a_clock_stepped_back_since_the_survey_makes_it_be_taken_again(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc.process(100, "socket:[111]", DB)
    clock = Clock(monkeypatch, proc, NOW_S)
    around = surveys.OtherProcesses(UPSTREAM, clock=clock)
    await around.bound(vouching_past(0))
    clock.now -= 60
    assert await around.bound(vouching_past(0)) == clock.now * 1000
    assert clock.surveys == 2


async def test_an_upstream_not_listening_yet_is_not_warned_about(
    proc: FakeProc, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each start of a server under `run` is surveyed before it listens: no warning of another
    container, and the survey after it listens knows."""
    monkeypatch.setattr(processes, "PROC", proc.root)
    monkeypatch.setattr(processes, "accepting", lambda _: False)
    monkeypatch.setattr(surveys, "MAX_AGE_S", 0.0)
    around = surveys.OtherProcesses(URL(f"http://127.0.0.1:{PORT + 7}"))
    starting = await around.current()
    assert starting.passing
    monkeypatch.setattr(processes, "accepting", lambda _: True)
    assert "another container?" in ((await around.current()).unknown or "")
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "another container?" in warnings[0]
