"""settle-proxy: a reverse proxy that makes opencode's message views agree with its liveness."""

__version__ = "0.1.0"
