"""Control reads are admitted against a per-scope limit and bounded in what they write (#27 finding 4): a
reusable ``status`` token once made one ledger row per call, without limit."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

import httpx
import pytest
from freezegun import freeze_time
from support import refusal

from kagent_memory_governed import clock
from kagent_memory_governed.errors import PolicyError, Reason
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import Bridge, ScriptedModel, build_app

if TYPE_CHECKING:
    import asyncpg

    from kagent_memory_governed import Runtime
    from kagent_memory_governed.scope import ScopeKey

READ_ROWS = "SELECT count(*) FROM governed_memory.ledger WHERE operation IN ('status', 'inspect')"


async def test_a_reused_status_token_is_refused_past_the_hourly_limit_and_writes_nothing_more(
    runtime: Runtime, store: Store, bridge: Bridge, sql: asyncpg.Connection
) -> None:
    app = build_app(ScriptedModel())
    token = {"Authorization": f"Bearer {bridge.sign(time.time(), 'control', op='status')}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
        answers = [await http.get("/memory/v1/status", headers=token) for _ in range(150)]
    assert [a.status_code for a in answers] == [200] * 120 + [429] * 30
    assert answers[-1].json() == {"error": "rate_limited"}
    assert await sql.fetchval(READ_ROWS) == 120  # the audit record of every admitted read, nothing more


async def test_reads_of_one_scope_share_the_limit_and_it_frees_as_the_hour_passes(
    store: Store, database_url: str, new_key: Callable[..., ScopeKey], sql: asyncpg.Connection
) -> None:
    # the policy may lower it
    lowered = Store.connect(database_url, Policy(control_reads_per_hour=3), keys=store.key_store)
    key, other = new_key(), new_key()
    try:
        with freeze_time(clock.now(), real_asyncio=True) as frozen:
            await lowered.status(key)
            await lowered.inspect(key)
            frozen.tick(timedelta(minutes=30))
            await lowered.status(key)
            for read in (lowered.status(key), lowered.inspect(key)):
                assert await refusal(read) is Reason.RATE_LIMITED
            await lowered.status(other)  # another scope has its own
            frozen.tick(timedelta(minutes=30, seconds=1))  # the first two left the window
            await lowered.inspect(key)
            await lowered.status(key)
    finally:
        await lowered.close()
    assert await sql.fetchval(READ_ROWS) == 6


def test_the_read_limit_is_a_ceiling_a_policy_may_only_lower() -> None:
    assert Policy().control_reads_per_hour == 120
    assert Policy.from_mapping({"control_reads_per_hour": 10}).control_reads_per_hour == 10
    with pytest.raises(PolicyError, match="^control_reads_per_hour: 121 is above its ceiling 120"):
        Policy.from_mapping({"control_reads_per_hour": 121})
