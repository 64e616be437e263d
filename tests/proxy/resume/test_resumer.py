"""The resume sequence with an in-process server: settle first, claim once, record before each
prompt, confirm the start, retry within the budget, and say every decision."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from proxy.opencode.client import Credentials, UpstreamRefused
from proxy.opencode.dialects import LINE_1_18
from proxy.resume.admission import Admission
from proxy.resume.candidates import Candidate
from proxy.resume.decision import Policy
from proxy.resume.journal import Journal
from proxy.resume.last_turn import InterruptedTurn
from proxy.resume.ledger import Ledger
from proxy.resume.resumer import SETTLE_ATTEMPTS, Records, ResumeOptions, Resumer
from proxy.writeback.modes import WriteBackMode
from proxy.writeback.scheduler import Confirm, Written
from rules import Api, Liveness, Runtime
from tests.proxy.resume.views import v1_settled, v1_tool, v1_user, v1_view

NOW = 1000.0


class FakeServer:
    dialect = LINE_1_18

    def __init__(self, ledger: Ledger, *, starts_after: int = 1) -> None:
        self.view: Any = v1_view(v1_settled("prt_1"))
        self.info: dict[str, Any] = {"directory": "/work"}
        self.prompts: list[tuple[str, str, int]] = []
        self.prompted: list[str] = []
        self._ledger = ledger
        self._starts_after = starts_after
        self.unreadable = False
        self.failures: list[Exception] = []
        """What the next reads of the messages raise, one each, before they answer."""
        self.ready_after_start: bool = True
        self.person_writes = False
        self.then: Any = None
        """The view every read after the next one gets (another writer changed the session)."""
        self._asked_ready = 0
        self.itself: str | None = None
        """Why the server continues interrupted turns itself (`serve --service`), if it does."""

    def rules(self, turn_api: Api) -> Runtime[Any]:
        return LINE_1_18.runtimes[turn_api].rules

    async def messages(self, turn_api: Api, session_id: str) -> Any:
        if self.unreadable:
            raise UpstreamRefused("GET", "/session/ses_1/message", 500, b"")
        if self.failures:
            raise self.failures.pop(0)
        view = self.view
        if self.then is not None:
            self.view, self.then = self.then, None
        return view

    async def session_info(self, turn_api: Api, session_id: str) -> dict[str, Any]:
        return self.info

    async def waiting_on_person(self, session_id: str) -> str | None:
        return None

    async def resumes_itself(self) -> str | None:
        return self.itself

    def heard(self, view: Any, session_id: str, since: str | None) -> None:
        pass

    async def ready(self, directory: str | None, provider: str | None) -> str | None:
        self._asked_ready += 1
        ready = self._asked_ready == 1 or self.ready_after_start
        return None if ready else "asked for 60 s; last, GET /config: HTTP 503 (ServiceUnavailableError)"

    async def prompt(self, turn: InterruptedTurn, directory: str | None, prompt_id: str, text: str) -> None:
        recorded = await self._ledger.used(turn.session_id, prompt_id, "msg_next")
        self.prompts.append((prompt_id, text, recorded))
        self.prompted.append(turn.session_id)
        if self.person_writes:
            self.view = [*self.view, v1_user("msg_zzz")]

    async def started(self, turn: InterruptedTurn, prompt_id: str) -> str | None:
        return "the session went active" if len(self.prompts) >= self._starts_after else None


class FakeProbe:
    active = False

    async def read(self, api: Api, session_id: str, credentials: Credentials) -> Liveness:
        return Liveness(session_id, self.active, taken_at=10_000)


class SettlingWriter:
    def __init__(self, server: FakeServer, *, settles: bool = True, vouched_after: int = 1) -> None:
        self.server = server
        self.settles = settles
        self.vouched_after = vouched_after
        """The write that first finds a reading vouching for the call (earlier ones: too fresh)."""
        self.targets: list[Collection[str]] = []

    @property
    def mode(self) -> WriteBackMode:
        return WriteBackMode.API

    async def write(
        self, api: Api, session_id: str, credentials: Credentials, targets: Collection[str], confirm: Confirm
    ) -> list[Written]:
        self.targets.append(targets)
        assert not (await confirm()).active
        if not self.settles or len(self.targets) < self.vouched_after:
            return []
        self.server.view = v1_view(v1_settled("prt_1"))
        return [Written(api, session_id, "msg_002", "prt_1", "orphaned-tool")]


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[Ledger]:
    async with Ledger.open(tmp_path / "processes.db") as opened:
        yield opened


def resumer(
    server: FakeServer,
    ledger: Ledger,
    *,
    writer: SettlingWriter | None = None,
    dry_run: bool = False,
    attempts: int = 3,
    text: str | None = None,
    probe: FakeProbe | None = None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    admission: Admission | None = None,
) -> tuple[Resumer, Journal]:
    journal = Journal(CollectorRegistry(), enabled=True, dry_run=dry_run)
    options = ResumeOptions(
        Policy(attempts, 300), grace=0, dry_run=dry_run, text=text, retry_pause=0, settle_pause=0
    )
    made = Resumer(
        server,
        probe or FakeProbe(),
        Records(ledger, journal),
        options,
        writer=writer,
        credentials=Credentials(),
        clock=lambda: NOW,
        sleep=sleep or no_pause,
        admission=admission,
    )
    return made, journal


def counted(pauses: list[float]) -> Callable[[float], Awaitable[None]]:
    """A pause that only notes how long it would be."""

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    return pause


async def no_pause(seconds: float) -> None:
    """No wall-clock wait: the pauses between reads are only counted (the clock stands still)."""
    del seconds


CANDIDATE = Candidate("ses_1", Api.V1, "/work", NOW - 5, None, seen_message="msg_002")


async def considered(made: Resumer, candidate: Candidate = CANDIDATE) -> None:
    made.consider(candidate)
    await made.tasks.idle()


async def test_an_open_call_is_written_back_before_the_prompt_that_names_it(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    server = FakeServer(ledger)
    server.view = v1_view(v1_tool("prt_1"))
    writer = SettlingWriter(server)
    made, journal = resumer(server, ledger, writer=writer)
    await considered(made)
    assert [set(t) for t in writer.targets] == [{"prt_1", "msg_002"}]
    assert (
        "wrote back before resuming mode=api api=v1 session=ses_1 message=msg_002 part=prt_1" in caplog.text
    )
    [(prompt_id, text, recorded)] = server.prompts
    assert recorded == 1, "the attempt is committed before the prompt is sent"
    assert "- bash: `echo hello && sleep 600`" in text
    [decision] = journal.recent()
    assert (decision["outcome"], decision["prompt"], decision["attempt"]) == ("resumed", prompt_id, 1)


async def test_a_call_the_write_back_could_not_settle_is_never_resumed(ledger: Ledger) -> None:
    server = FakeServer(ledger)
    server.view = v1_view(v1_tool("prt_1"))
    writer = SettlingWriter(server, settles=False)
    made, journal = resumer(server, ledger, writer=writer)
    await considered(made)
    assert server.prompts == []
    assert len(writer.targets) == SETTLE_ATTEMPTS, "written again after a pause before it is given up"
    assert "prt_1 still open when re-read" in journal.recent()[0]["why"]


async def test_a_call_too_fresh_for_the_first_write_back_is_written_again_and_resumed(ledger: Ledger) -> None:
    """Last alive within the freshness margin of the first reading (a restart that took under 2 s),
    the call is left open by the first write-back: the next one, after a pause, settles it."""
    server = FakeServer(ledger)
    server.view = v1_view(v1_tool("prt_1"))
    writer = SettlingWriter(server, vouched_after=2)
    made, journal = resumer(server, ledger, writer=writer)
    await considered(made)
    assert len(writer.targets) == 2
    assert len(server.prompts) == 1
    assert journal.recent()[0]["outcome"] == "resumed"


async def test_a_turn_that_does_not_start_is_tried_again_within_the_budget(ledger: Ledger) -> None:
    server = FakeServer(ledger, starts_after=2)
    made, journal = resumer(server, ledger)
    await considered(made)
    assert [recorded for _, _, recorded in server.prompts] == [1, 2]
    assert [d["outcome"] for d in journal.recent()] == ["not-started", "resumed"]
    assert journal.resumes.labels("not-started")._value.get() == 1


async def test_a_turn_that_never_starts_is_given_up_when_the_budget_is_spent(ledger: Ledger) -> None:
    server = FakeServer(ledger, starts_after=99)
    made, journal = resumer(server, ledger, attempts=2)
    await considered(made)
    assert len(server.prompts) == 2
    outcomes = [d["outcome"] for d in journal.recent()]
    assert outcomes == ["not-started", "gave-up"]
    assert "2 of --resume-attempts 2 spent" in journal.recent()[-1]["why"]


async def test_a_turn_is_resumed_once_however_often_it_is_handed_on(ledger: Ledger) -> None:
    server = FakeServer(ledger)
    made, journal = resumer(server, ledger)
    await considered(made)
    await considered(made)
    assert len(server.prompts) == 1
    assert journal.recent()[-1]["why"].startswith("already claimed, by ")


async def test_a_dry_run_decides_and_neither_claims_nor_sends(ledger: Ledger) -> None:
    server = FakeServer(ledger)
    server.view = v1_view(v1_tool("prt_1"))
    writer = SettlingWriter(server)
    made, journal = resumer(server, ledger, writer=writer, dry_run=True)
    await considered(made)
    assert (server.prompts, writer.targets) == ([], [])
    assert journal.recent()[0]["outcome"] == "would-resume"
    assert (await ledger.claim("ses_1", "msg_001", "msg_002")).won


async def test_a_server_that_cannot_be_read_is_a_skip_with_the_reason(ledger: Ledger) -> None:
    server = FakeServer(ledger)
    server.unreadable = True
    made, journal = resumer(server, ledger)
    await considered(made)
    assert journal.recent()[0]["why"].startswith("the server could not be read in 7 tries over 31.5 s: GET")


async def test_a_read_that_times_out_then_answers_is_resumed_once(ledger: Ledger) -> None:
    server = FakeServer(ledger)
    server.failures = [TimeoutError(), UpstreamRefused("GET", "/session/ses_1/message", 503, b"")]
    pauses: list[float] = []
    made, journal = resumer(server, ledger, sleep=counted(pauses))
    await considered(made)
    assert pauses == [0.5, 1.0]
    assert len(server.prompts) == 1
    assert [d["outcome"] for d in journal.recent()] == ["resumed"]


async def test_a_read_the_server_refuses_for_good_is_a_skip_at_once(ledger: Ledger) -> None:
    server = FakeServer(ledger)
    server.failures = [UpstreamRefused("GET", "/session/ses_1/message", 404, b'{"name":"NotFoundError"}')]
    pauses: list[float] = []
    made, journal = resumer(server, ledger, sleep=counted(pauses))
    await considered(made)
    assert (pauses, server.prompts) == ([], [])
    assert journal.recent()[0]["why"].startswith(
        "the server could not be read: GET /session/ses_1/message: HTTP 404"
    )


async def test_a_person_who_writes_between_two_tries_is_not_prompted_over(ledger: Ledger) -> None:
    server = FakeServer(ledger)
    server.failures = [TimeoutError()]

    async def person_writes(seconds: float) -> None:
        del seconds
        server.view = [*server.view, v1_user("msg_zzz")]

    made, journal = resumer(server, ledger, sleep=person_writes)
    await considered(made)
    assert server.prompts == []
    assert journal.recent()[0]["why"].startswith("a newer message msg_zzz is in the session")


async def test_a_turn_whose_read_failed_gives_its_place_to_the_next_in_line(ledger: Ledger) -> None:
    """One continuation at a time: the first in line fails a read, and the second goes first."""
    server = FakeServer(ledger)
    server.failures = [TimeoutError()]
    second = Candidate("ses_2", Api.V1, "/work", NOW - 5, None, seen_message="msg_002")
    made, _ = resumer(server, ledger, sleep=lambda _: asyncio.sleep(0.05), admission=Admission(1, 0))
    made.consider(CANDIDATE)
    made.consider(second)
    await made.tasks.idle()
    assert server.prompted == ["ses_2", "ses_1"]


async def test_a_child_session_is_left_to_its_parent(ledger: Ledger) -> None:
    server = FakeServer(ledger)
    server.info = {"directory": "/work", "parentID": "ses_0"}
    made, journal = resumer(server, ledger)
    await considered(made)
    assert server.prompts == []
    assert journal.recent()[0]["why"].startswith("a child session (of ses_0)")


async def test_a_server_that_never_becomes_ready_is_given_up_within_the_budget(ledger: Ledger) -> None:
    server = FakeServer(ledger)
    server.ready_after_start = False
    made, journal = resumer(server, ledger, attempts=2)
    await considered(made)
    assert server.prompts == []
    assert [d["outcome"] for d in journal.recent()] == ["not-started", "gave-up"]
    assert "0 of --resume-attempts 2 spent" in journal.recent()[-1]["why"]


async def test_a_person_who_writes_after_a_prompt_that_did_not_start_is_not_prompted_over(
    ledger: Ledger,
) -> None:
    server = FakeServer(ledger, starts_after=99)
    server.person_writes = True
    made, journal = resumer(server, ledger)
    await considered(made)
    assert len(server.prompts) == 1
    assert journal.recent()[-1]["why"] == "a person wrote (msg_zzz) after the prompt that did not start"


async def test_a_turn_cut_while_the_model_wrote_is_resumed_though_a_write_back_closed_it(
    ledger: Ledger,
) -> None:
    server = FakeServer(ledger)
    server.view = v1_view({"id": "prt_2", "type": "text", "text": ""})
    server.then = v1_view({"id": "prt_2", "type": "text", "text": ""}, completed=True)
    made, journal = resumer(server, ledger)
    await considered(made)
    [(_, text, _)] = server.prompts
    assert "while you were answering" in text
    assert journal.recent()[0]["outcome"] == "resumed"


async def test_resume_text_replaces_the_prompt(ledger: Ledger) -> None:
    server = FakeServer(ledger)
    made, _ = resumer(server, ledger, text="carry on, carefully")
    await considered(made)
    assert [text for _, text, _ in server.prompts] == ["carry on, carefully"]


async def test_a_server_that_resumes_turns_itself_is_left_to_it(ledger: Ledger) -> None:
    """`serve --service` continues every interrupted turn at boot: a prompt of the proxy's would be
    a second continuation, so none is sent, and the one decision line says why."""
    server = FakeServer(ledger)
    server.view = v1_view(v1_tool("prt_1"))
    server.itself = "its command line says so (pid 7: serve --service)"
    writer = SettlingWriter(server)
    made, journal = resumer(server, ledger, writer=writer)
    await considered(made)
    assert server.prompts == []
    assert writer.targets == [], "nothing written for a turn the server continues"
    [decision] = journal.recent()
    assert decision["outcome"] == "skipped"
    assert decision["why"].startswith("the server resumes interrupted turns itself, left to it: its command")
