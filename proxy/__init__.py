"""settle-proxy: a reverse proxy that makes opencode's message views agree with its liveness.

The public surface: `create_app(settings)` for a stand-alone application, `mount(parent,
prefix, settings)` to embed it in an existing aiohttp application, and `Settings`. For a
parsed body in any other framework, use `rules.settle_view` (no I/O).
"""

__version__ = "0.1.0"

from proxy.app import create_app, mount
from proxy.config import Settings, WriteBackMode

__all__ = ["Settings", "WriteBackMode", "__version__", "create_app", "mount"]
