"""`--resume` with the real opencode 1.18.33 and the mock model: plain proxies in front of a server
that is SIGKILLed mid-tool and restarted, all in one crash.

Three `--resume --write-back api` proxies follow the server when it dies: two alike (they share
one state database, as two proxies of one user on one host do), and one with `--dry-run`. A
fourth resumes only turns last alive within a millisecond. The crash interrupts a v1 and a v2
turn (each resumed once, by one proxy), a v1 turn with a person's message already queued (left
alone), a v1 call waiting on a permission (left for the person) and a v1 `task` call with its
child session (the parent resumed, the child never); a TUI and two official-SDK subscriptions
stay open through the first proxy across the crash. Every wait ends on a
positive signal: a decision in `/_settle/resume`, a finished turn, a count of model requests.
The resuming proxies wait 20 s (`--grace`) before they look: the tracker's reconnect pauses
(0.25 s growing to 5 s) can bring two proxies back up to 5 s apart after the restart, the
person's message sent right after the restart must be stored before they look (the freshly
started server of a loaded machine took over 10 s to store it once), and the dry-run and the
impatient proxy must decide on the interrupted turn as the crash left it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial

import orjson
import pytest

from proxy.demo.model import MockModel, Plan

from .opencode_config import project_config
from .opencode_server import OpencodeServer, opencode_binary
from .polling import poll
from .proxy_process import ProxyProcess, running
from .resumes import (
    CHILD_PROMPT,
    NAMED_CALL,
    PARENT_PROMPT,
    WRITING_TEXT,
    Crash,
    after_reconnect,
    continuations,
    decided,
    event_kind,
    final,
    finals_of_the_pair,
    following,
    permission_asked,
    requests_since,
    sdk_subscriptions,
    sent_for,
    start_task,
    start_writing,
    v1_story,
)
from .test_run_supervised import written
from .test_tui import BUSY_BAR, IDLE_LIMIT_BYTES, shows_running, watch
from .tui import Terminals
from .turns import (
    RUNTIMES,
    is_active,
    read_messages,
    send_prompt,
    start_v1_turn,
    wait_turn_done,
)
from .turns import observe_running as observe

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LATER_TEXT = "a person continues right after the restart"
RESUMING = ("--resume", "--resume-safe", "task", "--write-back", "api", "--log-format", "json")
"""`task` is no tool that only reads: named safe, so the parent of the child session is resumed."""
RESUMING_DB = ("--resume", "--resume-safe", "task", "--write-back", "db", "--log-format", "json")
DECISION_TIMEOUT_S = 90.0
LOST_TO_THE_OTHER = ("already claimed, by ", "a newer message ", "the session is running")


@pytest.fixture(scope="module")
def crash(mock_model: MockModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Crash]:
    root = tmp_path_factory.mktemp("resume")
    server = OpencodeServer(opencode_binary(), root, mock_model.base_url)
    asks = server.add_project("asks")
    config = project_config(mock_model.base_url) | {"permission": {"bash": "ask"}}
    (asks / "opencode.json").write_bytes(orjson.dumps(config))
    logs = root / "proxies"
    logs.mkdir()
    proxies = {
        "first": ProxyProcess(server.url, logs / "first.log", (*RESUMING, "--grace", "20")),
        "second": ProxyProcess(
            server.url, logs / "second.log", (*RESUMING_DB, "--db", str(server.database), "--grace", "20")
        ),
        "dry": ProxyProcess(server.url, logs / "dry.log", (*RESUMING, "--grace", "0", "--dry-run")),
        "late": ProxyProcess(
            server.url, logs / "late.log", (*RESUMING, "--grace", "0", "--resume-within", "0.001")
        ),
    }
    try:
        server.start()
        with running(proxies.values()):
            for proxy in proxies.values():
                poll(partial(following, proxy), what="the proxy following the server", timeout=60)
            turns = observe(
                server.url,
                server.project,
                {
                    "v1": ("v1", "resume me v1"),
                    "v2": ("v2", "resume me v2"),
                    "wrote": ("v1", "resume wrote"),
                    "later": ("v1", "resume later"),
                },
            )
            send_prompt(server.url, turns["wrote"].turn, "a person writes while the tool runs")
            asking = start_v1_turn(server.url, asks, "resume asks")
            parent, child = start_task(server, mock_model)
            poll(partial(permission_asked, server, asks), what="the permission asked", timeout=60)
            writing = start_writing(server, mock_model)
            first = proxies["first"].url
            sdk_streams = {
                "global": (first, "global", ""),
                "session": (first, "session", turns["v2"].session_id),
            }
            with Terminals(root, opencode_binary()) as terminals, sdk_subscriptions(root, sdk_streams) as sdk:
                v1 = turns["v1"].turn
                tui = terminals.attach("across", first, v1.session_id, v1.directory)
                tui.wait_screen(shows_running, what="the TUI to show the tool running", timeout=60)
                crashed_at = time.time()
                mock_model.plan(LATER_TEXT, Plan(tool="none"))
                server.crash()
                server.restart()
                send_prompt(server.url, turns["later"].turn, LATER_TEXT)
                yield Crash(server, proxies, turns, asking, parent, child, tui, sdk, writing, crashed_at)
    finally:
        server.stop()


@pytest.mark.parametrize("runtime", ["v1", "v2"])
def test_an_interrupted_turn_is_resumed_once_by_one_of_two_proxies(
    crash: Crash, mock_model: MockModel, runtime: str
) -> None:
    turn = crash.turns[runtime].turn
    made = finals_of_the_pair(crash, turn, DECISION_TIMEOUT_S)
    assert sorted(decision["outcome"] for decision in made) == ["resumed", "skipped"]
    resumed = next(decision for decision in made if decision["outcome"] == "resumed")
    lost = next(decision for decision in made if decision["outcome"] == "skipped")
    # Lost to the other, wherever the other's continuation met it: at the claim, in the session
    # re-read (newer than anything the stream showed before the crash), or in the reading after.
    # Which one depends on how far apart the two decide (the db write-back is the slower one).
    assert lost["why"].startswith(LOST_TO_THE_OTHER), lost
    messages = wait_turn_done(crash.server.url, turn, timeout=DECISION_TIMEOUT_S)
    assert not is_active(crash.server.url, turn)
    continued = continuations(mock_model, turn, crash.crashed_at)
    assert len(continued) == 1, [r.latest_prompt for r in requests_since(mock_model, turn, crash.crashed_at)]
    assert continued[0].latest_prompt is not None
    assert NAMED_CALL in continued[0].latest_prompt
    assert "outcome is unknown" in continued[0].latest_prompt
    assert continued[0].tool_messages, "the settled call is in the history the model sees"
    assert written(crash.server.url, turn)
    assert len(messages) == 4, "the prompt, the interrupted answer, the continuation and the new answer"
    ids = [message["info"]["id"] if runtime == "v1" else message["id"] for message in messages]
    assert resumed["prompt"] in ids, "the continuation is stored under the id the ledger recorded"


@pytest.mark.parametrize("runtime", ["v1", "v2"])
def test_a_dry_run_decides_and_sends_nothing(crash: Crash, runtime: str) -> None:
    turn = crash.turns[runtime].turn
    decision = poll(partial(final, crash.proxies["dry"].url, turn), what="the dry run's decision", timeout=60)
    assert (decision["outcome"], decision["why"]) == ("would-resume", "--dry-run: nothing sent")
    # The one continuation the model receives (the test above) is the other proxies'.


def test_a_turn_past_resume_within_is_left_alone(crash: Crash) -> None:
    decision = poll(
        partial(final, crash.proxies["late"].url, crash.turns["v1"].turn), what="a decision", timeout=60
    )
    assert decision["outcome"] == "skipped"
    assert "past --resume-within 0.001 s" in decision["why"]


def test_a_message_a_person_sent_before_the_proxy_acts_is_never_overridden(
    crash: Crash, mock_model: MockModel
) -> None:
    turn = crash.turns["wrote"].turn
    for name in ("first", "second", "dry"):
        decision = poll(partial(final, crash.proxies[name].url, turn), what=f"{name}'s decision", timeout=60)
        assert decision["outcome"] == "skipped"
        assert "a newer message" in decision["why"]
    assert requests_since(mock_model, turn, crash.crashed_at) == []
    assert len(read_messages(crash.server.url, turn)) == 3


def test_a_message_a_person_sends_after_the_restart_before_the_proxy_acts_wins(
    crash: Crash, mock_model: MockModel
) -> None:
    turn = crash.turns["later"].turn
    for name in ("first", "second"):
        decision = poll(partial(final, crash.proxies[name].url, turn), what=f"{name}'s decision", timeout=60)
        assert decision["outcome"] == "skipped"
        # Found while the person's turn runs, or once it has answered: either way not over them.
        assert decision["why"].startswith(("a newer message", "no interrupted turn")), decision
    wait_turn_done(crash.server.url, turn, timeout=DECISION_TIMEOUT_S)
    assert [r.latest_prompt for r in requests_since(mock_model, turn, crash.crashed_at)] == [LATER_TEXT]


def test_a_call_waiting_on_a_permission_is_left_for_the_person(crash: Crash, mock_model: MockModel) -> None:
    for name in ("first", "second"):
        decided_on = poll(
            partial(decided, crash.proxies[name].url, crash.asking), what=f"{name}'s decision", timeout=60
        )
        assert decided_on[-1]["outcome"] == "skipped"
        assert "waiting on a person (a permission asked)" in decided_on[-1]["why"]
    assert requests_since(mock_model, crash.asking, crash.crashed_at) == []


def test_a_task_call_resumes_its_parent_once_and_never_its_child(crash: Crash, mock_model: MockModel) -> None:
    for name in ("first", "second"):
        decision = poll(
            partial(final, crash.proxies[name].url, crash.child), what=f"{name} on the child", timeout=60
        )
        assert decision["outcome"] == "skipped"
        assert decision["why"].startswith(f"a child session (of {crash.parent.session_id})")
    made = [
        poll(partial(final, crash.proxies[name].url, crash.parent), what=f"{name} on the parent", timeout=90)
        for name in ("first", "second")
    ]
    assert sorted(decision["outcome"] for decision in made) == ["resumed", "skipped"]
    wait_turn_done(crash.server.url, crash.parent, timeout=DECISION_TIMEOUT_S)
    [continued] = [
        r
        for r in requests_since(mock_model, crash.parent, crash.crashed_at)
        if r.latest_prompt != PARENT_PROMPT
    ]
    assert continued.latest_prompt is not None
    assert "- task: `" in continued.latest_prompt
    assert CHILD_PROMPT in continued.latest_prompt
    assert requests_since(mock_model, crash.child, crash.crashed_at) == []


def resumed_on_screen(screen: str) -> bool:
    return "were interrupted" in screen and BUSY_BAR not in screen


def test_a_tui_open_across_the_crash_shows_the_resumed_turn_and_goes_quiet(crash: Crash) -> None:
    wait_turn_done(crash.server.url, crash.turns["v1"].turn, timeout=DECISION_TIMEOUT_S)
    seen = watch({crash.tui: resumed_on_screen})["across"]
    assert resumed_on_screen(seen.screen), seen.report()
    assert "done" in seen.screen.split("were interrupted", 1)[1], seen.report()
    assert seen.idle_bytes <= IDLE_LIMIT_BYTES, seen.report()


def test_an_sdk_client_open_across_the_crash_sees_the_resumed_turn_run_and_end(crash: Crash) -> None:
    """Through the proxy, `/global/event` shows the resumed v1 turn go busy and answer before it is
    idle again (nothing the proxy slips in says idle in between); the v2 session's own stream shows
    the call failed before the resume's prompt was admitted, then the step that ends the turn."""
    observed = crash.turns["v1"]
    wait_turn_done(crash.server.url, observed.turn, timeout=DECISION_TIMEOUT_S)
    wait_turn_done(crash.server.url, crash.turns["v2"].turn, timeout=DECISION_TIMEOUT_S)

    def v1_ended() -> list[str] | None:
        story = v1_story(after_reconnect(crash.sdk["global"]), observed)
        return story if story and story[-1] == "idle" and "answered" in story else None

    story = poll(v1_ended, what="the SDK to hear the resumed v1 turn end", timeout=DECISION_TIMEOUT_S)
    resumed = story[story.index("busy") :]
    assert resumed.index("answered") < resumed.index("idle"), story

    def v2_story() -> list[str] | None:
        events = [event_kind(event) for event in after_reconnect(crash.sdk["session"])]
        ended = any(k == "session.next.step.ended" and data.get("finish") == "stop" for k, data in events)
        return [k for k, _ in events] if ended else None

    kinds = poll(v2_story, what="the SDK to hear the resumed v2 turn end", timeout=DECISION_TIMEOUT_S)
    # The stream replays the session's durable history on each (re)connection: the person's prompt,
    # the call, its failure (the write-back), and only then the one prompt the resume sent.
    admitted = [index for index, kind in enumerate(kinds) if kind == "session.next.prompt.admitted"]
    assert len(admitted) == 2, kinds
    assert admitted[0] < kinds.index("session.next.tool.failed") < admitted[1], kinds


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_turn_cut_while_the_model_wrote_is_resumed_once(
    crash: Crash, mock_model: MockModel, runtime: str
) -> None:
    turn = crash.writing[runtime]
    made = finals_of_the_pair(crash, turn, DECISION_TIMEOUT_S)
    assert sorted(decision["outcome"] for decision in made) == ["resumed", "skipped"], made
    wait_turn_done(crash.server.url, turn, timeout=DECISION_TIMEOUT_S)
    assert len(sent_for(mock_model, turn, crash.crashed_at, WRITING_TEXT)) == 1
    assert not is_active(crash.server.url, turn)
