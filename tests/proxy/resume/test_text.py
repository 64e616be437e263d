from __future__ import annotations

from proxy.resume.last_turn import InterruptedCall
from proxy.resume.text import ProcessFate, resume_text, shortened

BASH = InterruptedCall(
    "prt_1", "bash", {"command": "echo hello &&\n  sleep 600", "description": "demo"}, False
)
EDIT = InterruptedCall("prt_2", "edit", {"filePath": "/a.py", "oldString": "x"}, False)


def test_the_text_names_each_call_its_process_and_says_the_outcome_is_unknown() -> None:
    text = resume_text([BASH, EDIT], {"prt_1": ProcessFate.ENDED})
    assert "- bash: `echo hello && sleep 600` (its process was ended after the server stopped)" in text
    assert '- edit: `{"filePath": "/a.py", "oldString": "x"}`' in text
    assert "outcome is unknown" in text
    assert "without redoing work that is already finished" in text


def test_a_process_tool_with_no_known_fate_says_so() -> None:
    assert "(whether its process still runs is not known)" in resume_text([BASH], {})


def test_a_turn_cut_while_the_model_wrote_says_so() -> None:
    assert "while you were answering" in resume_text([], {})


def test_long_inputs_are_shortened_on_one_line() -> None:
    long = InterruptedCall("prt_3", "bash", {"command": "x" * 500}, False)
    cut = shortened(long)
    assert len(cut) == 160
    assert cut.endswith("…")
