"""Exact erasure: fence, delete, verify in a fresh transaction; failures leave the scope disabled (R8, R9, R12, R13)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from sqlalchemy import event
from support import facts, refusal

from kagent_memory_governed.consent import Erasure
from kagent_memory_governed.errors import Reason
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import embed


async def _consented(store: Store, key: ScopeKey, *texts: str) -> tuple[int, list[uuid.UUID]]:
    grant = await store.grant(key, purpose="assist", policy_version="v1")
    return grant.generation, await store.write(key, grant.generation, facts(*texts))


async def _rows(sql: asyncpg.Connection, key: ScopeKey) -> set[uuid.UUID]:
    return {
        r[0] for r in await sql.fetch("SELECT entry_id FROM governed_memory.entries WHERE scope_id=$1", key.scope_id)
    }


@pytest.fixture
async def failing_deletes(sql: asyncpg.Connection) -> AsyncIterator[str]:
    """Install a trigger that makes DELETE fail ('raise') or silently keep rows ('swallow')."""
    modes = {
        "raise": "BEGIN RAISE EXCEPTION 'injected fault'; END;",
        "swallow": "BEGIN RETURN NULL; END;",
    }

    async def install(mode: str) -> None:
        await sql.execute(
            "CREATE OR REPLACE FUNCTION governed_memory.fault() RETURNS trigger LANGUAGE plpgsql"
            f" AS $$ {modes[mode]} $$;"
            "CREATE TRIGGER fault BEFORE DELETE ON governed_memory.entries FOR EACH ROW"
            " EXECUTE FUNCTION governed_memory.fault()"
        )

    async def remove() -> None:
        await sql.execute(
            "DROP TRIGGER IF EXISTS fault ON governed_memory.entries; DROP FUNCTION IF EXISTS governed_memory.fault()"
        )

    yield install, remove
    await remove()


async def test_forget_one_removes_exactly_that_entry(store: Store, key: ScopeKey, sql: asyncpg.Connection):
    generation, ids = await _consented(store, key, "likes tea", "lives in Lisbon", "deploys on Fridays")
    erased = await store.forget(key, ids[1])
    assert erased.erased == 1 and erased.generation == generation + 1
    assert await _rows(sql, key) == {ids[0], ids[2]}
    status = await store.status(key)
    assert status.enabled and status.entries == 2 and status.last_erasure.result is Erasure.VERIFIED
    hits = await store.search(key, status.generation, embed("lives in Lisbon"), top_k=10)
    assert ids[1] not in {hit.entry_id for hit in hits}
    assert {e.entry_id for e in (await store.inspect(key)).entries} == {ids[0], ids[2]}


async def test_forget_fences_work_admitted_before_it(store: Store, key: ScopeKey):
    generation, ids = await _consented(store, key, "likes tea")
    await store.forget(key, ids[0])
    assert await refusal(store.write(key, generation, facts("likes tea"))) is Reason.CONSENT_STALE


async def test_forgetting_an_unknown_or_foreign_entry_is_not_found_and_changes_nothing(
    store: Store, new_key, sql: asyncpg.Connection
):
    mine, theirs = new_key(), new_key("bob")
    generation, _ = await _consented(store, mine, "likes tea")
    _, [foreign] = await _consented(store, theirs, "bob's secret")
    assert await refusal(store.forget(mine, uuid.uuid4())) is Reason.NOT_FOUND
    assert await refusal(store.forget(mine, foreign)) is Reason.NOT_FOUND
    assert await _rows(sql, theirs) == {foreign}
    assert (await store.status(mine)).generation == generation  # a refusal does not fence
    assert await refusal(store.forget(mine, "not-a-uuid")) is Reason.BAD_INPUT


async def test_forget_all_verifies_zero_rows_and_keeps_consent(store: Store, key: ScopeKey, sql: asyncpg.Connection):
    generation, _ = await _consented(store, key, "a", "b", "c")
    result = await store.forget_all(key)
    assert (result.erased, result.generation) == (3, generation + 1)
    assert await _rows(sql, key) == set()
    status = await store.status(key)
    assert (status.enabled, status.entries, status.last_erasure.result) == (True, 0, Erasure.VERIFIED)
    await store.write(key, status.generation, facts("a new fact"))  # consent stays


async def test_off_disables_first_then_clears_and_verifies(store: Store, key: ScopeKey, sql: asyncpg.Connection):
    generation, _ = await _consented(store, key, "a", "b")
    result = await store.off(key)
    assert (result.erased, result.generation) == (2, generation + 1)
    assert await _rows(sql, key) == set()
    status = await store.status(key)
    assert (status.enabled, status.last_erasure.result) == (False, Erasure.VERIFIED)
    assert (await store.forget_all(key)).erased == 0
    assert (await store.status(key)).enabled is False  # forget-all never re-enables a disabled scope


async def test_off_before_any_consent_erases_nothing(store: Store, key: ScopeKey):
    result = await store.off(key)
    assert (result.generation, result.erased) == (0, 0)
    assert (await store.status(key)).generation == 0


async def test_a_failing_delete_leaves_the_scope_disabled_and_a_retry_completes(
    store: Store, key: ScopeKey, sql: asyncpg.Connection, failing_deletes
):
    install, remove = failing_deletes
    generation, ids = await _consented(store, key, "a", "b")
    await install("raise")
    assert await refusal(store.forget_all(key)) is Reason.ERASURE_FAILED
    status = await store.status(key)
    assert (status.enabled, status.last_erasure.result) == (False, Erasure.FAILED)
    assert await refusal(store.write(key, generation + 1, facts("x"))) is Reason.CONSENT_DISABLED
    assert await refusal(store.grant(key, purpose="assist", policy_version="v1")) is Reason.ERASURE_FAILED
    assert await refusal(store.forget(key, ids[0])) is Reason.ERASURE_FAILED
    failures = await sql.fetchval(
        "SELECT count(*) FROM governed_memory.ledger WHERE result='failed' AND reason='erasure_failed' AND scope_id=$1",
        key.scope_id,
    )
    assert failures == 1
    await remove()
    result = await store.forget_all(key)
    assert result.erased == 2
    status = await store.status(key)
    assert (status.enabled, status.entries, status.last_erasure.result) == (True, 0, Erasure.VERIFIED)


async def test_a_delete_that_silently_keeps_rows_fails_verification(
    store: Store, key: ScopeKey, sql: asyncpg.Connection, failing_deletes
):
    install, remove = failing_deletes
    await _consented(store, key, "a", "b")
    await install("swallow")
    assert await refusal(store.off(key)) is Reason.ERASURE_FAILED
    status = await store.status(key)
    assert (status.enabled, status.last_erasure.result) == (False, Erasure.FAILED)
    await remove()
    await store.forget_all(key)  # the retry finishes what off began: everything gone, still disabled
    status = await store.status(key)
    assert (status.enabled, status.entries, status.last_erasure.result) == (False, 0, Erasure.VERIFIED)
    assert await _rows(sql, key) == set()


async def test_a_connection_killed_between_delete_and_verify_fails_closed(store: Store, key: ScopeKey):
    await _consented(store, key, "a", "b", "c")
    killed = []

    def kill_before_verify(conn, cursor, statement, parameters, context, executemany):
        if not killed and statement.startswith("SELECT count(*)") and "expires_at" not in statement:
            killed.append(True)
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    engine = store._engine.sync_engine  # fault injection only: tests reach the engine, package code never does
    event.listen(engine, "before_cursor_execute", kill_before_verify)
    try:
        assert await refusal(store.off(key)) is Reason.ERASURE_FAILED
    finally:
        event.remove(engine, "before_cursor_execute", kill_before_verify)
    assert killed
    status = await store.status(key)
    assert (status.enabled, status.last_erasure.result) == (False, Erasure.FAILED)
    assert (await store.off(key)).erased == 0  # the delete had committed; the retry verifies
    status = await store.status(key)
    assert (status.enabled, status.entries, status.last_erasure.result) == (False, 0, Erasure.VERIFIED)


async def test_a_failed_forget_one_is_recovered_by_forget_all_and_consent_resumes(
    store: Store, key: ScopeKey, failing_deletes
):
    install, remove = failing_deletes
    _, ids = await _consented(store, key, "a", "b")
    await install("raise")
    assert await refusal(store.forget(key, ids[0])) is Reason.ERASURE_FAILED
    assert (await store.status(key)).enabled is False
    await remove()
    assert (await store.forget_all(key)).erased == 2
    assert (await store.status(key)).enabled is True
