"""A stand-in for `opencode serve` under `settle-proxy run`: answers every GET with `{}`.

`--orphan PIDFILE` starts `sleep 600` in a process group of its own first (as opencode's bash
tool runs a command) and writes its pid there; `--exit CODE` exits at once with CODE instead of
serving. `--port` and `--hostname` come from the proxy, as they would for the real server.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


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
    args = parser.parse_args()
    if args.exit is not None:
        sys.exit(args.exit)
    if args.orphan is not None:
        tool = subprocess.Popen(["sleep", "600"], process_group=0)
        args.orphan.write_text(str(tool.pid))
    ThreadingHTTPServer((args.hostname, args.port), Answer).serve_forever()


if __name__ == "__main__":
    main()
