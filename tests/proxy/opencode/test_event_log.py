import msgspec
import pytest

from proxy.opencode.event_log import LogRow, call_left_open, log_rows
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


def test_history_rows_keep_only_what_the_log_is_read_for() -> None:
    """Every other session's history comes along (1.18.33); its data is skipped, not decoded."""
    body = (
        b'[{"id":"evt_1","aggregate_id":"ses_a","seq":0,"type":"session.created.1",'
        b'"data":{"sessionID":"ses_a","info":{"title":"x","tokens":{"input":1}}}},'
        b'{"id":"evt_2","aggregate_id":"ses_b","seq":4,"type":"session.next.tool.called.1",'
        b'"data":{"callID":"call_1","input":{"command":"sleep 9"},"extra":[1,2,3]}}]'
    )
    rows = log_rows(body)
    assert rows == [
        LogRow("ses_a", 0, "session.created.1"),
        LogRow(
            "ses_b",
            4,
            "session.next.tool.called.1",
            msgspec.convert({"callID": "call_1"}, type(rows[1].data)),
        ),
    ]
    assert [row.call for row in rows] == [None, "call_1"]


@pytest.mark.parametrize("body", [b'{"data":[]}', b'[{"aggregate_id":"ses_a","type":"x"}]', b"[{"])
def test_history_of_another_shape_is_refused(body: bytes) -> None:
    with pytest.raises(msgspec.DecodeError):
        log_rows(body)
