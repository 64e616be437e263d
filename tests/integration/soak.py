"""Soak rounds: `settle-proxy run --resume --write-back api -- opencode serve` (the real 1.18.33,
the mock model) SIGKILLed at seeded random moments, round after round, in one server's life.

Each round starts four turns through the proxy: a v1 and a v2 turn whose bash call runs
(`echo hello && sleep 600`, a call the resume counts as safe) and a v1 and a v2 turn whose model
writes slowly. Once every one is live it waits a random moment and SIGKILLs, by the round's kind:

- `proxy`: the supervising proxy itself (its server dies with it), then starts it again on the
  same data. The proxy died with the turns: none may be resumed, every call must still be settled
  and every client told.
- `after-restart`: the server's own pid (during the tools and the text), then the restarted server
  again the moment the proxy has started it, before it answers.
- `continuation`: the server, then the server again while the resumed tool turns run their own
  call (the model asks for the tool once per prompt until the test re-plans it).
- `crash`: the server once (the memory benchmark's round; the test's deck holds the first three).

A server round may add the other server kill (its own `rng`). The mock model's plans decide
what a continuation does: the text turns' continuation (`WRITING_TEXT`) is answered at once, and a
tool turn's continuation runs the tool only while a kill during it is still to come, so every
continuation is one model request and the round ends with every turn answered and idle.

The proxy's supervisor gives up after `RESTARTS_PER_WINDOW` restarts within `WINDOW_S` (a restart
storm, as designed): `Pacer` holds a kill back until it would not make one.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, TypeVar

from proxy.demo.model import MockModel, Plan
from proxy.supervision.supervisor import RESTARTS_PER_WINDOW, WINDOW_S

from .http_client import request
from .opencode_server import OpencodeServer
from .polling import poll
from .resumes import WRITING_TEXT, answer_started
from .test_resume_supervised import running_again
from .test_run_supervised import following
from .turns import (
    RUNTIMES,
    Observed,
    Runtime,
    Turn,
    find_running_tool,
    read_messages,
    start_turn,
    turn_done,
    wait_tool_running,
)

T = TypeVar("T")
Kind = Literal["proxy", "after-restart", "continuation", "crash"]
DECK: tuple[Kind, ...] = ("proxy", "after-restart", "continuation")
"""A round's kind is `DECK[seed % 3]`: consecutive seeds (a soak's rounds) deal every kind in turn."""
OPTIONS = ("--resume", "--write-back", "api")
SEED_VARIABLE, ROUNDS_VARIABLE = "SETTLE_SOAK_SEED", "SETTLE_SOAK_ROUNDS"
DEFAULT_ROUNDS = 3
MOMENT_S = 2.0
"""The first kill lands up to this long after every turn is live (a random word of the text)."""
EXTRA_KILL = 0.5
"""The chance that a server round adds the other server kill."""
TEXT_EVERY_S = 1.0
TIMEOUT_S = 90.0
_PACE_MARGIN_S = 2.0
_HEALTH_TIMEOUT_S = 2.0


def patiently(check: Callable[[], T | None]) -> Callable[[], T | None]:
    """`check`, with a request the loaded server did not answer in time taken for not yet (seen: a
    message view 10 s late while the restarted server booted and resumed on a busy machine)."""

    def patient() -> T | None:
        try:
            return check()
        except TimeoutError:
            return None

    return patient


@dataclass(frozen=True)
class RoundPlan:
    """What one round kills and when; everything in it follows from `seed`."""

    number: int
    seed: int
    kind: Kind
    moment: float
    after_restart: bool
    continuation: bool
    watched: bool
    """The real TUI and a web UI page are attached (the first and the last round)."""

    @property
    def resumed(self) -> bool:
        """Whether the round's turns are eligible: a server crash the proxy saw them through."""
        return self.kind != "proxy"

    def describe(self) -> str:
        extras = [
            name
            for name, on in (("after-restart", self.after_restart), ("continuation", self.continuation))
            if on
        ]
        kills = "the proxy" if self.kind == "proxy" else "the server" + "".join(f", {e}" for e in extras)
        return (
            f"round {self.number} ({SEED_VARIABLE}={self.seed}): {kills}, first kill {self.moment:.2f} s in"
        )


def round_plan(number: int, seed: int, *, watched: bool, kind: Kind | None = None) -> RoundPlan:
    """The plan of round `number`, drawn from its own `seed` (so `SETTLE_SOAK_SEED=seed` with one
    round replays it first)."""
    rng = random.Random(seed)
    dealt = kind or DECK[seed % len(DECK)]
    moment = rng.uniform(0, MOMENT_S)
    extra = rng.random() < EXTRA_KILL
    return RoundPlan(
        number,
        seed,
        dealt,
        moment,
        after_restart=dealt == "after-restart" or (dealt == "continuation" and extra),
        continuation=dealt == "continuation" or (dealt == "after-restart" and extra),
        watched=watched,
    )


def soak_plans() -> list[RoundPlan]:
    """`SETTLE_SOAK_ROUNDS` rounds (default 3) from `SETTLE_SOAK_SEED` (default: a fresh one)."""
    rounds = int(os.environ.get(ROUNDS_VARIABLE, DEFAULT_ROUNDS))
    seed = int(os.environ.get(SEED_VARIABLE) or random.SystemRandom().randrange(1_000_000))
    return [round_plan(n, seed + n, watched=n in (0, rounds - 1)) for n in range(rounds)]


@dataclass
class Pacer:
    """When the supervisor started the server again, so a kill never makes a restart storm."""

    restarts: deque[float] = field(default_factory=deque)

    def before_kill(self, room: int = 1) -> None:
        """Wait until `room` more restarts (this kill's, and the ones to follow at once) keep fewer
        than `RESTARTS_PER_WINDOW` recent (a pause, not a check): a kill meant to come the moment
        the server is back must never wait here, or the proxy resumes meanwhile."""
        while self.restarts and time.monotonic() - self.restarts[0] > WINDOW_S + _PACE_MARGIN_S:
            self.restarts.popleft()
        while len(self.restarts) + room > RESTARTS_PER_WINDOW - 1:
            time.sleep(max(0.0, WINDOW_S + _PACE_MARGIN_S - (time.monotonic() - self.restarts[0])))
            self.restarts.popleft()
        self.restarts.append(time.monotonic())

    def new_proxy(self) -> None:
        """A new supervisor counts from nothing."""
        self.restarts.clear()


@dataclass
class Turns:
    """A round's four turns, and every call a kill interrupted in each tool turn."""

    tools: dict[Runtime, Turn]
    writing: dict[Runtime, Turn]
    observed: dict[Runtime, Observed] = field(default_factory=dict)
    """By runtime, the tool turn as its first call ran."""
    calls: dict[Runtime, list[str]] = field(default_factory=dict)
    """By runtime, the tool turn's interrupted calls (v1 part ids, v2 call ids), oldest first."""

    def all(self) -> list[Turn]:
        return [*self.tools.values(), *self.writing.values()]

    def expected(self, plan: RoundPlan) -> dict[str, int]:
        """How many continuations each turn's prompt must get: one after each kill that cut it."""
        if not plan.resumed:
            return {}
        tool = 1 + plan.continuation
        return {t.prompt: tool for t in self.tools.values()} | {t.prompt: 1 for t in self.writing.values()}


def start_turns(server: OpencodeServer, model: MockModel, plan: RoundPlan) -> Turns:
    """The round's four turns, started through the proxy, returned once each is live."""
    model.plan(WRITING_TEXT, Plan(tool="none"))
    prompts = {runtime: f"soak {plan.number} {runtime}" for runtime in RUNTIMES}
    for prompt in prompts.values():
        model.plan(f"{prompt} tool", Plan(each_prompt=True))
        model.plan(f"{prompt} text", Plan(text_every=TEXT_EVERY_S))
    turns = Turns(
        {r: start_turn(r, server.url, server.project, f"{p} tool") for r, p in prompts.items()},
        {r: start_turn(r, server.url, server.project, f"{p} text") for r, p in prompts.items()},
    )
    for runtime, turn in turns.tools.items():
        turns.observed[runtime] = Observed(turn, wait_tool_running(server.url, turn))
        turns.calls[runtime] = [turns.observed[runtime].tool_id]
    for turn in turns.writing.values():
        poll(patiently(partial(answer_started, server, turn)), what="the model writing", timeout=TIMEOUT_S)
    return turns


def answer_continuations_with_text(model: MockModel, turns: Turns) -> None:
    """From now on a tool turn's continuation answers with text: the turn ends."""
    for turn in turns.tools.values():
        model.plan(turn.prompt, Plan())


def _health(server: OpencodeServer) -> dict[str, Any] | None:
    """The proxy's health (None while it does not answer in time, or answers without its details:
    a proxy just started again refuses them, 503 `unknown`, until the upstream has answered it)."""
    try:
        reply = request("GET", f"{server.url}/_settle/health", timeout=_HEALTH_TIMEOUT_S)
    except OSError:
        return None
    found: dict[str, Any] = reply.json()
    return found if "upstream" in found else None


def direct_url(server: OpencodeServer) -> str:
    """The supervised server's own address, as the proxy's health gives it once it shows it."""
    found = poll(partial(_health, server), what="the proxy's health with its details", timeout=TIMEOUT_S)
    return str(found["upstream"]["url"])


def _started(server: OpencodeServer, restarts: int) -> int | None:
    """The pid of the server once the supervisor has started it `restarts` times."""
    found = _health(server)
    state = found["server"] if found else {}
    return state["pid"] if state.get("restarts") == restarts and state.get("pid") else None


def _answering(server: OpencodeServer, restarts: int) -> bool | None:
    found = _health(server)
    answers = found is not None and found["server"]["restarts"] == restarts and found["upstream"]["reachable"]
    return True if answers else None


@dataclass
class Killer:
    """The soak's SIGKILLs of one supervised server, with its supervisor's restart count."""

    server: OpencodeServer
    pacer: Pacer = field(default_factory=Pacer)
    restarts: int = 0

    def kill_proxy(self) -> None:
        """The supervising proxy and everything below it, then `run` started again on the same data."""
        self.server.crash()
        self.server.restart()
        self.pacer.new_proxy()
        self.restarts = 0

    def kill_server(self, *, at_once_again: bool = False) -> None:
        """The server's own pid (as the OOM killer does); with `at_once_again`, its next self too,
        the moment the proxy has started it; back once it answers and every project is warm."""
        pid = poll(partial(_started, self.server, self.restarts), what="the server's pid", timeout=TIMEOUT_S)
        self._kill(pid, room=2 if at_once_again else 1)
        if at_once_again:
            again = poll(
                partial(_started, self.server, self.restarts),
                what="the restarted server's pid",
                timeout=TIMEOUT_S,
                interval=0.02,
            )
            self._kill(again)
        poll(
            partial(_answering, self.server, self.restarts),
            what=f"restart {self.restarts}",
            timeout=TIMEOUT_S,
        )
        # A request sent while the restarted server boots can hang for good: its projects are
        # warmed once the proxy follows its events, when it answers.
        poll(partial(following, self.server), what="the proxy following the server", timeout=TIMEOUT_S)
        self.server.wait_ready()

    def _kill(self, pid: int, room: int = 1) -> None:
        self.pacer.before_kill(room)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError as gone:
            raise AssertionError(f"the server {pid} was gone before its kill") from gone
        self.restarts += 1


def kill_during_continuation(server: OpencodeServer, model: MockModel, killer: Killer, turns: Turns) -> None:
    """Once every resumed tool turn runs its own call (and the text turns have answered), SIGKILL
    the server there; the next continuations answer with text."""
    for turn in turns.writing.values():
        poll(
            patiently(partial(turn_done, server.url, turn)), what=f"{turn.prompt} answered", timeout=TIMEOUT_S
        )
    for runtime, turn in turns.tools.items():
        again = patiently(partial(running_again, server, turn, 2))
        poll(again, what=f"the resumed {runtime} call", timeout=TIMEOUT_S)
        running = find_running_tool(read_messages(server.url, turn), runtime)
        assert running is not None
        turns.calls[runtime].append(str(running.tool["id"]))
    answer_continuations_with_text(model, turns)
    killer.kill_server()


def play(server: OpencodeServer, model: MockModel, killer: Killer, plan: RoundPlan, turns: Turns) -> None:
    """The round's kills, from the moment its turns are live (and its clients attached)."""
    if not plan.continuation:
        answer_continuations_with_text(model, turns)
    time.sleep(plan.moment)
    if plan.kind == "proxy":
        killer.kill_proxy()
        return
    killer.kill_server(at_once_again=plan.after_restart)
    if plan.continuation:
        kill_during_continuation(server, model, killer, turns)
