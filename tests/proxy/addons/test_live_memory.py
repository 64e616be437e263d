"""What live settle remembers from the followed stream: open v1 parts, busy sessions, unfinished messages."""

from typing import Any

import pytest

from proxy.addons.live import memory as live_memory
from proxy.addons.live.memory import StreamMemory
from proxy.opencode.tracker import FollowedEvent
from rules import Api, OpenTool


def event(kind: str, **properties: Any) -> FollowedEvent:
    return FollowedEvent("/cwd", "prj", kind, properties)


def part(part_id: str, status: str, session: str = "ses_a") -> FollowedEvent:
    body = {
        "id": part_id,
        "sessionID": session,
        "messageID": "msg_1",
        "type": "tool",
        "state": {"status": status},
    }
    return event("message.part.updated", sessionID=session, part=body)


def assistant(message_id: str, *, completed: bool, session: str = "ses_a") -> FollowedEvent:
    time = {"created": 1, "completed": 2} if completed else {"created": 1}
    info = {"id": message_id, "sessionID": session, "role": "assistant", "time": time}
    return event("message.updated", sessionID=session, info=info)


def test_a_running_part_is_remembered_until_it_ends() -> None:
    memory = StreamMemory()
    assert memory.observe(part("prt_1", "running")) is None
    expected = OpenTool(Api.V1, "ses_a", "msg_1", "prt_1", None, directory="/cwd", project="prj")
    assert memory.open_parts("ses_a") == [expected]
    memory.observe(part("prt_1", "completed"))
    assert not memory.has_open("ses_a")


@pytest.mark.parametrize("idle", [{"status": {"type": "idle"}}, {}])
def test_a_session_going_idle_with_a_part_open_is_named(idle: dict[str, Any]) -> None:
    memory = StreamMemory()
    memory.observe(part("prt_1", "running"))
    kind = "session.status" if idle else "session.idle"
    assert memory.observe(event(kind, sessionID="ses_a", **idle)) == "ses_a"
    assert memory.observe(event(kind, sessionID="ses_b", **idle)) is None


def test_busy_sessions_and_unfinished_messages_are_turns() -> None:
    memory = StreamMemory()
    memory.observe(event("session.status", sessionID="ses_a", status={"type": "busy"}))
    memory.observe(assistant("msg_2", completed=False, session="ses_b"))
    assert memory.sessions_with_turns() == {"ses_a", "ses_b"}
    memory.observe(event("session.status", sessionID="ses_a", status={"type": "idle"}))
    memory.observe(assistant("msg_2", completed=True, session="ses_b"))
    assert memory.sessions_with_turns() == set()


def test_what_is_not_a_tool_or_an_assistant_message_is_ignored() -> None:
    memory = StreamMemory()
    memory.observe(event("message.part.updated", sessionID="ses_a", part={"id": "prt_t", "type": "text"}))
    memory.observe(
        event("message.updated", sessionID="ses_a", info={"id": "msg_u", "role": "user", "time": {}})
    )
    assert (len(memory.parts), len(memory.unfinished)) == (0, 0)


def test_the_oldest_entry_is_forgotten_beyond_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live_memory, "REMEMBERED", 2)
    memory = StreamMemory()
    for number in range(5):
        memory.observe(part(f"prt_{number}", "running", session=f"ses_{number}"))
        memory.observe(event("session.status", sessionID=f"ses_{number}", status={"type": "busy"}))
        memory.observe(assistant(f"msg_{number}", completed=False, session=f"ses_{number}"))
    assert list(memory.parts) == ["prt_3", "prt_4"]
    assert list(memory.busy) == ["ses_3", "ses_4"]
    assert list(memory.unfinished) == ["msg_3", "msg_4"]
