"""Auto-save input in the store: turns recorded only when admitted, collected once and only under the
generation they were admitted under; a fact equal to a live entry is never stored twice (R36)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

import asyncpg
from freezegun import freeze_time
from support import facts, refusal

from kagent_memory_governed.clock import now
from kagent_memory_governed.errors import Reason
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import Store, Turn


async def _grant(store: Store, key: ScopeKey) -> int:
    return (await store.grant(key, purpose="assist", policy_version="v1")).generation


async def test_a_turn_is_recorded_only_under_the_current_consent(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    assert await store.record_turn(key, 1, "session", "before-consent", recalled=False) == 0
    generation = await _grant(store, key)
    assert await store.record_turn(key, generation + 1, "session", "stale", recalled=False) == 0
    assert await store.record_turn(key, generation, "session", "one", recalled=False) == 1
    assert await store.record_turn(key, generation, "session", "two", recalled=True) == 2
    assert await store.record_turn(key, generation, "another session", "three", recalled=False) == 1
    off = await store.off(key)
    assert await store.record_turn(key, off.generation, "session", "while-off", recalled=False) == 0
    rows = await sql.fetch("SELECT * FROM governed_memory.turns")
    assert len(rows) == 3
    assert not any("session" in str(value) or "one" == value for row in rows for value in row.values())


async def test_turns_are_collected_once_and_only_those_asked_for(store: Store, key: ScopeKey) -> None:
    generation = await _grant(store, key)
    for invocation in ("a", "b", "c"):
        await store.record_turn(key, generation, "session", invocation, recalled=invocation == "b")
    taken = await store.collect_turns(key, generation, "session", ["a", "b", "not-recorded"])
    assert sorted(taken, key=lambda turn: turn.invocation_id) == [Turn("a", False), Turn("b", True)]
    assert await store.collect_turns(key, generation, "session", ["a", "b"]) == []  # at most once
    assert await store.collect_turns(key, generation, "session", ["c"]) == [Turn("c", False)]


async def test_turns_admitted_before_an_erasure_are_never_collected(store: Store, key: ScopeKey) -> None:
    generation = await _grant(store, key)
    await store.record_turn(key, generation, "session", "before", recalled=False)
    later = (await store.forget_all(key)).generation
    await store.record_turn(key, later, "session", "after", recalled=False)
    assert await store.collect_turns(key, later, "session", ["before", "after"]) == [Turn("after", False)]
    assert await refusal(store.collect_turns(key, generation, "session", ["before"])) is Reason.CONSENT_STALE


async def test_collection_is_fenced(store: Store, key: ScopeKey) -> None:
    generation = await _grant(store, key)
    await store.record_turn(key, generation, "session", "a", recalled=False)
    off = await store.off(key)
    assert await refusal(store.collect_turns(key, generation, "session", ["a"])) is Reason.CONSENT_DISABLED
    assert await refusal(store.collect_turns(key, off.generation, "session", ["a"])) is Reason.CONSENT_DISABLED


async def test_sweep_drops_turns_that_can_no_longer_be_collected(
    store: Store, key: ScopeKey, new_key: Callable[..., ScopeKey], sql: asyncpg.Connection
) -> None:
    stale_key, old_key = new_key(), new_key()
    for scope in (key, stale_key, old_key):
        await store.record_turn(scope, await _grant(store, scope), "session", "a", recalled=False)
    await store.forget_all(stale_key)
    with freeze_time(now() - timedelta(days=8), real_asyncio=True):
        await store.record_turn(old_key, 1, "session", "old", recalled=False)
    await store.sweep()
    kept = await sql.fetch("SELECT scope_id, invocation_ref FROM governed_memory.turns")
    assert {row["scope_id"] for row in kept} == {key.scope_id, old_key.scope_id} and len(kept) == 2


async def test_a_fact_equal_to_a_live_entry_keeps_the_entry_and_its_expiry(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    generation = await _grant(store, key)
    [first] = await store.write(key, generation, facts("I drink lapsang souchong"))
    expires = await sql.fetchval("SELECT expires_at FROM governed_memory.entries")
    with freeze_time(now() + timedelta(hours=5), real_asyncio=True):
        again = await store.write(key, generation, facts(" I drink\nlapsang  souchong", "a new fact"))
    assert again[0] == first
    rows = await sql.fetch("SELECT entry_id, expires_at FROM governed_memory.entries WHERE entry_id = $1", first)
    assert [row["expires_at"] for row in rows] == [expires]
    assert (await store.status(key)).entries == 2
    counts = await sql.fetch("SELECT count FROM governed_memory.ledger WHERE operation = 'write' ORDER BY ledger_id")
    assert [row["count"] for row in counts] == [1, 1]  # the ledger counts what was added


async def test_concurrent_writes_of_one_fact_store_it_once(store: Store, key: ScopeKey) -> None:
    generation = await _grant(store, key)
    ids = await asyncio.gather(*(store.write(key, generation, facts("the same fact")) for _ in range(8)))
    assert len({entry_id for [entry_id] in ids}) == 1
    assert (await store.status(key)).entries == 1


async def test_a_forgotten_fact_can_be_stored_again_as_a_new_entry(store: Store, key: ScopeKey) -> None:
    generation = await _grant(store, key)
    [first] = await store.write(key, generation, facts("I drink lapsang souchong"))
    later = (await store.forget(key, first)).generation
    [second] = await store.write(key, later, facts("I drink lapsang souchong"))  # said anew, after consent
    assert second != first
