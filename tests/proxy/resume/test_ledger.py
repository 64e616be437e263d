from __future__ import annotations

import asyncio
from pathlib import Path

from proxy.resume.ledger import Ledger


async def test_a_turn_is_claimed_once_even_by_two_proxies_on_one_database(tmp_path: Path) -> None:
    path = tmp_path / "state" / "processes.db"
    async with Ledger.open(path) as first, Ledger.open(path) as second:
        claims = await asyncio.gather(
            first.claim("ses_1", "msg_1", "msg_2"), second.claim("ses_1", "msg_1", "msg_2")
        )
    assert sorted(claim.won for claim in claims) == [False, True]
    async with Ledger.open(path) as restarted:
        again = await restarted.claim("ses_1", "msg_1", "msg_2")
    assert not again.won
    assert again.owner == next(claim.owner for claim in claims if claim.won)


async def test_a_resumed_turn_interrupted_again_shares_its_budget(tmp_path: Path) -> None:
    async with Ledger.open(tmp_path / "processes.db") as ledger:
        assert (await ledger.claim("ses_1", "msg_1", "msg_2")).used == 0
        await ledger.sending("ses_1", "msg_2", "msg_3")
        await ledger.sending("ses_1", "msg_2", "msg_5")
        # The resumed turn answers our prompt msg_5, and is cut off in msg_6: the same person's turn.
        assert await ledger.used("ses_1", "msg_5", "msg_6") == 2
        assert (await ledger.claim("ses_1", "msg_5", "msg_6")).used == 2
        # A turn the person started afresh has a budget of its own.
        assert await ledger.used("ses_1", "msg_7", "msg_8") == 0


async def test_what_is_sent_is_on_disk_before_sending_returns(tmp_path: Path) -> None:
    path = tmp_path / "processes.db"
    async with Ledger.open(path) as ledger:
        await ledger.claim("ses_1", "msg_1", "msg_2")
        await ledger.sending("ses_1", "msg_2", "msg_3")
        async with Ledger.open(path) as other:
            assert await other.used("ses_1", "msg_3", "msg_4") == 1


async def test_claims_of_many_sessions_at_once_share_one_connection(tmp_path: Path) -> None:
    async with Ledger.open(tmp_path / "processes.db") as ledger:
        claims = await asyncio.gather(*(ledger.claim(f"ses_{n}", None, "msg_2") for n in range(5)))
        await asyncio.gather(*(ledger.sending(f"ses_{n}", "msg_2", f"msg_{n}") for n in range(5)))
    assert all(claim.won for claim in claims)
