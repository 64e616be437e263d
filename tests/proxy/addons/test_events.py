"""Events the addons tell client streams: opencode's shape, framed as opencode frames its own."""

import re

import orjson

from proxy.addons.live.clients import event_frame
from proxy.opencode.vocabulary import opencode_event


def test_an_event_has_opencodes_shape_and_a_fresh_ascending_id() -> None:
    first = opencode_event("session.idle", {"sessionID": "ses_1"})
    second = opencode_event("session.idle", {"sessionID": "ses_1"})
    assert re.fullmatch(r"evt_[0-9a-f]{12}[0-9A-Za-z]{14}", str(first["id"]))
    assert {key: value for key, value in first.items() if key != "id"} == {
        "type": "session.idle",
        "properties": {"sessionID": "ses_1"},
    }
    assert str(second["id"]) > str(first["id"])


def test_a_frame_is_one_data_line_of_compact_json_and_a_blank_line() -> None:
    envelope = {"directory": "/d", "payload": {"type": "x", "text": "two\nlines"}}
    frame = event_frame(envelope)
    assert frame == b"data: " + orjson.dumps(envelope) + b"\n\n"
    assert frame.count(b"\n") == 2  # a newline in a value stays escaped inside the one line
