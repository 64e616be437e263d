"""What a soak round must leave, checked once it is over: every interrupted call settled through
the proxy and in the server's storage, every session inactive, every client told (and, watched,
shown) idle, each eligible turn continued once after each kill that cut it and nothing else
continued (counted in the mock model's request log), and the proxy's fds and threads flat.

Each check returns its problems instead of failing at the first, so a failing round says all it
got wrong, with its seed.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from proxy.demo.model import MockModel

from .opencode_server import OpencodeServer
from .polling import WaitTimeout, poll
from .proxy_process import wait_all_decided
from .soak import TIMEOUT_S, RoundPlan, Turns, direct_url, patiently
from .soak_clients import Clients, v1_problems, v1_told, v2_problems
from .test_run_supervised import settled, written
from .turns import Observed, Turn, is_active, turn_done

FD_SLACK = 12
THREAD_SLACK = 3
"""How far above the first round of its life the proxy's fds and threads may be after a round:
room for the connections a round leaves kept alive and the executor's threads, never for a leak
that grows with every round."""
_TOLD_TIMEOUT_S = 30.0
_QUIET_TIMEOUT_S = 60.0
"""aiohttp's connector closes a kept-alive upstream connection at its first clean-up after 15 s
unused, and cleans up every 15 s: up to 30 s after a round's last look-up, and more under load."""
_OWN_UPSTREAM = 3
"""Upstream connections the proxy keeps of its own: its follower of the server's event stream, and
a look-up or two under way."""


@dataclass(frozen=True)
class Usage:
    """The proxy process's open files, threads and resident memory, from /proc."""

    fds: int
    threads: int
    rss_kib: int
    kinds: Counter[str] = field(default_factory=Counter, compare=False, repr=False)
    """The open files by kind (`socket`, `pipe`, `anon_inode:[eventpoll]`, a file's path), so
    that a growth says what grew."""

    @property
    def clients(self) -> int:
        """Connections live clients hold open to the proxy: how many is theirs to say (a browser
        keeps idle ones for its next requests), so they are no part of the proxy's own count."""
        return sum(n for kind, n in self.kinds.items() if kind.startswith(_CLIENT))

    @property
    def left(self) -> int:
        """Connections of clients that went away, still held by the proxy."""
        return sum(n for kind, n in self.kinds.items() if kind.startswith(_LEFT))

    @property
    def own(self) -> int:
        """Every open file but the connections of live clients and those to the server: each of
        a client's streams has its own leg to the server, so those follow the clients' count and
        are checked against it (`Lifetimes.problems`), not against a round before."""
        return self.fds - self.clients - self.upstream

    @property
    def upstream(self) -> int:
        """Connections the proxy holds open to the server."""
        return sum(n for kind, n in self.kinds.items() if kind.startswith("tcp established to :"))

    @classmethod
    def of(cls, pid: int, *, named: bool = False) -> Usage:
        """The usage now; `named`: each client connection also by the program that holds it (a
        look through every process, for a report)."""
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
        kinds: Counter[str] = Counter()
        sockets = _tcp_sockets(pid, named=named)
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                kinds[sockets.get(target) or re.sub(r":\[\d+\]$", "", target)] += 1
        return cls(kinds.total(), int(status["Threads"]), int(status["VmRSS"].split()[0]), kinds)


_TCP_STATES = {"01": "established", "06": "time-wait", "08": "close-wait", "0A": "listening"}
_CLIENT = "tcp established client"
_LEFT = "tcp client left"


def _tcp_sockets(pid: int, *, named: bool) -> dict[str, str]:
    """Each TCP socket of the process's network namespace, by its fd link (`socket:[inode]`), as
    `tcp established client` (accepted on a port it listens on, its other end open; `named`,
    with the program holding that end), `tcp client left (STATE)` (its other end closed or gone)
    or `tcp STATE to :PORT`."""
    rows = []
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            rows += [line.split() for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]]
    listening = {row[1].rsplit(":", 1)[1] for row in rows if row[3] == "0A"}
    by_local = {row[1]: row for row in rows}
    owners: dict[str, str] | None = None
    labels = {}
    for row in rows:
        local, remote, state = row[1].rsplit(":", 1)[1], row[2].rsplit(":", 1)[1], row[3]
        word = _TCP_STATES.get(state, f"state {state}")
        label = f"tcp {word} to :{int(remote, 16)}"
        if local in listening and state != "0A":
            peer = by_local.get(row[2])
            label = _CLIENT
            if state != "01" or peer is None or peer[3] != "01" or peer[9] == "0":
                label = f"{_LEFT} ({word}, its end {_TCP_STATES.get(peer[3], 'gone') if peer else 'gone'})"
            elif named:
                owners = _socket_owners() if owners is None else owners
                label += f" {owners.get(peer[9], 'elsewhere')}"
        labels[f"socket:[{row[9]}]"] = label
    return labels


def _socket_owners() -> dict[str, str]:
    """The program holding each socket of this machine, by inode: who a client connection is."""
    owners = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            program = Path(f"/proc/{pid}/comm").read_text().strip()
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if (target := os.readlink(f"/proc/{pid}/fd/{fd}")).startswith("socket:["):
                        owners[target[8:-1]] = program
    return owners


@dataclass
class Lifetimes:
    """The proxy's usage after each round, and the first of each proxy lifetime (its baseline)."""

    seen: list[tuple[int, Usage]] = field(default_factory=list)
    baseline: dict[int, Usage] = field(default_factory=dict)

    def problems(self, pid: int) -> list[str]:
        usage = _quiet_usage(pid)
        self.seen.append((pid, usage))
        first = self.baseline.setdefault(pid, usage)
        problems = []
        if usage.left:
            problems.append(
                f"the proxy still holds {usage.left} connections of clients that went away, "
                f"{_QUIET_TIMEOUT_S:.0f} s after the round"
            )
        if usage.upstream > usage.clients + _OWN_UPSTREAM:
            problems.append(
                f"the proxy holds {usage.upstream} connections to the server for {usage.clients} client "
                f"connections, {_QUIET_TIMEOUT_S:.0f} s after the round"
            )
        if usage.own > first.own + FD_SLACK:
            clients = {k: n for k, n in Usage.of(pid, named=True).kinds.items() if k.startswith(_CLIENT)}
            problems.append(
                f"the proxy holds {usage.own} fds besides its clients' connections and their legs to the server, "
                f"{first.own} after "
                f"its first round (more: {dict((usage.kinds - first.kinds).most_common(5))}; "
                f"its clients now: {clients})"
            )
        if usage.threads > first.threads + THREAD_SLACK:
            problems.append(f"the proxy runs {usage.threads} threads, {first.threads} after its first round")
        return problems


def _quiet_usage(pid: int) -> Usage:
    """The proxy's usage once it has closed the connections of the clients that went away (a
    round's TUI and page end just before) and its upstream connections are no more than its
    clients' streams and a few of its own (idle kept-alive ones close within `_QUIET_TIMEOUT_S`):
    what a round leaves behind for a while would not tell a leak apart. After
    `_QUIET_TIMEOUT_S`, as it is."""
    usage = Usage.of(pid)
    deadline = time.monotonic() + _QUIET_TIMEOUT_S
    while (usage.left or usage.upstream > usage.clients + _OWN_UPSTREAM) and time.monotonic() < deadline:
        time.sleep(0.5)
        usage = Usage.of(pid)
    return usage


def wait_round_over(server: OpencodeServer, plan: RoundPlan, turns: Turns) -> list[str]:
    """Wait (bounded) until every turn is answered (resumed) or settled and written (not), and the
    proxy has decided all it was going to: the positive signal the other checks then read."""
    direct = direct_url(server)
    checks: list[tuple[str, Callable[[], object | None]]] = []
    if plan.resumed:
        checks += [(f"{t.prompt} answered", partial(turn_done, server.url, t)) for t in turns.all()]
    for observed in turns.observed.values():
        checks.append((f"{observed.turn.prompt} settled", partial(settled, server, observed)))
        checks.append((f"{observed.turn.prompt} written", partial(written, direct, observed.turn)))
    problems = []
    for what, check in checks:
        try:
            poll(patiently(check), what=what, timeout=TIMEOUT_S)
        except WaitTimeout as late:
            problems.append(str(late))
    try:
        wait_all_decided(server.url, within=TIMEOUT_S)
    except WaitTimeout as late:
        problems.append(str(late))
    return problems


def state_problems(server: OpencodeServer, turns: Turns) -> list[str]:
    """Every call settled through the proxy and in storage; no session of the round active."""
    direct = direct_url(server)
    problems = [
        f"{o.turn.prompt}: {what}"
        for o in turns.observed.values()
        for what, ok in (
            ("open through the proxy", settled(server, o)),
            ("open in storage", written(direct, o.turn)),
        )
        if not ok
    ]
    problems += [f"{t.prompt}: still active" for t in turns.all() if is_active(direct, t)]
    return problems


def continuation_problems(model: MockModel, since: float, plan: RoundPlan, turns: Turns) -> list[str]:
    """Each eligible turn continued once per kill that cut it, and nothing else: every model request
    of a session whose newest user text is not its person's prompt is a continuation."""
    found = Counter(
        r.prompt
        for r in model.requests()
        if r.at >= since and "bash" in r.tools and r.latest_prompt != r.prompt
    )
    expected = turns.expected(plan)
    if dict(found) == expected:
        return []
    return [f"continuations {dict(found)}, expected {expected}"]


def told_problems(clients: Clients, since: int, plan: RoundPlan, turns: Turns) -> list[str]:
    """What the SDK followers heard, waited for (bounded) until it is complete. A v2 text turn the
    proxy died with has nothing to be told on its own stream (no call; its step never ends)."""
    resumed = plan.resumed
    checks: dict[str, Callable[[], list[str]]] = {}
    for runtime, turn in turns.tools.items():
        calls = turns.calls[runtime]
        if runtime == "v1":
            checks[turn.prompt] = partial(
                _v1, clients, since, turn, turns.observed[runtime], calls, resumed=resumed
            )
        else:
            checks[turn.prompt] = partial(
                v2_problems, clients.sessions[turn.session_id], calls, resumed=resumed
            )
    for runtime, turn in turns.writing.items():
        if runtime == "v1":
            checks[turn.prompt] = partial(_v1, clients, since, turn, None, [], resumed=resumed)
        elif resumed:
            checks[turn.prompt] = partial(v2_problems, clients.sessions[turn.session_id], [], resumed=True)
    problems = []
    for prompt, check in checks.items():
        try:
            poll(partial(_complete, check), what=prompt, timeout=_TOLD_TIMEOUT_S)
        except WaitTimeout:
            problems += [f"{prompt}: {problem}" for problem in check()]
    return problems


def _complete(check: Callable[[], list[str]]) -> bool | None:
    return None if check() else True


def _v1(
    clients: Clients, since: int, turn: Turn, observed: Observed | None, calls: list[str], *, resumed: bool
) -> list[str]:
    """A v1 session's problems; the answer of a resumed turn is looked for after its tool call's
    message (a text turn's is in its continuation count)."""
    story = v1_told(clients.follower, since, observed, turn)
    answered = resumed and observed is not None
    return [f"{problem} ({story})" for problem in v1_problems(story, calls, answered=answered)]
