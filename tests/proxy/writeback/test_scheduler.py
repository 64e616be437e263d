"""The write-back scheduler: after the grace period, one write per session with every id named
meanwhile, resting on a reading the writer takes; a failing write is logged, never raised."""

import asyncio
from collections.abc import Collection

import pytest

from proxy.opencode.client import Credentials, UpstreamApi
from proxy.opencode.liveness import LivenessProbe
from proxy.writeback import decisions
from proxy.writeback.modes import WriteBackMode
from proxy.writeback.scheduler import Confirm, WriteBack, WriteBackOutcome, Written
from rules import Api, Liveness
from tests.proxy.fake_opencode import FakeOpencode

V2 = "ses_v2"


class Recording:
    """A writer that takes the reading, records what it was asked to write, and writes it all
    unless the reading finds the session active."""

    def __init__(self, *, fails: bool = False) -> None:
        self.calls: list[tuple[str, set[str], Liveness | None]] = []
        self._fails = fails

    @property
    def mode(self) -> WriteBackMode:
        return WriteBackMode.API

    async def write(
        self, api: Api, session_id: str, credentials: Credentials, targets: Collection[str], confirm: Confirm
    ) -> list[Written]:
        liveness = None
        try:
            liveness = await confirm()
        finally:
            self.calls.append((session_id, set(targets), liveness))
        if self._fails:
            raise RuntimeError("disk full")
        if liveness is None or liveness.active:
            return []
        return [Written(api, session_id, "msg_1", target, "orphaned-tool") for target in targets]


@pytest.fixture
def probe(upstream_api: UpstreamApi) -> LivenessProbe:
    return LivenessProbe(upstream_api)


async def test_ids_named_while_a_write_is_pending_join_it(probe: LivenessProbe) -> None:
    writer = Recording()
    write_back = WriteBack(probe, writer, grace=0.01)
    write_back.schedule(Api.V2, V2, Credentials(), {"call_1"})
    write_back.schedule(Api.V2, V2, Credentials(), {"call_2"})
    assert write_back.tasks.busy
    await write_back.tasks.idle()
    ((session, targets, liveness),) = writer.calls
    assert (session, targets) == (V2, {"call_1", "call_2"})
    assert liveness is not None
    assert not liveness.active


async def test_an_active_session_is_read_as_such(probe: LivenessProbe, fake: FakeOpencode) -> None:
    fake.v2_active.add(V2)
    writer = Recording()
    write_back = WriteBack(probe, writer, grace=0)
    write_back.schedule(Api.V2, V2, Credentials(), {"call_1"})
    await write_back.tasks.idle()
    ((_, _, liveness),) = writer.calls
    assert liveness is not None
    assert liveness.active


@pytest.mark.parametrize("liveness_fails", [False, True])
async def test_a_failed_write_or_reading_is_logged_not_raised(
    probe: LivenessProbe, fake: FakeOpencode, caplog: pytest.LogCaptureFixture, liveness_fails: bool
) -> None:
    fake.liveness_fails = liveness_fails
    write_back = WriteBack(probe, Recording(fails=True), grace=0)
    write_back.schedule(Api.V2, V2, Credentials(), {"call_1"})
    await write_back.tasks.idle()
    expected = "liveness unknown" if liveness_fails else "failed (mode=api); nothing half-written"
    assert expected in caplog.text


async def test_close_cancels_an_unconfirmed_write(probe: LivenessProbe) -> None:
    writer = Recording()
    write_back = WriteBack(probe, writer, grace=60)
    write_back.schedule(Api.V2, V2, Credentials(), {"call_1"})
    await write_back.close()
    assert writer.calls == []
    assert not write_back.tasks.busy


class Held(Recording):
    """A recording writer whose first write waits until `release` is set: a pass held in its write."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = asyncio.Event()
        self.release = asyncio.Event()

    async def write(
        self, api: Api, session_id: str, credentials: Credentials, targets: Collection[str], confirm: Confirm
    ) -> list[Written]:
        if not self.writing.is_set():
            self.writing.set()
            await self.release.wait()
        return await super().write(api, session_id, credentials, targets, confirm)


async def test_ids_named_while_a_pass_writes_get_a_pass_of_their_own(probe: LivenessProbe) -> None:
    """The pass under way has taken its batch: a later id is written by a second pass, without
    any further fetch naming it."""
    writer = Held()
    write_back = WriteBack(probe, writer, grace=0.01)
    write_back.schedule(Api.V2, V2, Credentials(), {"call_1"})
    await asyncio.wait_for(writer.writing.wait(), 5)
    write_back.schedule(Api.V2, V2, Credentials(), {"call_2"})
    writer.release.set()
    outcomes = await asyncio.wait_for(write_back.settled(Api.V2, V2, {"call_1", "call_2"}), 5)
    assert [targets for _, targets, _ in writer.calls] == [{"call_1"}, {"call_2"}]
    assert outcomes == {"call_1": WriteBackOutcome.WRITTEN, "call_2": WriteBackOutcome.WRITTEN}


async def test_settled_waits_for_the_pass_and_says_how_each_id_ended(
    probe: LivenessProbe, fake: FakeOpencode
) -> None:
    fake.v2_active.add(V2)
    write_back = WriteBack(probe, Recording(), grace=0.01)
    assert await write_back.settled(Api.V2, V2, {"call_1"}) == {"call_1": WriteBackOutcome.UNKNOWN}
    write_back.schedule(Api.V2, V2, Credentials(), {"call_1"})
    assert await asyncio.wait_for(write_back.settled(Api.V2, V2, {"call_1"}), 5) == {
        "call_1": WriteBackOutcome.SKIPPED
    }


async def test_close_ends_a_wait_on_an_unwritten_id(probe: LivenessProbe) -> None:
    write_back = WriteBack(probe, Recording(), grace=60)
    write_back.schedule(Api.V2, V2, Credentials(), {"call_1"})
    waiting = asyncio.create_task(write_back.settled(Api.V2, V2, {"call_1"}))
    await write_back.close()
    assert await asyncio.wait_for(waiting, 5) == {"call_1": WriteBackOutcome.SKIPPED}


async def test_only_the_latest_outcomes_are_remembered(
    probe: LivenessProbe, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decisions, "OUTCOMES_KEPT", 2)
    write_back = WriteBack(probe, Recording(), grace=0)
    write_back.schedule(Api.V2, V2, Credentials(), {"call_1", "call_2", "call_3"})
    await write_back.tasks.idle()
    found = await write_back.settled(Api.V2, V2, {"call_1", "call_2", "call_3"})
    assert sorted(found.values()) == sorted(
        [WriteBackOutcome.UNKNOWN, WriteBackOutcome.WRITTEN, WriteBackOutcome.WRITTEN]
    )
