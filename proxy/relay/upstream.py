"""The one upstream `ClientSession` the application owns.

Forwarded requests go through `relay/transport.py`; this session carries the proxy's own
requests (liveness, write-back, `/global/event`) and relayed WebSockets. It keeps connections
alive across requests, never decompresses (bodies pass through under their own
`Content-Encoding`), never keeps cookies (they belong to the clients, not to the proxy) and
never adds headers the client did not send.
"""

from __future__ import annotations

import aiohttp
from aiohttp import hdrs

_READ_BUFFER = 2**18


def upstream_session(connect_timeout: float) -> aiohttp.ClientSession:
    """The upstream session, to be opened at start-up (in a running loop) and closed at shutdown
    (`async with`)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None),
        timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=(hdrs.USER_AGENT, hdrs.ACCEPT, hdrs.ACCEPT_ENCODING),
        read_bufsize=_READ_BUFFER,
    )
