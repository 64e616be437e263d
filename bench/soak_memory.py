"""The proxy's memory across a long life: `settle-proxy run --resume --write-back api -- opencode
serve` (the real 1.18.33, the mock model) through N soak rounds in one proxy lifetime, each
round's server SIGKILLed during its tools and its text and restarted by the proxy, the turns
resumed and answered; the proxy's RSS after each round, and how much it grew after round 10.

Run from the repository root: `python -m bench.soak_memory [--rounds 50] [--out FILE]`. The
rounds are the soak test's (`tests/integration/soak.py`, kind `crash`), checked as it checks
them (settled, continued once, inactive), so the figure is of rounds that did what they should.
Flat means: no round after round 10 above round 10 by more than 5 MiB (issue 38, item 5).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from bench.procs import status_kib
from proxy.demo.model import MockModel
from tests.integration.opencode_server import OpencodeServer, running_opencode
from tests.integration.polling import poll
from tests.integration.soak import OPTIONS, Killer, play, round_plan, start_turns
from tests.integration.soak_checks import continuation_problems, state_problems, wait_round_over
from tests.integration.test_run_supervised import following

ROUNDS = 50
AFTER = 10
"""The rounds of warm-up: caches filling, the first connections and imports."""
FLAT_KIB = 5 * 1024
KIB_PER_MIB = 1024


@dataclass(frozen=True)
class Growth:
    """The proxy's RSS (KiB) after each round, and what it says past the warm-up."""

    rss_kib: tuple[int, ...]
    after: int = AFTER
    fds: tuple[int, ...] = ()
    """The proxy's open files after each round (a connection, a pipe or a database left open per
    round shows here as it would in the RSS)."""

    @property
    def measurable(self) -> bool:
        return len(self.rss_kib) > self.after

    @property
    def base_kib(self) -> int:
        """The RSS after round `after` (rounds count from 1)."""
        return self.rss_kib[self.after - 1]

    @property
    def growth_kib(self) -> int:
        """The most any later round is above round `after` (negative: all below it)."""
        return max(self.rss_kib[self.after :]) - self.base_kib

    @property
    def last_kib(self) -> int:
        """The last round against round `after`."""
        return self.rss_kib[-1] - self.base_kib

    @property
    def flat(self) -> bool:
        return self.growth_kib <= FLAT_KIB


def report(growth: Growth) -> str:
    """The RSS per round, then the growth after the warm-up and whether it is flat."""
    lines = [f"round {n:3}: {kib / KIB_PER_MIB:7.1f} MiB" for n, kib in enumerate(growth.rss_kib, start=1)]
    for index, fds in enumerate(growth.fds):
        lines[index] += f", {fds:4} open files"
    if not growth.measurable:
        lines.append(f"growth after round {growth.after}: not measured ({len(growth.rss_kib)} rounds)")
        return "\n".join(lines)
    verdict = "flat" if growth.flat else "NOT flat"
    lines.append(
        f"growth after round {growth.after}: {_mib(growth.growth_kib)} at most "
        f"(the last round {_mib(growth.last_kib)}), over {len(growth.rss_kib) - growth.after} rounds "
        f"from {growth.base_kib / KIB_PER_MIB:.1f} MiB: {verdict} within {FLAT_KIB // KIB_PER_MIB} MiB"
    )
    if len(growth.fds) > growth.after:
        base, last = growth.fds[growth.after - 1], growth.fds[-1]
        lines.append(f"open files: {base} after round {growth.after}, {last} after the last")
    return "\n".join(lines)


def _mib(kib: int) -> str:
    return f"{kib / KIB_PER_MIB:+.1f} MiB"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.soak_memory", description=__doc__)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"server crashes (default {ROUNDS})")
    parser.add_argument("--seed", type=int, default=0, help="the first round's seed (its moment)")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rounds < 1:
        print("--rounds must be at least 1", file=sys.stderr)
        return 2
    started = time.monotonic()
    model = MockModel()
    model.start()
    try:
        with tempfile.TemporaryDirectory(prefix="soak-memory-") as root:
            growth, failed = measure(model, Path(root), args.rounds, args.seed)
    finally:
        model.stop()
    text = report(growth) + f"\n{args.rounds} rounds in {time.monotonic() - started:.0f} s"
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    for problem in failed:
        print(problem, file=sys.stderr)
    return 1 if failed or not growth.flat else 0


def measure(model: MockModel, root: Path, rounds: int, seed: int) -> tuple[Growth, list[str]]:
    """`rounds` server crashes in one proxy lifetime; the proxy's RSS after each, and what failed."""
    rss: list[int] = []
    fds: list[int] = []
    failed: list[str] = []
    with running_opencode(root, model.base_url, supervised=OPTIONS) as server:
        poll(partial(following, server), what="the proxy following the server", timeout=60)
        killer = Killer(server)
        for number in range(rounds):
            plan = round_plan(number + 1, seed + number, watched=False, kind="crash")  # as reported
            since = time.time()
            turns = start_turns(server, model, plan)
            play(server, model, killer, plan, turns)
            problems = wait_round_over(server, plan, turns) + state_problems(server, turns)
            problems += continuation_problems(model, since, plan, turns)
            failed += [f"{plan.describe()}: {problem}" for problem in problems]
            rss.append(_rss_kib(server))
            fds.append(len(os.listdir(f"/proc/{server.pid}/fd")))
            print(
                f"round {plan.number}: {rss[-1] / KIB_PER_MIB:.1f} MiB, {fds[-1]} fds",
                file=sys.stderr,
                flush=True,
            )
    return Growth(tuple(rss), fds=tuple(fds)), failed


def _rss_kib(server: OpencodeServer) -> int:
    """The supervising proxy's own RSS (its server and the tools it adopted are other processes)."""
    return status_kib(server.pid, "VmRSS")


if __name__ == "__main__":
    sys.exit(main())
