"""Expiry is authorization: at ``expires_at`` an entry is unreadable everywhere; nothing extends it (R18-R20)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from freezegun import freeze_time
from support import facts

from kagent_memory_governed.keys import KeyStore
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import embed

T0 = datetime(2026, 5, 4, 9, 30, tzinfo=UTC)


async def test_an_entry_is_unreadable_from_the_instant_it_expires(store: Store, key: ScopeKey) -> None:
    with freeze_time(T0, real_asyncio=True) as frozen:
        grant = await store.grant(key, purpose="assist", policy_version="v1")
        [short] = await store.write(key, grant.generation, facts("parks at level two"), expires_in=60)
        await store.write(key, grant.generation, facts("likes tea"))

        frozen.move_to(T0 + timedelta(seconds=60) - timedelta(microseconds=1))
        assert short in {hit.entry_id for hit in await store.search(key, grant.generation, embed("parks level two"))}
        assert (await store.status(key)).entries == 2

        frozen.move_to(T0 + timedelta(seconds=60))  # expires_at == now
        hits = await store.search(key, grant.generation, embed("parks level two"), top_k=10)
        assert short not in {hit.entry_id for hit in hits}
        assert short not in {entry.entry_id for entry in (await store.inspect(key)).entries}
        assert (await store.status(key)).entries == 1


async def test_reading_never_extends_expiry(store: Store, key: ScopeKey, sql: asyncpg.Connection) -> None:
    with freeze_time(T0, real_asyncio=True) as frozen:
        grant = await store.grant(key, purpose="assist", policy_version="v1")
        [entry] = await store.write(key, grant.generation, facts("likes tea"))
        for _ in range(20):  # upstream extends rows read 10+ times; this store never does
            await store.search(key, grant.generation, embed("tea"))
            await store.inspect(key)
        expires = await sql.fetchval("SELECT expires_at FROM governed_memory.entries WHERE entry_id = $1", entry)
        assert expires == T0 + timedelta(days=7)
        frozen.move_to(T0 + timedelta(days=7))
        assert await store.search(key, grant.generation, embed("tea")) == []


async def test_expires_at_cannot_be_changed_in_sql(store: Store, key: ScopeKey, sql: asyncpg.Connection) -> None:
    grant = await store.grant(key, purpose="assist", policy_version="v1")
    [entry] = await store.write(key, grant.generation, facts("likes tea"), expires_in=60)
    for statement in (
        "UPDATE governed_memory.entries SET expires_at = expires_at + interval '1 day' WHERE entry_id = $1",
        "UPDATE governed_memory.entries SET expires_at = expires_at - interval '1 second' WHERE entry_id = $1",
        "UPDATE governed_memory.entries SET plain_text = 'rewritten' WHERE entry_id = $1",
    ):
        with pytest.raises(asyncpg.CheckViolationError, match="entries are immutable"):
            await sql.execute(statement, entry)


async def test_the_database_refuses_expiry_beyond_seven_days(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    await store.grant(key, purpose="assist", policy_version="v1")
    with pytest.raises(asyncpg.CheckViolationError, match="entries_expiry_ceiling"):
        await sql.execute(
            "INSERT INTO governed_memory.entries VALUES ($1, gen_random_uuid(), 'x', $2, 1, now(), now() + $3)",
            key.scope_id,
            str(embed("x")),
            timedelta(days=7, seconds=1),
        )


async def test_requested_expiry_is_capped_by_policy_and_consent(
    database_url: str, key_store: KeyStore, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    lowered = Store.connect(database_url, Policy(max_expiry_seconds=3600), keys=key_store)
    try:
        with freeze_time(T0, real_asyncio=True):
            grant = await lowered.grant(key, purpose="assist", policy_version="v1")
            assert grant.max_expiry_seconds == 3600
            [capped] = await lowered.write(key, grant.generation, facts("a"), expires_in=7 * 86400)
            [shorter] = await lowered.write(key, grant.generation, facts("b"), expires_in=60)
    finally:
        await lowered.close()
    rows = dict(await sql.fetch("SELECT entry_id, expires_at - created_at FROM governed_memory.entries"))
    assert rows == {capped: timedelta(hours=1), shorter: timedelta(seconds=60)}


async def test_sweep_deletes_expired_rows_physically_and_keeps_live_ones(
    store: Store, new_key: Callable[..., ScopeKey], sql: asyncpg.Connection
) -> None:
    keys = [new_key(), new_key("bob")]
    with freeze_time(T0, real_asyncio=True) as frozen:
        for key in keys:
            grant = await store.grant(key, purpose="assist", policy_version="v1")
            await store.write(key, grant.generation, facts("one", "two"), expires_in=3600)
            await store.write(key, grant.generation, facts("three"))
        frozen.move_to(T0 + timedelta(hours=1))
        assert await store.sweep(batch=1) == 4  # several batches
        assert await store.sweep() == 0
    assert await sql.fetchval("SELECT count(*) FROM governed_memory.entries") == 2


async def test_sweep_prunes_ledger_records_past_their_retention_and_keeps_the_last_erasure(
    store: Store, key: ScopeKey, database_url: str, sql: asyncpg.Connection
) -> None:
    with freeze_time(T0, real_asyncio=True) as frozen:
        grant = await store.grant(key, purpose="assist", policy_version="v1")
        [entry] = await store.write(key, grant.generation, facts("likes tea"))
        await store.forget(key, entry)
        old = await sql.fetchval("SELECT count(*) FROM governed_memory.ledger")
        frozen.move_to(T0 + timedelta(days=400))
        await store.status(key)  # a record of today
        await store.sweep(batch=2)
        assert await sql.fetchval("SELECT count(*) FROM governed_memory.ledger") == old + 2  # nothing old yet
        frozen.move_to(T0 + timedelta(days=400, seconds=1))
        await store.sweep(batch=2)  # several batches
        ages = await sql.fetch("SELECT at FROM governed_memory.ledger")
        assert len(ages) == 3 and all(row["at"] > T0 for row in ages)  # status, the first sweep, this sweep
        last = (await store.status(key)).last_erasure
        assert last is not None and last.at == T0 and last.result.value == "verified"

        lowered = Store.connect(database_url, Policy(ledger_retention_days=30), keys=store.key_store)
        try:
            frozen.move_to(T0 + timedelta(days=431))
            await lowered.sweep()
        finally:
            await lowered.close()
        assert [row["operation"] for row in await sql.fetch("SELECT operation FROM governed_memory.ledger")] == [
            "sweep"
        ]
