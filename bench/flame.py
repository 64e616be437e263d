"""`python -m bench.flame`: where the proxy spends its time, as a flame graph.

    python -m bench.flame --out bench/results/flame.svg -- --upstream http://127.0.0.1:PORT --port N

runs the proxy (`python -m proxy` and the arguments after `--`) in this process, sampling its
Python stack every `--interval` ms of CPU time (`Sampler`), until SIGINT or SIGTERM;
then writes the stacks in the collapsed format (`<out>.collapsed`, one `frame;frame;... count`
a line, as py-spy and flamegraph.pl write them) and the graph itself as a self-contained SVG.
A sampler of our own, because py-spy is not installed here and cProfile's call graph cannot
tell which path a shared function (a header copy, a metric) was called on.
"""

from __future__ import annotations

import argparse
import html
import signal
import sys
import time
import zlib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

Stack = tuple[str, ...]
WIDTH, ROW = 1800, 16
"""The graph's width, and the height of one frame (px)."""


def frame_name(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_qualname} ({Path(code.co_filename).name}:{code.co_firstlineno})"


def stack_of(frame: FrameType | None) -> Stack:
    names = []
    while frame is not None:
        names.append(frame_name(frame))
        frame = frame.f_back
    return tuple(reversed(names))


class Sampler:
    """Counts the Python stacks of the main thread, once every `interval` seconds of CPU time.

    A profiling timer (SIGPROF), as statprof and pyinstrument do: a sampling thread would see the
    main thread only when it lets the GIL go, which under uvloop is between two turns of the loop,
    never inside the work. The timer counts CPU time, so an idle proxy is not sampled at all; a
    stack topped by the loop itself is time spent in uvloop's C code (its I/O and callbacks)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.stacks: Counter[Stack] = Counter()

    def _sample(self, _: int, frame: FrameType | None) -> None:
        self.stacks[stack_of(frame)] += 1

    def start(self) -> None:
        signal.signal(signal.SIGPROF, self._sample)
        signal.setitimer(signal.ITIMER_PROF, self.interval, self.interval)

    def stop(self) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, signal.SIG_IGN)


def collapsed(stacks: Counter[Stack]) -> str:
    return "".join(f"{';'.join(stack)} {count}\n" for stack, count in sorted(stacks.items()))


def _colour(name: str) -> str:
    hue = zlib.crc32(name.encode()) % 60
    return f"hsl({hue},80%,{60 + hue % 15}%)"


def svg(stacks: Counter[Stack], title: str) -> str:
    """An icicle-free flame graph: callers below, callees above, widths by sample count."""
    total = sum(stacks.values()) or 1
    tree: dict[Stack, int] = Counter()
    for stack, count in stacks.items():
        for depth in range(1, len(stack) + 1):
            tree[stack[:depth]] += count
    depth_max = max((len(stack) for stack in tree), default=0)
    height = (depth_max + 3) * ROW
    rects: list[str] = []
    offsets: dict[Stack, float] = {(): 0.0}
    for prefix in sorted(tree, key=lambda s: (len(s), s)):
        parent = prefix[:-1]
        x = offsets[parent]
        width = tree[prefix] / total * WIDTH
        offsets[parent] = x + width
        offsets[prefix] = x
        if width < 0.3:
            continue
        y = height - (len(prefix) + 1) * ROW
        name = html.escape(prefix[-1])
        share = f"{tree[prefix]} samples, {tree[prefix] / total:.1%}"
        label = name if width > 7 * len(prefix[-1]) else name[: max(0, int(width / 7) - 2)]
        rects.append(
            f'<g><title>{name} ({share})</title><rect x="{x:.1f}" y="{y}" width="{width:.1f}" '
            f'height="{ROW - 1}" fill="{_colour(prefix[-1])}"/>'
            f'<text x="{x + 2:.1f}" y="{y + ROW - 4}">{label}</text></g>'
        )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="monospace" font-size="11">'
        f'<text x="4" y="14">{html.escape(title)} ({total} samples)</text>{"".join(rects)}</svg>\n'
    )


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    arguments = list(sys.argv[1:] if argv is None else argv)
    split = arguments.index("--") if "--" in arguments else len(arguments)
    parser = argparse.ArgumentParser(prog="python -m bench.flame", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="the SVG to write")
    parser.add_argument("--interval", type=float, default=1.0, help="ms between samples (default 1)")
    parser.add_argument("--title", default="settle-proxy", help="the graph's title")
    return parser.parse_args(arguments[:split]), arguments[split + 1 :]


def main(argv: Sequence[str] | None = None) -> int:
    args, proxy_args = parse_args(argv)
    from proxy.cli.main import main as proxy_main  # noqa: PLC0415 - after the arguments are checked

    sampler = Sampler(args.interval / 1000)
    sampler.start()
    started = time.monotonic()
    try:
        proxy_main(proxy_args)
    except SystemExit as stopped:  # how the proxy always ends; the graph is written all the same
        print(f"the proxy ended ({stopped.code})", file=sys.stderr)
    finally:
        sampler.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".collapsed").write_text(collapsed(sampler.stacks))
    seconds = sum(sampler.stacks.values()) * args.interval / 1000
    args.out.write_text(
        svg(sampler.stacks, f"{args.title}: {seconds:.1f} s of CPU in {time.monotonic() - started:.0f} s")
    )
    print(f"{sum(sampler.stacks.values())} samples: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
