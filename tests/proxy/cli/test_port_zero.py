"""`--port 0`, as users start it: the banner and `/_settle/health` name the port the system gave."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys

import aiohttp
from aiohttp.test_utils import TestServer

BANNER = re.compile(rb"settle-proxy \S+ on http://127\.0\.0\.1:(\d+) -> ")


async def test_port_zero_names_the_port_bound(upstream: TestServer) -> None:
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "proxy", "--upstream", str(upstream.make_url("/")), "--port", "0"),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert process.stderr is not None
    try:
        async with asyncio.timeout(30):
            while not (banner := BANNER.search(await process.stderr.readline())):
                assert process.returncode is None
        port = int(banner[1])
        assert port != 0
        async with (
            aiohttp.ClientSession() as client,
            client.get(f"http://127.0.0.1:{port}/_settle/health") as response,
        ):
            assert response.status == 200
            assert (await response.json())["listening"] == {"host": "127.0.0.1", "port": port}
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), timeout=10)
