"""The hot path (#17): each data-plane operation is one statement in one round trip, with every guarantee
kept: the cap under writers that waited for the scope lock, one fence and one ledger row for a prefetch,
binary vectors, and a pool that replaces dead connections without a pre-ping."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import cast

import asyncpg
import pytest
from sqlalchemy import event, text
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection
from support import facts, keys_of, make_key, refusal

from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.policy import EMBEDDING_DIMENSIONS, Policy
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import NewFact, Store, entry_format, turn_ref
from kagent_memory_governed.testing import embed


@pytest.fixture
def wire(store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """What the store sends: every statement, and every BEGIN the driver issues."""
    sent: list[str] = []
    original = cast(
        Callable[[AsyncAdapt_asyncpg_connection], Awaitable[None]],  # SQLAlchemy leaves it unannotated
        AsyncAdapt_asyncpg_connection._start_transaction,
    )

    async def counting(self: AsyncAdapt_asyncpg_connection) -> None:
        if self.isolation_level != "autocommit":
            sent.append("BEGIN")
        return await original(self)

    def statement(
        conn: object, cursor: object, text: str, parameters: object, context: object, executemany: bool
    ) -> None:
        sent.append(text)

    monkeypatch.setattr(AsyncAdapt_asyncpg_connection, "_start_transaction", counting)
    engine = store._engine.sync_engine  # observation only: package code never reaches the engine
    event.listen(engine, "before_cursor_execute", statement)
    yield sent
    event.remove(engine, "before_cursor_execute", statement)


async def test_each_data_plane_operation_is_one_statement_without_a_transaction_block(
    store: Store, key: ScopeKey, wire: list[str]
) -> None:
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    operations: dict[str, Callable[[], Awaitable[object]]] = {
        "admit": lambda: store.admit(key, generation, "save", units=1, explicit=True),
        "write": lambda: store.write(key, generation, facts("likes green tea", "lives in Lisbon")),
        "search": lambda: store.search(key, generation, embed("tea")),
        "prefetch": lambda: store.search_many(key, generation, [embed("tea"), embed("Lisbon"), embed("x")]),
        "record_turn": lambda: store.record_turn(key, generation, "session", "invocation", recalled=False),
        "collect_turns": lambda: store.collect_turns(key, generation, "session", ["invocation"]),
    }
    for name, operation in operations.items():
        wire.clear()
        await operation()
        assert len(wire) == 1 and "governed_memory." in wire[0], name
    wire.clear()
    await refusal(store.write(key, generation + 1, facts("stale")))  # a refusal is the same one round trip
    assert len(wire) == 1


async def test_an_erasure_is_the_fence_then_one_call(store: Store, key: ScopeKey, wire: list[str]) -> None:
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    await store.write(key, generation, facts(*[f"fact {n}" for n in range(100)]))
    wire.clear()
    assert (await store.off(key)).erased == 100
    kinds = [text.split(None, 1)[0] for text in wire]
    assert kinds == ["UPDATE", "CALL"]  # the fence; then delete, commit, verify, settle with its ledger row


async def test_writers_that_waited_for_the_scope_lock_count_what_the_first_committed(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    """The form that broke the cap: counting on a snapshot taken before the lock wait. Both writers queue
    behind a held scope lock; each batch fits alone, the two together do not."""
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    await store.write(key, generation, facts(*[f"fact {n}" for n in range(90)]))
    for trial in range(5):
        async with sql.transaction():
            await sql.execute("SELECT 1 FROM governed_memory.scopes WHERE scope_id = $1 FOR UPDATE", key.scope_id)
            writers = [
                asyncio.ensure_future(store.write(key, generation, facts(*[f"t{trial} w{w} {n}" for n in range(6)])))
                for w in range(2)
            ]
            for _ in range(3000):  # until both writers wait for the lock this transaction holds
                if await sql.fetchval("SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted") >= 2:
                    break
                await asyncio.sleep(0.001)
        outcomes: Counter[str] = Counter()
        for writer in writers:
            try:
                await writer
                outcomes["ok"] += 1
            except GovernedMemoryError as refused:
                outcomes[refused.reason.value] += 1
        live = await sql.fetchval("SELECT count(*) FROM governed_memory.entries WHERE scope_id = $1", key.scope_id)
        assert outcomes == {"ok": 1, "entry_cap_reached": 1}  # room for one batch: the second counted the first's
        assert live == 96
        await store.forget_all(key)
        generation = (await store.status(key)).generation
        await store.write(key, generation, facts(*[f"fact {n}" for n in range(90)]))


async def test_a_prefetch_is_one_fence_one_snapshot_and_one_ledger_row(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    await store.write(key, generation, facts("likes green tea", "lives in Lisbon", "plays chess", "owns a cat"))
    queries = [embed("green tea"), embed("Lisbon"), embed("chess cat")]
    together = await store.search_many(key, generation, queries, top_k=2)
    apart = [await store.search(key, generation, query, top_k=2) for query in queries]
    assert [[hit.entry_id for hit in hits] for hits in together] == [[hit.entry_id for hit in hits] for hits in apart]
    assert [hits[0].text for hits in together] == ["likes green tea", "lives in Lisbon", "plays chess"]
    rows = await sql.fetch(
        "SELECT result, count FROM governed_memory.ledger WHERE scope_id = $1 AND operation = 'search'"
        " ORDER BY ledger_id",
        key.scope_id,
    )
    assert [tuple(row) for row in rows] == [("ok", 4)] * 4  # the entries read (and opened, ranked in the process)
    assert await refusal(store.search_many(key, generation + 1, queries)) is Reason.CONSENT_STALE
    refused = await sql.fetch(
        "SELECT reason FROM governed_memory.ledger WHERE scope_id = $1 AND result = 'refused'", key.scope_id
    )
    assert [row["reason"] for row in refused] == ["consent_stale"]


@pytest.mark.parametrize("count", [0, Policy().prefetch_max_subqueries + 1])
async def test_a_prefetch_of_no_or_too_many_subqueries_is_bad_input(store: Store, key: ScopeKey, count: int) -> None:
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    assert await refusal(store.search_many(key, generation, [embed("q")] * count)) is Reason.BAD_INPUT


@pytest.mark.parametrize("value", [3.5e38, float("inf"), float("nan")])
async def test_a_vector_value_beyond_single_precision_is_bad_input(store: Store, key: ScopeKey, value: float) -> None:
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    vector = [0.0] * EMBEDDING_DIMENSIONS
    vector[7] = value
    assert await refusal(store.search(key, generation, vector)) is Reason.BAD_INPUT
    assert await refusal(store.write(key, generation, [NewFact("x", vector)])) is Reason.BAD_INPUT


async def test_vectors_are_sealed_as_sent(store: Store, key: ScopeKey, sql: asyncpg.Connection) -> None:
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    [entry_id] = await store.write(key, generation, facts("likes green tea"))
    row = await sql.fetchrow("SELECT * FROM governed_memory.entries WHERE entry_id = $1", entry_id)
    assert row["plain_text"] is None and row["plain_embedding"] is None  # only the ciphertext is stored
    keyring = await store.key_store.fetch(key.scope_id)
    [opened] = entry_format.open_entries(
        key.scope_id, [entry_format.Row(*(row[c] for c in entry_format.Row._fields))], keyring
    )
    assert opened.text == "likes green tea"
    assert opened.embedding.tolist() == pytest.approx(embed("likes green tea"), abs=1e-7)
    [hit] = await store.search(key, generation, embed("likes green tea"), top_k=1)
    assert hit.score == pytest.approx(1.0, abs=1e-6)


async def test_a_pooled_connection_killed_while_idle_is_replaced_without_a_pre_ping(
    database_url: str, key: ScopeKey, sql: asyncpg.Connection, store: Store
) -> None:
    """No pre-ping round trip, yet the first operation after its backends were killed succeeds."""
    own = Store.connect(database_url, Policy(), keys=store.key_store, pool_size=2, max_overflow=0)
    pooled = []
    event.listen(own._engine.sync_engine, "checkin", lambda connection, record: pooled.append(connection))
    try:
        assert own._engine.pool._pre_ping is False
        generation = (await own.grant(key, purpose="assist", policy_version="v1")).generation
        await asyncio.gather(*(own.search(key, generation, embed("warm")) for _ in range(2)))  # two pooled
        idle = (
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'kagent-memory-governed' AND state = 'idle'"
            " AND pid <> pg_backend_pid()"
        )
        await sql.execute(f"SELECT pg_terminate_backend(pid) FROM ({idle}) AS idle")
        for _ in range(1000):  # the driver notices each closed socket when the event loop reads it
            if all(connection.driver_connection.is_closed() for connection in pooled):
                break
            await asyncio.sleep(0.001)
        assert all(connection.driver_connection.is_closed() for connection in pooled)
        await own.write(key, generation, facts("after the kill"))
        [hit] = await own.search(key, generation, embed("after the kill"), top_k=1)
        assert hit.text == "after the kill"
    finally:
        await own.close()


async def test_turn_references_are_name_based_and_the_count_is_per_generation(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    assert [await store.record_turn(key, generation, "s", f"i{n}", recalled=False) for n in range(3)] == [1, 2, 3]
    assert await store.record_turn(key, generation, "s", "i0", recalled=True) == 3  # recorded once
    refs = await sql.fetch(
        "SELECT invocation_ref, recalled FROM governed_memory.turns WHERE scope_id = $1", key.scope_id
    )
    assert {row["invocation_ref"]: row["recalled"] for row in refs}[turn_ref("i0")] is True
    assert await store.record_turn(key, generation + 1, "s", "i9", recalled=False) == 0  # fenced: not recorded


async def test_a_scope_is_read_by_its_key_never_through_the_expiry_index(
    store: Store, database_url: str, sql: asyncpg.Connection
) -> None:
    """Every per-scope read finds the scope's rows by the primary key, even under the generic plan PostgreSQL
    caches for a prepared statement or a function after five calls: joined with the expiry index, a read would
    scan that index over every live entry of every scope (11.8 ms at 100,000 entries, #29). The expiry index is
    the sweep's alone. Counted from the server's own statistics: each store keeps one connection, whose pending
    counts the server flushes before it answers ``pg_stat_force_next_flush()``."""
    await sql.execute("DROP DATABASE IF EXISTS by_key")
    await sql.execute("CREATE DATABASE by_key")
    url = database_url.replace("/postgres?", "/by_key?")
    direct = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))

    async def index_scans(store: Store) -> dict[str, int]:
        async with store._engine.connect() as conn:  # the store's one session: its counts flushed, then read
            await conn.execute(text("SELECT pg_stat_force_next_flush()"))
        rows = await direct.fetch(
            "SELECT indexrelname, idx_scan FROM pg_stat_user_indexes WHERE relname = 'entries'"
            " AND schemaname = 'governed_memory'"
        )
        return {row["indexrelname"]: row["idx_scan"] for row in rows}

    try:
        migrating = Store.connect(url, Policy(), keys=keys_of(url))  # migrate takes two sessions: the lock's too
        await migrating.migrate()
        await migrating.close()
        loading = Store.connect(url, Policy(), keys=keys_of(url), pool_size=1, max_overflow=0)
        keys = [make_key(f"reader{i}") for i in range(20)]
        for key in keys:
            generation = (await loading.grant(key, purpose="assist", policy_version="v1")).generation
            await loading.write(key, generation, [NewFact(f"fact {i}", embed(f"fact {i}")) for i in range(100)])
        before = await index_scans(loading)
        await loading.close()
        await sql.execute("ALTER DATABASE by_key SET plan_cache_mode = force_generic_plan")  # new sessions

        reading = Store.connect(url, Policy(), keys=keys_of(url), pool_size=1, max_overflow=0)
        for key in keys[:8]:
            await reading.search(key, 1, embed("fact 3"))
            await reading.search_many(key, 1, [embed("fact 4"), embed("fact 5")])
            await reading.write(key, 1, [NewFact("fact 7", embed("fact 7"))])  # held already: the scope is read
            await reading.inspect(key, limit=10)
            await reading.status(key)
        after = await index_scans(reading)
        await reading.close()
    finally:
        await direct.close()
        await sql.execute("DROP DATABASE by_key WITH (FORCE)")
    assert after["entries_pkey"] - before["entries_pkey"] == 8 * 5  # the statistics count each read once
    assert after["entries_by_expiry"] == before["entries_by_expiry"]
