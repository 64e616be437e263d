"""Turns that wait for a person: an unsafe call (or no `--resume`) settles the turn and keeps it
waiting, listed, told and durable; a person's Continue resumes it once as an automatic resume
would; their own message ends the wait; and the continuations of one crash are admitted in order,
a few at once, spaced (an injected clock)."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from proxy.opencode.client import Credentials
from proxy.opencode.followed_events import FollowedEvent
from proxy.relay.tasks import KeyedTasks, Together
from proxy.resume import waiting as waiting_module
from proxy.resume.admission import Admission
from proxy.resume.candidates import BusySessions
from proxy.resume.decision import Policy
from proxy.resume.journal import Journal
from proxy.resume.last_turn import InterruptedTurn
from proxy.resume.ledger import Ledger
from proxy.resume.resumer import Records, ResumeOptions, Resumer
from proxy.resume.resuming import Resuming
from proxy.resume.safety import Safety
from proxy.resume.waiting import TITLE, Continued, NotWaiting, Waiting, WaitingTurns
from proxy.writeback.scheduler import Written
from rules import Api
from tests.proxy.resume.test_resumer import CANDIDATE, NOW, FakeProbe, FakeServer, SettlingWriter, ledger
from tests.proxy.resume.views import v1_settled, v1_tool, v1_user, v1_view

__all__ = ["ledger"]

NO_PATTERNS = Safety()
UNSAFE = {"command": "echo x > out.txt && sleep 600", "description": "writes"}


class Told:
    """An `Announcer` that remembers what it was asked to tell."""

    def __init__(self) -> None:
        self.waits: list[tuple[str, str | None, str, str]] = []
        self.ends: list[str] = []

    def waiting(self, session_id: str, directory: str | None, title: str, message: str) -> None:
        self.waits.append((session_id, directory, title, message))

    def ended(self, session_id: str) -> None:
        self.ends.append(session_id)


class UnsafeSettling(SettlingWriter):
    """Settles the call as the write-back does, its input kept."""

    async def write(self, *args: Any, **kwargs: Any) -> list[Written]:
        written = await super().write(*args, **kwargs)
        self.server.view = unsafe_view()
        return written


def unsafe_view(status: str = "error") -> object:
    part = v1_settled("prt_1") if status == "error" else v1_tool("prt_1", status)
    part["state"]["input"] = UNSAFE
    return v1_view(part)


def unsafe_server(ledger: Ledger) -> FakeServer:
    """A server whose interrupted turn ran an unsafe call: it waits for a person."""
    server = FakeServer(ledger)
    server.view = unsafe_view()
    return server


async def decided(resumer: Resumer) -> None:
    """The resumer handed the one candidate, and done deciding it."""
    resumer.consider(CANDIDATE)
    await resumer.tasks.idle()


def made(
    server: FakeServer,
    ledger: Ledger,
    *,
    safety: Safety = NO_PATTERNS,
    auto: bool = True,
    told: Told | None = None,
) -> tuple[Resumer, Journal, WaitingTurns]:
    journal = Journal(CollectorRegistry(), enabled=auto, dry_run=False)
    options = ResumeOptions(Policy(3, 300), grace=0, retry_pause=0, settle_pause=0, safety=safety, auto=auto)
    waiting = WaitingTurns(told, ledger)
    resumer = Resumer(
        server,
        FakeProbe(),
        Records(ledger, journal),
        options,
        writer=UnsafeSettling(server),
        credentials=Credentials(),
        waiting=waiting,
        admission=Admission(spacing=0),
        clock=lambda: NOW,
    )
    return resumer, journal, waiting


async def test_a_turn_with_an_unsafe_call_is_settled_and_waits_for_a_person(ledger: Ledger) -> None:
    server = FakeServer(ledger)
    server.view = unsafe_view("running")
    told = Told()
    resumer, journal, waiting = made(server, ledger, told=told)
    await decided(resumer)
    assert server.prompts == []
    assert server.view == unsafe_view(), "settled as before"
    [decision] = journal.recent()
    assert decision["outcome"] == "waiting"
    assert "'>': redirects to a file (out.txt)" in decision["why"]
    [call] = decision["calls"]
    assert (call["tool"], call["class"], call["command"]) == ("bash", "unsafe", UNSAFE["command"])
    [listed] = waiting.listed()
    assert (listed["session"], listed["message"], listed["calls"]) == ("ses_1", "msg_002", [call])
    [(session, directory, title, message)] = told.waits
    assert (session, directory, title) == ("ses_1", "/work", TITLE)
    assert UNSAFE["command"] in message
    assert "send a message, or POST /_settle/resume/ses_1" in message


async def test_a_turn_of_safe_calls_is_resumed_by_itself_and_never_waits(ledger: Ledger) -> None:
    server = FakeServer(ledger)
    resumer, journal, waiting = made(server, ledger)
    await decided(resumer)
    assert len(server.prompts) == 1
    [decision] = journal.recent()
    assert decision["outcome"] == "resumed"
    assert decision["calls"][0]["class"] == "safe"
    assert waiting.listed() == []


async def test_resume_unsafe_continues_an_unsafe_turn_with_todays_prompt(ledger: Ledger) -> None:
    server = unsafe_server(ledger)
    resumer, journal, _ = made(server, ledger, safety=Safety(unsafe_ok=True))
    await decided(resumer)
    [(_, text, _)] = server.prompts
    assert f"- bash: `{UNSAFE['command']}`" in text
    assert journal.recent()[0]["calls"][0]["class"] == "unsafe"


async def test_without_resume_even_a_safe_turn_waits_for_a_continue(ledger: Ledger) -> None:
    server = FakeServer(ledger)
    resumer, journal, waiting = made(server, ledger, auto=False)
    await decided(resumer)
    assert server.prompts == []
    assert journal.recent()[0]["outcome"] == "waiting"
    assert "--resume is off" in journal.recent()[0]["why"]
    assert [w["session"] for w in waiting.listed()] == ["ses_1"]


async def test_a_continue_resumes_the_waiting_turn_once_and_a_second_is_refused(ledger: Ledger) -> None:
    server = unsafe_server(ledger)
    told = Told()
    resumer, journal, waiting = made(server, ledger, told=told)
    await decided(resumer)
    assert resumer.proceed(await waiting.take("ses_1"))
    await resumer.tasks.idle()
    [(_, text, recorded)] = server.prompts
    assert recorded == 1
    assert UNSAFE["command"] in text
    assert [d["outcome"] for d in journal.recent()] == ["waiting", "resumed"]
    assert told.ends == ["ses_1"]
    with pytest.raises(Continued, match="continued already"):
        await waiting.take("ses_1")
    with pytest.raises(NotWaiting, match="no turn of this session waits"):
        await waiting.take("ses_other")


async def test_a_continue_after_a_person_wrote_sends_nothing(ledger: Ledger) -> None:
    server = unsafe_server(ledger)
    resumer, journal, waiting = made(server, ledger)
    await decided(resumer)
    server.view = [*unsafe_view(), v1_user("msg_zzz")]  # type: ignore[misc]
    assert resumer.proceed(await waiting.take("ses_1"))
    await resumer.tasks.idle()
    assert server.prompts == []
    assert "a newer message msg_zzz" in journal.recent()[-1]["why"]


async def test_waiting_turns_outlive_the_proxy_in_the_ledger(tmp_path: Path, ledger: Ledger) -> None:
    server = unsafe_server(ledger)
    resumer, _, waiting = made(server, ledger)
    await decided(resumer)
    again = WaitingTurns(None, ledger)
    await again.load()
    assert again.listed() == waiting.listed()
    restored = again.get("ses_1")
    before = waiting.get("ses_1")
    assert restored is not None
    assert before is not None
    assert restored.turn == before.turn
    await again.end("ses_1", "a person wrote")
    assert await ledger.waits() == []
    with pytest.raises(NotWaiting, match="the wait ended: a person wrote"):
        await again.take("ses_1")


async def test_a_persons_own_message_ends_the_wait_and_nothing_is_sent(ledger: Ledger) -> None:
    server = unsafe_server(ledger)
    told = Told()
    resumer, _, waiting = made(server, ledger, told=told)
    await decided(resumer)
    ends: KeyedTasks[str] = KeyedTasks("ends")
    resuming = Resuming(BusySessions(lambda _: None), Together(ends), waiting, {"1.18": resumer}, ends)
    old = {"sessionID": "ses_1", "info": {"id": "msg_002", "role": "assistant", "sessionID": "ses_1"}}
    resuming.event(FollowedEvent("/work", None, "message.updated", old))
    await ends.idle()
    assert waiting.get("ses_1") is not None, "news of the interrupted message itself is no person"
    mine = {"sessionID": "ses_1", "info": {"id": "msg_100", "role": "user", "sessionID": "ses_1"}}
    resuming.event(FollowedEvent("/work", None, "message.updated", mine))
    await ends.idle()
    assert waiting.listed() == []
    assert told.ends == ["ses_1"]
    with pytest.raises(NotWaiting, match="a newer message msg_100"):
        await resuming.proceed("ses_1")
    assert server.prompts == []


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


async def test_ten_continuations_are_admitted_in_order_two_at_once_two_seconds_apart() -> None:
    clock = Clock()
    admission = Admission(2, 2.0, clock=clock, sleep=clock.sleep)
    admitted: list[tuple[int, float]] = []
    entered = asyncio.Event()
    inside = 0
    most = 0
    release = {n: asyncio.Event() for n in range(10)}

    async def continuation(number: int, ticket: int) -> None:
        nonlocal inside, most
        async with admission.admitted(ticket) as at:
            inside += 1
            most = max(most, inside)
            admitted.append((number, at))
            entered.set()
            await release[number].wait()
            inside -= 1

    tickets = [admission.ticket() for _ in range(10)]
    # They reach the gate in another order than they were handed on: the order is the tickets'.
    tasks = [asyncio.create_task(continuation(n, tickets[n])) for n in reversed(range(10))]
    for number in range(10):
        while len(admitted) <= number:
            entered.clear()
            await entered.wait()
        release[number].set()
    await asyncio.gather(*tasks)
    assert [number for number, _ in admitted] == list(range(10))
    assert most <= 2
    times = [at for _, at in admitted]
    assert times[0] == pytest.approx(time.time(), abs=60)  # wall-clock times, on the admission's clock
    assert all(later - earlier >= 2.0 - 1e-6 for earlier, later in itertools.pairwise(times))


async def test_a_dropped_ticket_lets_the_next_one_in() -> None:
    clock = Clock()
    admission = Admission(1, 0.0, clock=clock, sleep=clock.sleep)
    first, second = admission.ticket(), admission.ticket()
    entered = asyncio.Event()

    async def later() -> None:
        async with admission.admitted(second):
            entered.set()

    task = asyncio.create_task(later())
    await asyncio.sleep(0)
    assert not entered.is_set()
    admission.drop(first)
    await asyncio.wait_for(entered.wait(), 5)
    await task


async def test_the_sessions_whose_wait_ended_are_remembered_up_to_a_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waiting_module, "OVER_KEPT", 3)
    turns = WaitingTurns()
    for number in range(10):
        session_id = f"ses_{number}"
        turn = InterruptedTurn(session_id, Api.V1, "msg_1", (), None, None, None)
        await turns.add(Waiting(turn, "/cwd", (), NOW, "unsafe", "1.x", NOW))
        await turns.take(session_id)
    assert len(turns._over) == 3
    with pytest.raises(Continued):
        await turns.take("ses_9")
    with pytest.raises(NotWaiting, match="no turn of this session waits"):
        await turns.take("ses_0")
