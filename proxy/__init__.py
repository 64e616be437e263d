"""settle-proxy: a reverse proxy that makes opencode's message views agree with its liveness.

The public surface: `create_app(settings)` for a stand-alone application, `mount(parent,
prefix, settings)` to embed it in an existing aiohttp application, and `Settings`. For a
parsed body in any other framework, use `rules.settle_view` (no I/O).

The names are imported on first use, so importing one layer (`proxy.relay`, `proxy.opencode`)
does not build the whole application (nor `import proxy` read even the version: the command
line makes Ctrl-C quiet first).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.service.app import create_app, mount
    from proxy.service.config import Settings
    from proxy.version import VERSION as __version__
    from proxy.writeback.modes import WriteBackMode

_PUBLIC = {
    "create_app": ("proxy.service.app", "create_app"),
    "mount": ("proxy.service.app", "mount"),
    "Settings": ("proxy.service.config", "Settings"),
    "WriteBackMode": ("proxy.writeback.modes", "WriteBackMode"),
    "__version__": ("proxy.version", "VERSION"),
}
"""Each public name: the module it is imported from on first use, and its name there."""
__all__ = ["Settings", "WriteBackMode", "__version__", "create_app", "mount"]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        module, attribute = _PUBLIC[name]
        return getattr(import_module(module), attribute)
    raise AttributeError(f"module 'proxy' has no attribute {name!r}")
