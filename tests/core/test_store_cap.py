"""At most ``entry_cap`` live entries per scope, refused when full, never evicted; facts at most 512 bytes (R20)."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from freezegun import freeze_time
from support import facts, refusal

from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.keys import KeyStore
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import Store


async def _fill(store: Store, key: ScopeKey, count: int) -> int:
    grant = await store.grant(key, purpose="assist", policy_version="v1")
    await store.write(key, grant.generation, facts(*[f"fact {n}" for n in range(count)]))
    return grant.generation


async def test_the_101st_write_is_refused_and_nothing_is_evicted(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    generation = await _fill(store, key, 100)
    before = await sql.fetch("SELECT entry_id FROM governed_memory.entries ORDER BY entry_id")
    assert await refusal(store.write(key, generation, facts("one more"))) is Reason.ENTRY_CAP_REACHED
    assert await sql.fetch("SELECT entry_id FROM governed_memory.entries ORDER BY entry_id") == before


async def test_a_batch_past_the_cap_is_refused_whole(store: Store, key: ScopeKey) -> None:
    generation = await _fill(store, key, 95)
    assert await refusal(store.write(key, generation, facts(*"abcdef"))) is Reason.ENTRY_CAP_REACHED
    assert (await store.status(key)).entries == 95
    await store.write(key, generation, facts(*"abcde"))
    assert (await store.status(key)).entries == 100


async def test_twenty_writers_racing_for_the_last_slots_never_pass_the_cap(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    generation = await _fill(store, key, 95)

    async def writer(n: int) -> str:
        try:
            await store.write(key, generation, facts(f"racer {n}"))
        except GovernedMemoryError as refused:
            return refused.reason.value
        return "ok"

    results = Counter(await asyncio.gather(*(writer(n) for n in range(20))))
    assert results == {"ok": 5, "entry_cap_reached": 15}
    assert await sql.fetchval("SELECT count(*) FROM governed_memory.entries WHERE scope_id = $1", key.scope_id) == 100


async def test_expired_entries_do_not_hold_slots(store: Store, key: ScopeKey) -> None:
    t0 = datetime(2026, 2, 1, tzinfo=UTC)
    with freeze_time(t0, real_asyncio=True) as frozen:
        grant = await store.grant(key, purpose="assist", policy_version="v1")
        await store.write(key, grant.generation, facts(*[f"f{n}" for n in range(100)]), expires_in=60)
        assert await refusal(store.write(key, grant.generation, facts("x"))) is Reason.ENTRY_CAP_REACHED
        frozen.move_to(t0 + timedelta(seconds=60))
        await store.write(key, grant.generation, facts("x"))


async def test_a_lowered_cap_is_enforced(database_url: str, key_store: KeyStore, key: ScopeKey) -> None:
    lowered = Store.connect(database_url, Policy(entry_cap=3), keys=key_store)
    try:
        grant = await lowered.grant(key, purpose="assist", policy_version="v1")
        assert grant.entry_cap == 3
        await lowered.write(key, grant.generation, facts("a", "b", "c"))
        assert await refusal(lowered.write(key, grant.generation, facts("d"))) is Reason.ENTRY_CAP_REACHED
        assert (await lowered.status(key)).entry_cap == 3
    finally:
        await lowered.close()


async def test_a_cap_lowered_after_consent_applies_and_one_raised_after_consent_does_not(
    database_url: str, store: Store, key: ScopeKey
) -> None:
    lowered = Store.connect(database_url, Policy(entry_cap=2), keys=store.key_store)
    try:
        grant = await lowered.grant(key, purpose="assist", policy_version="v1")
        await lowered.write(key, grant.generation, facts("a", "b"))
        # the default store allows 100, but this scope was consented under a cap of 2
        assert await refusal(store.write(key, grant.generation, facts("c"))) is Reason.ENTRY_CAP_REACHED
        assert (await store.status(key)).entry_cap == 2
    finally:
        await lowered.close()


@pytest.mark.parametrize("fact", ["a" * 513, "é" * 256 + "a", "€" * 171])
async def test_a_fact_of_513_bytes_is_refused(store: Store, key: ScopeKey, fact: str) -> None:
    grant = await store.grant(key, purpose="assist", policy_version="v1")
    assert await refusal(store.write(key, grant.generation, facts("fine", fact))) is Reason.FACT_TOO_LARGE
    assert (await store.status(key)).entries == 0
    await store.write(key, grant.generation, facts("é" * 256))  # exactly 512 bytes


async def test_the_database_refuses_a_513_byte_fact(store: Store, key: ScopeKey, sql: asyncpg.Connection) -> None:
    """Sealed, a fact's size still shows: nonce, length, text, 768 single-precision values and tag."""
    await store.grant(key, purpose="assist", policy_version="v1")
    insert = (
        "INSERT INTO governed_memory.entries (scope_id, entry_id, sealed, generation, created_at, expires_at)"
        " VALUES ($1, gen_random_uuid(), $2, 1, now(), now() + interval '1h')"
    )
    with pytest.raises(asyncpg.CheckViolationError, match="entries_sealed_size"):
        await sql.execute(insert, key.scope_id, bytes(12 + 2 + 513 + 4 * 768 + 16))
    await sql.execute(insert, key.scope_id, bytes(12 + 2 + 512 + 4 * 768 + 16))
    with pytest.raises(asyncpg.CheckViolationError, match="entries_sealed_or_plain"):  # never both forms
        await sql.execute(
            "INSERT INTO governed_memory.entries VALUES ($1, gen_random_uuid(), 'x', $2, 1, now(),"
            " now() + interval '1h', $3)",
            key.scope_id,
            str([1.0] * 768),
            bytes(3200),
        )
