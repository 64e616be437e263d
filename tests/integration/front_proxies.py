"""nginx and Caddy, started from the configs in `examples/`, in front of the proxy under test."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

from .http_client import free_port, port_open
from .opencode_server import REPO_ROOT
from .polling import poll

EXAMPLES = REPO_ROOT / "examples"
_EXAMPLE_LISTEN = "127.0.0.1:8080"
_EXAMPLE_PROXY = "127.0.0.1:4097"
_START_TIMEOUT_S = 15.0


class FrontProxy:
    """A web server from `examples/`, its ports rewritten to free ones; `stop()` in a finally."""

    def __init__(self, kind: str, proxy_url: str, root: Path) -> None:
        self.kind = kind
        self._root = root
        self._port = free_port()
        self._proxy = proxy_url.removeprefix("http://")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> None:
        self._root.mkdir(parents=True, exist_ok=True)
        command = self._nginx() if self.kind == "nginx" else self._caddy()
        with (self._root / "server.log").open("ab") as log:
            self._process = subprocess.Popen(
                command,
                cwd=self._root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={
                    "HOME": str(self._root),
                    "XDG_CONFIG_HOME": str(self._root),
                    "XDG_DATA_HOME": str(self._root),
                    "PATH": "/usr/sbin:/usr/bin:/bin",
                },
                start_new_session=True,
            )
        poll(
            lambda: port_open(self._port) or None, what=f"{self.kind} on {self.url}", timeout=_START_TIMEOUT_S
        )

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)

    def _example(self, name: str) -> str:
        text = (EXAMPLES / name).read_text()
        return text.replace(_EXAMPLE_LISTEN, f"127.0.0.1:{self._port}").replace(_EXAMPLE_PROXY, self._proxy)

    def _nginx(self) -> list[str]:
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        (self._root / "settle-proxy.conf").write_text(self._example("nginx/settle-proxy.conf"))
        main = f"""
daemon off;
pid {self._root}/nginx.pid;
error_log {self._root}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {self._root}/body;
    proxy_temp_path {self._root}/proxy;
    fastcgi_temp_path {self._root}/fastcgi;
    uwsgi_temp_path {self._root}/uwsgi;
    scgi_temp_path {self._root}/scgi;
    include {self._root}/settle-proxy.conf;
}}
"""
        (self._root / "nginx.conf").write_text(main)
        return [binary, "-p", str(self._root), "-c", str(self._root / "nginx.conf")]

    def _caddy(self) -> list[str]:
        binary = shutil.which("caddy") or "/usr/bin/caddy"
        # The test's own global options: no admin endpoint, so parallel runs never collide on :2019.
        (self._root / "Caddyfile").write_text("{\n\tadmin off\n}\n\n" + self._example("caddy/Caddyfile"))
        return [binary, "run", "--config", str(self._root / "Caddyfile"), "--adapter", "caddyfile"]
