from __future__ import annotations

import dataclasses
import math

import pytest

from proxy.resume.decision import After, Before, Policy, after_settling, before_settling
from proxy.resume.last_turn import InterruptedCall, InterruptedTurn, LastTurn
from rules import Api

CALL = InterruptedCall("prt_1", "bash", {"command": "make"}, still_open=False)
TURN = InterruptedTurn("ses_1", Api.V1, "msg_2", (CALL,), "build", None, "msg_1")
POLICY = Policy(attempts=2, within_s=300)
BEFORE = Before(LastTurn(TURN, None), parent_id=None, waiting_on_person=None, age_s=10)
AFTER = After(BEFORE, active=False, elsewhere=None, used=0)


def test_a_settled_interrupted_turn_of_a_watched_session_is_resumed() -> None:
    assert before_settling(BEFORE, POLICY).go
    assert after_settling(AFTER, POLICY).go


def test_a_turn_the_stream_never_spoke_of_was_not_cut_by_the_last_crash() -> None:
    """A session idle before the crash (news of its title, an older interruption left settled)."""
    verdict = before_settling(dataclasses.replace(BEFORE, witnessed=False), POLICY)
    assert verdict.why is not None
    assert verdict.why.startswith("not cut by the last crash")


@pytest.mark.parametrize("within_s", [math.nan, -1.0])
def test_a_nonsense_bound_resumes_nothing(within_s: float) -> None:
    """The command line refuses these; a policy built another way must still resume nothing."""
    verdict = before_settling(BEFORE, Policy(attempts=2, within_s=within_s))
    assert verdict.why is not None
    assert "past --resume-within" in verdict.why


@pytest.mark.parametrize(
    ("before", "why"),
    [
        (dataclasses.replace(BEFORE, parent_id="ses_0"), "a child session (of ses_0)"),
        (dataclasses.replace(BEFORE, last=LastTurn(TURN, "msg_3")), "a newer message msg_3"),
        (dataclasses.replace(BEFORE, last=LastTurn(None, None)), "no interrupted turn"),
        (
            dataclasses.replace(BEFORE, waiting_on_person="a permission asked"),
            "waiting on a person (a permission",
        ),
        (dataclasses.replace(BEFORE, age_s=301), "past --resume-within 300 s"),
        (dataclasses.replace(BEFORE, age_s=math.nan), "past --resume-within 300 s"),
    ],
)
def test_what_needs_nothing_settled_to_be_known(before: Before, why: str) -> None:
    verdict = before_settling(before, POLICY)
    assert verdict.why is not None
    assert why in verdict.why
    assert after_settling(dataclasses.replace(AFTER, before=before), POLICY).why == verdict.why


def test_a_call_to_the_question_tool_waits_on_a_person() -> None:
    question = dataclasses.replace(CALL, tool="question")
    before = dataclasses.replace(BEFORE, last=LastTurn(dataclasses.replace(TURN, calls=(question,)), None))
    assert "waiting on a person (a question)" in str(before_settling(before, POLICY).why)


@pytest.mark.parametrize(
    ("after", "why"),
    [
        (dataclasses.replace(AFTER, active=True), "the session is running"),
        (
            dataclasses.replace(AFTER, elsewhere="pid 7"),
            "another process on the database may be running it: pid 7",
        ),
        (dataclasses.replace(AFTER, used=2), "2 prompt(s) sent for this turn already (--resume-attempts 2)"),
    ],
)
def test_what_only_the_reading_after_the_re_read_can_tell(after: After, why: str) -> None:
    assert why in str(after_settling(after, POLICY).why)


def test_a_call_still_open_after_the_write_back_is_never_resumed() -> None:
    still = dataclasses.replace(CALL, still_open=True)
    before = dataclasses.replace(BEFORE, last=LastTurn(dataclasses.replace(TURN, calls=(still,)), None))
    assert before_settling(before, POLICY).go
    verdict = after_settling(dataclasses.replace(AFTER, before=before), POLICY)
    assert "not settled in the server's storage: prt_1 still open" in str(verdict.why)


def test_the_budget_leaves_room_for_the_last_attempt() -> None:
    assert after_settling(dataclasses.replace(AFTER, used=1), POLICY).go
