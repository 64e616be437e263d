"""A session that moved on after the crash is never resumed: what a read finds newer than the
crash (another proxy's resume, a person's turn) was made since, even a turn already over by the
time the liveness reading is taken, which is then idle.

Seen in the integration suite (two proxies on one state database): the second proxy re-read the
session while the first one's resumed turn was still being written, took its reading once that
turn was over, and resumed the resumed turn as if the crash had cut it off."""

from __future__ import annotations

from typing import Any

from proxy.resume.candidates import Candidate
from proxy.resume.last_turn import last_turn
from rules import V1, Api
from tests.proxy.resume.test_resumer import NOW, FakeServer, SettlingWriter, considered, ledger, resumer
from tests.proxy.resume.views import v1_settled, v1_tool, v1_user, v1_view

__all__ = ["ledger"]

WITNESSED = Candidate("ses_1", Api.V1, "/work", NOW - 5, None, seen_message="msg_002")


def resumed_turn_being_written() -> dict[str, Any]:
    """The assistant message of a turn another proxy resumed, with no `time.completed` yet."""
    info = {"id": "msg_004", "role": "assistant", "sessionID": "ses_1", "time": {"created": 10}}
    return {"info": info, "parts": [{"id": "prt_9", "type": "step-start"}]}


MOVED_ON = v1_view(v1_settled("prt_1"), later=[v1_user("msg_003"), resumed_turn_being_written()])


def test_a_message_newer_than_the_stream_saw_before_the_crash_is_news_not_a_cut_off_turn() -> None:
    last = last_turn(MOVED_ON, V1, "ses_1", seen="msg_002")
    assert (last.turn, last.newer) == (None, "msg_004")
    unbounded = last_turn(MOVED_ON, V1, "ses_1")
    assert unbounded.turn is not None
    assert unbounded.turn.message_id == "msg_004"


def test_the_re_read_after_the_write_back_is_bounded_by_the_turn_it_settled() -> None:
    last = last_turn(MOVED_ON, V1, "ses_1", cut_off="msg_002")
    assert (last.turn, last.newer) == (None, "msg_004")


async def test_a_turn_resumed_elsewhere_while_this_one_settled_is_not_resumed_again(ledger: Any) -> None:
    server = FakeServer(ledger)
    server.view = v1_view(v1_tool("prt_1"))
    writer = SettlingWriter(server)
    server_after_write = MOVED_ON

    async def write_then_move_on(*args: Any, **kwargs: Any) -> Any:
        written = await SettlingWriter.write(writer, *args, **kwargs)
        server.view = server_after_write
        return written

    writer.write = write_then_move_on  # type: ignore[method-assign]
    made, journal = resumer(server, ledger, writer=writer)
    await considered(made, WITNESSED)
    assert server.prompts == []
    [decision] = journal.recent()
    assert decision["outcome"] == "skipped"
    assert decision["why"].startswith("a newer message msg_004 is in the session")


async def test_a_turn_resumed_elsewhere_before_the_first_read_is_not_resumed_again(ledger: Any) -> None:
    server = FakeServer(ledger)
    server.view = MOVED_ON
    made, journal = resumer(server, ledger, writer=SettlingWriter(server))
    await considered(made, WITNESSED)
    assert server.prompts == []
    assert journal.recent()[0]["why"].startswith("a newer message msg_004 is in the session")
