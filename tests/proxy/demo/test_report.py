"""The demo's report: the call directly and through the proxy, side by side, one row per client."""

from __future__ import annotations

from proxy.demo.lines import Call, Line1x, Line2x
from proxy.demo.report import report
from proxy.demo.scene import Installed, Outcome, Seen

RUNNING = Call("prt_1", "running")
ABORTED = Call("prt_1", "error", "Tool execution aborted")


def test_the_two_columns_show_running_directly_and_interrupted_through_the_proxy() -> None:
    outcome = Outcome(
        Installed("/bin/opencode", "1.18.33", Line1x()),
        directly=Seen(view=RUNNING, told=None, before=RUNNING),
        proxied=Seen(view=ABORTED, told=ABORTED, before=RUNNING),
        left_behind=1,
    )
    lines = report(outcome).splitlines()
    assert lines[:5] == [
        "opencode 1.18.33, its `bash` call after a SIGKILL and a restart:",
        "",
        "              directly                           through settle-proxy",
        "message view  running                            error: Tool execution aborted",
        "event stream  running (nothing since the crash)  error: Tool execution aborted",
    ]
    text = " ".join(lines[5:])
    assert "stays running for good" in text
    assert "`/global/event`" in text
    assert "`message.part.updated`" in text
    assert "The crash left 1 process running, as a real one does: the demo ended it." in text
    assert max(len(line) for line in lines) <= 88


def test_on_2x_the_call_runs_until_the_next_prompt_and_the_stream_is_sent_tool_failed() -> None:
    failed = Call("call_1", "error", "Tool execution interrupted: shell")
    outcome = Outcome(
        Installed("/bin/opencode", "2.1.2", Line2x()),
        directly=Seen(view=Call("call_1", "running"), told=None, before=None),
        proxied=Seen(view=failed, told=failed, before=None),
        left_behind=2,
    )
    text = report(outcome)
    assert "event stream  (nothing)" in text
    assert "until the session's next prompt" in text
    assert "`session.tool.failed`" in text
    assert "2 processes running" in " ".join(text.split())
