"""The one upstream `ClientSession` the application owns, and the keys to find it.

Forwarded requests go through `relay/transport.py`; this session carries the proxy's own
requests (liveness, write-back, `/global/event`) and relayed WebSockets. It keeps connections
alive across requests, never decompresses (bodies pass through under their own
`Content-Encoding`), never keeps cookies (they belong to the clients, not to the proxy) and
never adds headers the client did not send.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from aiohttp import hdrs, web

from proxy.relay.options import RELAY

UPSTREAM = web.AppKey("upstream", aiohttp.ClientSession)
MOUNT_PREFIX = web.AppKey("mount_prefix", str)
"""Where the proxy is mounted inside another application ("" when it runs on its own)."""
_READ_BUFFER = 2**18


def upstream_path(request: web.Request) -> str:
    """The path (raw, with its query) the upstream must see: without the mount prefix."""
    return request.raw_path.removeprefix(request.app.get(MOUNT_PREFIX, ""))


def opencode_path(request: web.Request) -> str:
    """The decoded path as opencode routes it, for matching its routes."""
    return request.path.removeprefix(request.app.get(MOUNT_PREFIX, ""))


async def upstream_session(app: web.Application) -> AsyncIterator[None]:
    """`cleanup_ctx` entry: open the upstream session at start-up, close it at shutdown."""
    timeout = aiohttp.ClientTimeout(total=None, connect=app[RELAY].connect_timeout)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None),
        timeout=timeout,
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=(hdrs.USER_AGENT, hdrs.ACCEPT, hdrs.ACCEPT_ENCODING),
        read_bufsize=_READ_BUFFER,
    ) as session:
        app[UPSTREAM] = session
        yield
