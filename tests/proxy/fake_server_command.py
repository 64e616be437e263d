"""A stand-in for `opencode serve` under `settle-proxy run`: answers every GET with `{}`.

`--orphan PIDFILE` starts `sleep 600` in a process group of its own first (as opencode's bash
tool runs a command) and writes its pid there; `--exit CODE` exits at once with CODE instead of
serving, or with `--answer-for S` after it listened for S seconds; `--signals FILE` writes the
name of each SIGINT or SIGTERM it gets into FILE, then exits (with `--stay`, it goes on); `--pid-file
FILE` writes its own pid there as it starts. It prints `listening on URL` once it
listens, as opencode does. `--port` and `--hostname` come from the proxy, as they would for the
real server.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType


class Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        del format, args


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--orphan", type=Path)
    parser.add_argument("--exit", type=int)
    parser.add_argument("--answer-for", type=float)
    parser.add_argument("--signals", type=Path)
    parser.add_argument("--stay", action="store_true")
    parser.add_argument("--pid-file", type=Path)
    args = parser.parse_args()
    if args.pid_file is not None:
        args.pid_file.write_text(str(os.getpid()))
    if args.exit is not None and args.answer_for is None:
        sys.exit(args.exit)
    if args.signals is not None:
        _write_signals(args.signals, stay=args.stay)
    if args.orphan is not None:
        tool = subprocess.Popen(["sleep", "600"], process_group=0)
        args.orphan.write_text(str(tool.pid))
    server = ThreadingHTTPServer((args.hostname, args.port), Answer)
    print(f"listening on http://{args.hostname}:{args.port}", flush=True)
    if args.answer_for is not None:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        time.sleep(args.answer_for)
        sys.exit(args.exit)
    server.serve_forever()


def _write_signals(path: Path, *, stay: bool) -> None:
    def got(signum: int, _: FrameType | None) -> None:
        with path.open("a") as written:
            written.write(f"{signal.Signals(signum).name}\n")
        if not stay:
            sys.exit(0)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, got)


if __name__ == "__main__":
    main()
