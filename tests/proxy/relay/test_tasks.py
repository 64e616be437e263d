"""Background work: one task per key, and an application's owners waited for as one."""

import asyncio

import pytest

from proxy.relay.tasks import Background, KeyedTasks, Together


async def test_a_key_whose_task_runs_starts_nothing_more() -> None:
    tasks: KeyedTasks[str] = KeyedTasks("test")
    release, runs = asyncio.Event(), []

    async def work() -> None:
        runs.append(1)
        await release.wait()

    tasks.start("a", work)
    tasks.start("a", work)
    await asyncio.sleep(0)  # the point: let the one task start
    assert tasks.busy
    release.set()
    await tasks.idle()
    assert not tasks.busy
    assert runs == [1]
    tasks.start("a", work)  # done, so the key is free again
    await tasks.idle()
    assert runs == [1, 1]


async def test_a_task_whose_work_returned_frees_its_key_before_its_callbacks_run() -> None:
    """A confirmation's last look for work asked for meanwhile comes just before it returns; a
    request handled after that, before the task's callbacks ran, must start anew."""
    tasks: KeyedTasks[str] = KeyedTasks("test")
    runs: list[str] = []
    started_again: list[bool] = []

    async def second() -> None:
        runs.append("second")

    async def first() -> None:
        runs.append("first")
        # Handled after this work returns and before the task's callbacks, as a stream event may be.
        asyncio.get_running_loop().call_soon(lambda: started_again.append(tasks.start("a", second)))

    tasks.start("a", first)
    await tasks.idle()
    assert started_again == [True]
    assert runs == ["first", "second"]
    assert not tasks.busy


async def test_work_that_dies_on_a_fault_says_so(caplog: pytest.LogCaptureFixture) -> None:
    tasks: KeyedTasks[str] = KeyedTasks("confirmation")

    async def faulty() -> None:
        raise KeyError("unforeseen")

    tasks.start("ses_a", faulty)
    await tasks.idle()
    assert "confirmation of ses_a failed: KeyError('unforeseen')" in caplog.text


async def test_close_cancels_what_has_not_finished() -> None:
    tasks: KeyedTasks[str] = KeyedTasks("test")

    async def forever() -> None:
        await asyncio.Event().wait()

    tasks.start("a", forever)
    await tasks.close()
    await tasks.idle()
    assert not tasks.busy


async def test_background_waits_until_no_owner_is_busy_even_when_one_starts_anothers_work() -> None:
    first: KeyedTasks[str] = KeyedTasks("first")
    second: KeyedTasks[str] = KeyedTasks("second")
    done = []

    async def write() -> None:
        done.append("written")

    async def confirm() -> None:
        second.start("s", write)  # a confirmation that schedules a write

    background = Background()
    background.add(second)
    background.add(first)
    first.start("s", confirm)
    await background.idle()
    assert done == ["written"]
    assert not background.busy


async def test_together_is_busy_idle_and_closed_as_its_parts_are() -> None:
    """An owner made of parts: waiting covers work one part starts in another, and closing
    cancels what every part still runs."""
    first: KeyedTasks[str] = KeyedTasks("first")
    second: KeyedTasks[str] = KeyedTasks("second")
    together = Together(second, first)
    done = []

    async def write() -> None:
        done.append("written")

    async def confirm() -> None:
        second.start("s", write)

    async def forever() -> None:
        await asyncio.Event().wait()

    first.start("s", confirm)
    assert together.busy
    await together.idle()
    assert (done, together.busy) == (["written"], False)
    first.start("a", forever)
    second.start("b", forever)
    await together.close()
    assert not together.busy
