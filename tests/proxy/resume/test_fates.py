"""What the resume tells the model became of an interrupted call's process, from values only."""

from collections.abc import Mapping

from proxy.resume.text import ProcessFate, process_fates


async def left_running() -> Mapping[str, bool]:
    return {"call_running": True, "call_completed": False}


async def test_left_running_processes_are_ended_only_for_calls_running_at_the_crash_when_ending() -> None:
    fates = process_fates(left_running, ending=True, tied={"call_tied"}.__contains__)
    found = await fates(["call_running", "call_completed", "call_tied", "call_unknown"])
    assert found == {
        "call_running": ProcessFate.ENDED,
        "call_completed": ProcessFate.LEFT_RUNNING,
        "call_tied": ProcessFate.ENDED,
    }


async def test_reporting_only_leaves_them_running_and_a_tied_one_gone() -> None:
    fates = process_fates(left_running, tied={"call_tied"}.__contains__)
    found = await fates(["call_running", "call_tied"])
    assert found == {"call_running": ProcessFate.LEFT_RUNNING, "call_tied": ProcessFate.GONE}


async def test_without_a_subreaper_nothing_is_known_of_a_call_no_process_is_left_of() -> None:
    assert await process_fates(left_running)(["call_tied"]) == {}
