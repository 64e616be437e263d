"""Which events a client stream that came back missed: those the server made before it took the
client's stream (a smaller id than the stream's `server.connected`)."""

from __future__ import annotations

import pytest

from proxy.addons.live.catch_up import CatchUp, connected_id
from proxy.opencode.followed_events import FollowedEvent


@pytest.mark.parametrize(
    ("first", "expected"),
    [
        (b'data: {"payload":{"id":"evt_2","type":"server.connected","properties":{}}}\n\n', "evt_2"),
        (b'data: {"id":"evt_3","type":"server.connected","properties":{}}\n\n', "evt_3"),
        (b': comment\ndata: {"id":"evt_4","type":"server.connected","properties":{}}\n\n', "evt_4"),
        (b'data: {"id":"evt_5","type":"session.idle","properties":{}}\n\n', None),
        (b"data: {not json\n\n", None),
        (b'data: {"type":"server.connected","properties":{}}\n\n', None),
    ],
    ids=["global", "instance", "after a comment", "another event", "unreadable", "no id"],
)
def test_the_first_event_names_where_the_server_took_the_stream(first: bytes, expected: str | None) -> None:
    assert connected_id(first) == expected


def event(event_id: str | None) -> FollowedEvent:
    return FollowedEvent("/cwd", None, "session.status", {"sessionID": "ses_1"}, id=event_id)


def test_what_was_read_before_the_first_event_and_made_before_it_was_missed() -> None:
    catch_up = CatchUp("/global/event")
    assert catch_up.hear(event("evt_1")) == []  # kept until the client's first event passes
    assert catch_up.hear(event("evt_3")) == []
    missed = catch_up.opened(b'data: {"id":"evt_2","type":"server.connected","properties":{}}\n\n')
    assert [e.id for e in missed] == ["evt_1"]
    assert catch_up.over.is_set()


def test_the_catch_up_ends_at_the_first_event_the_client_has_or_one_without_an_id() -> None:
    catch_up = CatchUp("/event")
    assert catch_up.opened(b'data: {"id":"evt_5","type":"server.connected","properties":{}}\n\n') == []
    assert [e.id for e in catch_up.hear(event("evt_4"))] == ["evt_4"]
    assert not catch_up.over.is_set()
    assert catch_up.hear(event(None)) == []
    assert catch_up.over.is_set()


def test_a_stream_that_does_not_open_with_server_connected_is_not_caught_up() -> None:
    catch_up = CatchUp("/event")
    catch_up.hear(event("evt_1"))
    assert catch_up.opened(b'data: {"id":"evt_5","type":"session.idle","properties":{}}\n\n') == []
    assert catch_up.over.is_set()
