import pytest

from proxy.opencode.event_log import call_left_open
from proxy.opencode.vocabulary import event_name


def test_event_names_drop_the_storage_version() -> None:
    assert event_name("session.next.tool.called.1") == "session.next.tool.called"
    assert event_name("session.next.tool.called") == "session.next.tool.called"


@pytest.mark.parametrize(
    ("call_events", "prompts", "left_open"),
    [
        ([(4, "session.next.tool.input.started.1"), (6, "session.next.tool.called.1")], [1], True),
        ([(6, "session.next.tool.called"), (7, "session.next.tool.failed")], [1], False),
        ([(6, "session.next.tool.called.1"), (9, "session.next.tool.success.1")], [], False),
        ([(6, "session.next.tool.called.1")], [1, 8], False),
        ([], [], False),
    ],
)
def test_call_left_open(call_events: list[tuple[int, str]], prompts: list[int], left_open: bool) -> None:
    assert call_left_open(call_events, prompts) is left_open
