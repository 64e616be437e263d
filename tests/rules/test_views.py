"""`settle_view`: the I/O-free entry point for a parsed body."""

import pytest

from rules import Api, Liveness, UnexpectedShape, settle_view
from tests.fixtures import load

INACTIVE = Liveness("ses_x", active=False)


def test_v2_list_view() -> None:
    document = load("v2-message-stale-running.json")
    view = settle_view(document, Api.V2, INACTIVE)
    assert view is not None
    assert view.messages.settled_parts == 1
    assert view.document["cursor"] == document["cursor"]
    assert view.document["data"][1] is document["data"][1]
    assert document["data"][0]["content"][0]["state"]["status"] == "running", "the input is not modified"
    ((index, settlement),) = view.messages.settled
    assert index == 0
    targets = [change.target for change in settlement.changes]
    assert [(t.message, t.part, t.call, t.tool) for t in targets] == [
        ("msg_22942f8cd001S0O0R7RZWGCalD", "call_mock_1", "call_mock_1", "bash"),
        ("msg_22942f8cd001S0O0R7RZWGCalD", None, None, None),
    ]


def test_v1_single_view() -> None:
    message = load("v1-message-stale-running.json")[1]
    view = settle_view(message, Api.V1, INACTIVE, single=True)
    assert view is not None
    assert view.document["parts"][1]["state"]["status"] == "error"


def test_nothing_to_settle_and_wrong_shapes() -> None:
    assert settle_view(load("v2-message-interrupted.json"), Api.V2, INACTIVE) is None
    assert settle_view(load("v2-message-stale-running.json"), Api.V2, Liveness("s", active=True)) is None
    with pytest.raises(UnexpectedShape):
        settle_view([], Api.V2, INACTIVE)
    with pytest.raises(UnexpectedShape):
        settle_view({"data": []}, Api.V1, INACTIVE)


def test_what_changed_is_summed_up_once_with_the_changes() -> None:
    view = settle_view(load("v2-message-stale-running.json"), Api.V2, INACTIVE)
    assert view is not None
    assert view.messages.rules == ("orphaned-tool", "unfinished-message")
    assert view.messages.settled_parts == 1
    assert view.messages.changes is view.messages.changes, "gathered once, not on each ask"
