"""What the followed stream showed open is kept in the state database for the proxy that runs next
on the same address: written through as the memory changes (never for a text part's deltas), read
back by the next one, which then tells a client stream that kept its state what it held open."""

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiosqlite
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.addons.live import stored as live_stored
from proxy.addons.live.addon import LiveSettle
from proxy.addons.live.memory import Kind, OpenCall, Place, Remembered, StreamMemory
from proxy.addons.live.stored import Inherited, StoredMemory
from proxy.service.app import create_app
from proxy.service.config import Settings
from proxy.testing import idle
from rules import Api, OpenTool
from tests.proxy.addons import test_live_hooks as hooks
from tests.proxy.addons.live_streams import GRACE_S, PART, V1, WRITING, WRITING_INFO, events
from tests.proxy.addons.test_live_memory import assistant, event, part
from tests.proxy.conftest import ProxyClient, following, publish
from tests.proxy.fake_opencode import FakeOpencode

ADDRESS = "127.0.0.1:4096"
OPEN = OpenTool(Api.V1, "ses_a", "msg_1", "prt_1", "bash", directory="/cwd", project="prj")
BUSY = Place("ses_a", "", "/cwd", "prj")


class Keeper:
    """Every change handed over, in order."""

    def __init__(self) -> None:
        self.changes: list[tuple[str, Kind, str]] = []

    def keep(self, kind: Kind, key: str, place: Remembered) -> None:
        del place
        self.changes.append(("keep", kind, key))

    def drop(self, kind: Kind, key: str) -> None:
        self.changes.append(("drop", kind, key))


def test_the_memory_hands_over_each_change_once() -> None:
    memory, keeper = StreamMemory(), Keeper()
    memory.kept_by(keeper)
    memory.observe(event("session.status", sessionID="ses_a", status={"type": "busy"}))
    memory.observe(assistant("msg_1", completed=False))
    memory.observe(part("prt_1", "running"))
    memory.observe(part("prt_1", "running"))  # its output grew: the same place
    memory.observe(event("message.part.updated", sessionID="ses_a", part={"id": "prt_t", "type": "text"}))
    memory.observe(part("prt_1", "completed"))
    memory.observe(assistant("msg_1", completed=True))
    memory.observe(event("session.status", sessionID="ses_a", status={"type": "idle"}))
    assert keeper.changes == [
        ("keep", "session", "ses_a"),
        ("keep", "message", "msg_1"),
        ("keep", "part", "prt_1"),
        ("drop", "part", "prt_1"),
        ("drop", "message", "msg_1"),
        ("drop", "session", "ses_a"),
    ]


def test_what_the_memory_forgets_beyond_its_bound_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("proxy.addons.live.memory.REMEMBERED", 1)
    memory, keeper = StreamMemory(), Keeper()
    memory.kept_by(keeper)
    memory.observe(part("prt_1", "running"))
    memory.observe(part("prt_2", "running"))
    assert keeper.changes == [("keep", "part", "prt_1"), ("drop", "part", "prt_1"), ("keep", "part", "prt_2")]


async def test_the_next_proxy_on_the_address_reads_what_is_left_open(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with StoredMemory.open(path, ADDRESS) as kept:
        assert await kept.load() == []
        kept.keep("part", "prt_1", OPEN)
        kept.keep("session", "ses_a", BUSY)
        kept.keep("message", "msg_1", Place("ses_a", "msg_1", "/cwd", None))
        kept.drop("message", "msg_1")
    async with StoredMemory.open(path, ADDRESS) as again:
        assert await again.load() == [Inherited("part", "prt_1", OPEN), Inherited("session", "ses_a", BUSY)]
    async with StoredMemory.open(path, "127.0.0.1:4097") as elsewhere:
        assert await elsewhere.load() == []


async def test_an_open_2x_call_is_read_back_with_the_key_it_was_named_under(tmp_path: Path) -> None:
    """A proxy killed with its 2.1.2 server: the next one on the address tells the clients that saw
    the call open (the soak's proxy rounds), so it must know the call, and under which key."""
    call = OpenCall("ses_a", "msg_1", "call_1", "callID", "/cwd")
    memory = StreamMemory()
    async with StoredMemory.open(tmp_path / "state.db", ADDRESS) as kept:
        memory.kept_by(kept)
        memory.calls["call_1"] = call
        memory.calls["call_2"] = OpenCall("ses_a", "msg_1", "call_2", "id", None)
        del memory.calls["call_2"]
    async with StoredMemory.open(tmp_path / "state.db", ADDRESS) as again:
        assert await again.load() == [Inherited("call", "call_1", call)]


async def test_only_the_newest_of_a_kind_are_read_back_and_the_rest_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live_stored, "REMEMBERED", 2)
    path = tmp_path / "state.db"
    async with StoredMemory.open(path, ADDRESS) as kept:
        for number in range(4):
            kept.keep("session", f"ses_{number}", Place(f"ses_{number}", "", None, None))
            await kept.idle()
        assert [thing.key for thing in await kept.load()] == ["ses_2", "ses_3"]
    async with aiosqlite.connect(path) as db:
        assert list(await db.execute_fetchall("SELECT count(*) FROM stream_memory")) == [(2,)]


async def test_a_row_this_proxy_cannot_read_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with StoredMemory.open(path, ADDRESS) as kept:
        kept.keep("session", "ses_a", BUSY)
    async with aiosqlite.connect(path) as db:
        await db.execute("INSERT INTO stream_memory VALUES (?, 'part', 'prt_x', '{\"tool\": 1}')", (ADDRESS,))
        await db.commit()
    async with StoredMemory.open(path, ADDRESS) as again:
        assert await again.load() == [Inherited("session", "ses_a", BUSY)]


async def test_a_write_that_fails_is_said_once_and_the_memory_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.db"
    async with StoredMemory.open(path, ADDRESS) as kept:
        async with aiosqlite.connect(path) as db:
            await db.execute(
                "CREATE TRIGGER full BEFORE INSERT ON stream_memory BEGIN SELECT RAISE(ABORT, 'disk full'); END"
            )
            await db.commit()
        memory = StreamMemory()
        memory.kept_by(kept)
        memory.observe(part("prt_1", "running"))
        await kept.idle()
        memory.observe(part("prt_2", "running"))
        await kept.idle()
    said = [r.getMessage() for r in caplog.records if "no longer kept" in r.getMessage()]
    assert said == [
        "what the event stream showed open is no longer kept for the proxy that runs next: disk full"
    ]
    assert sorted(memory.parts) == ["prt_1", "prt_2"]


def payload_kinds(frames: list[bytes]) -> list[Any]:
    return [orjson.loads(frame.removeprefix(b"data: "))["payload"]["type"] for frame in frames]


async def test_a_turn_the_proxy_before_saw_cut_while_writing_is_told_closed_and_idle(
    live: LiveSettle,
) -> None:
    keeper = Keeper()
    live.remember(
        keeper,
        [
            Inherited("session", V1, Place(V1, "", "/cwd", "prj")),
            Inherited("message", WRITING_INFO["id"], Place(V1, WRITING_INFO["id"], "/cwd", "prj")),
        ],
    )
    assert keeper.changes == []  # what was read back is not written again
    live.following()  # the first time this proxy follows the server
    assert payload_kinds(await hooks.told_a_new_stream(live)) == ["message.updated", "session.status"]
    assert ("drop", "message", WRITING_INFO["id"]) in keeper.changes


async def test_a_part_the_proxy_before_saw_open_is_told_settled(live: LiveSettle) -> None:
    live.remember(Keeper(), [Inherited("part", PART["id"], _open_part())])
    live.following()
    kinds = payload_kinds(await hooks.told_a_new_stream(live))
    assert kinds == ["message.updated", "message.part.updated", "session.status"]


async def test_nothing_is_told_of_what_was_kept_while_the_server_says_the_session_is_busy(
    live: LiveSettle, fake: FakeOpencode
) -> None:
    fake.v1_busy["/cwd"] = {V1}
    live.remember(Keeper(), [Inherited("session", V1, Place(V1, "", "/cwd", "prj"))])
    live.following()
    assert await hooks.told_a_new_stream(live) == []


def _open_part() -> OpenTool:
    tool = PART
    return OpenTool(Api.V1, V1, tool["messageID"], tool["id"], tool["tool"], directory="/cwd", project="prj")


async def test_a_proxy_started_on_the_address_of_one_that_died_mid_turn_tells_its_clients(
    upstream: TestServer,
    aiohttp_client: Callable[[web.Application], Awaitable[ProxyClient]],
    fake: FakeOpencode,
    tmp_path: Path,
) -> None:
    """Whole proxies on one state database: the first is shown a turn being written and dies with
    the server; the next, on the same address, tells a client that comes back the turn closed."""
    fake.bodies[f"/session/{V1}/message/{WRITING_INFO['id']}"] = orjson.dumps(WRITING)
    settings = Settings(
        upstream=URL(str(upstream.make_url("/"))), grace=GRACE_S, state_db=tmp_path / "state.db"
    )
    first = await aiohttp_client(create_app(settings))
    await following(first)
    await publish(first, fake, "session.status", V1, status={"type": "busy"})
    await publish(first, fake, "message.updated", V1, info=WRITING_INFO)
    await idle(first.app)  # written through
    await first.close()
    fake.drop_streams()
    second = await aiohttp_client(create_app(settings))
    await following(second)
    await idle(second.app)
    stream = events(await second.get("/global/event"))
    kinds = [event["payload"]["type"] for event in [await anext(stream) for _ in range(3)]]
    assert kinds == ["server.connected", "message.updated", "session.status"]
