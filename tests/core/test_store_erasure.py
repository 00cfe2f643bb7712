"""Exact erasure: fence, delete, verify in a fresh transaction; failures leave the scope disabled (R8, R9, R12, R13)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import suppress
from typing import Any

import asyncpg
import pytest
from sqlalchemy import event
from support import facts, refusal

from kagent_memory_governed.consent import Erasure
from kagent_memory_governed.errors import GovernedMemoryError, Operation, Reason
from kagent_memory_governed.keys import Fence
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import Store, erasure
from kagent_memory_governed.testing import embed

# the fault's switches: install it ("raise" or "swallow"), remove it
Faults = tuple[Callable[[str], Awaitable[None]], Callable[[], Awaitable[None]]]


async def _consented(store: Store, key: ScopeKey, *texts: str) -> tuple[int, list[uuid.UUID]]:
    grant = await store.grant(key, purpose="assist", policy_version="v1")
    return grant.generation, await store.write(key, grant.generation, facts(*texts))


async def _rows(sql: asyncpg.Connection, key: ScopeKey) -> set[uuid.UUID]:
    return {
        r[0] for r in await sql.fetch("SELECT entry_id FROM governed_memory.entries WHERE scope_id=$1", key.scope_id)
    }


@pytest.fixture
async def failing_deletes(sql: asyncpg.Connection) -> AsyncIterator[Faults]:
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


async def test_forget_one_removes_exactly_that_entry(store: Store, key: ScopeKey, sql: asyncpg.Connection) -> None:
    generation, ids = await _consented(store, key, "likes tea", "lives in Lisbon", "deploys on Fridays")
    erased = await store.forget(key, ids[1])
    assert erased.erased == 1 and erased.generation == generation + 1
    assert await _rows(sql, key) == {ids[0], ids[2]}
    status = await store.status(key)
    assert status.last_erasure is not None
    assert status.enabled and status.entries == 2 and status.last_erasure.result is Erasure.VERIFIED
    hits = await store.search(key, status.generation, embed("lives in Lisbon"), top_k=10)
    assert ids[1] not in {hit.entry_id for hit in hits}
    assert {e.entry_id for e in (await store.inspect(key)).entries} == {ids[0], ids[2]}


async def test_forget_fences_work_admitted_before_it(store: Store, key: ScopeKey) -> None:
    generation, ids = await _consented(store, key, "likes tea")
    await store.forget(key, ids[0])
    assert await refusal(store.write(key, generation, facts("likes tea"))) is Reason.CONSENT_STALE


async def test_forgetting_an_unknown_or_foreign_entry_is_not_found_and_changes_nothing(
    store: Store, new_key: Callable[..., ScopeKey], sql: asyncpg.Connection
) -> None:
    mine, theirs = new_key(), new_key("bob")
    generation, _ = await _consented(store, mine, "likes tea")
    _, [foreign] = await _consented(store, theirs, "bob's secret")
    assert await refusal(store.forget(mine, uuid.uuid4())) is Reason.NOT_FOUND
    assert await refusal(store.forget(mine, foreign)) is Reason.NOT_FOUND
    assert await _rows(sql, theirs) == {foreign}
    assert (await store.status(mine)).generation == generation  # a refusal does not fence
    # a caller without a type checker: the store refuses what is not an entry id itself
    assert await refusal(store.forget(mine, "not-a-uuid")) is Reason.BAD_INPUT  # type: ignore[arg-type]


async def test_forget_all_verifies_zero_rows_and_keeps_consent(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    generation, _ = await _consented(store, key, "a", "b", "c")
    result = await store.forget_all(key)
    assert (result.erased, result.generation) == (3, generation + 1)
    assert await _rows(sql, key) == set()
    status = await store.status(key)
    assert status.last_erasure is not None
    assert (status.enabled, status.entries, status.last_erasure.result) == (True, 0, Erasure.VERIFIED)
    await store.write(key, status.generation, facts("a new fact"))  # consent stays


async def test_off_disables_first_then_clears_and_verifies(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    generation, _ = await _consented(store, key, "a", "b")
    result = await store.off(key)
    assert (result.erased, result.generation) == (2, generation + 1)
    assert await _rows(sql, key) == set()
    status = await store.status(key)
    assert status.last_erasure is not None
    assert (status.enabled, status.last_erasure.result) == (False, Erasure.VERIFIED)
    assert (await store.forget_all(key)).erased == 0
    assert (await store.status(key)).enabled is False  # forget-all never re-enables a disabled scope


async def test_off_before_any_consent_erases_nothing(store: Store, key: ScopeKey) -> None:
    result = await store.off(key)
    assert (result.generation, result.erased) == (0, 0)
    assert (await store.status(key)).generation == 0


async def test_a_failing_delete_leaves_the_scope_disabled_and_a_retry_completes(
    store: Store, key: ScopeKey, sql: asyncpg.Connection, failing_deletes: Faults
) -> None:
    install, remove = failing_deletes
    generation, ids = await _consented(store, key, "a", "b")
    await install("raise")
    assert await refusal(store.forget_all(key)) is Reason.ERASURE_FAILED
    status = await store.status(key)
    assert status.last_erasure is not None
    assert (status.enabled, status.last_erasure.result) == (False, Erasure.FAILED)
    assert await refusal(store.write(key, generation + 1, facts("x"))) is Reason.CONSENT_DISABLED
    assert await refusal(store.grant(key, purpose="assist", policy_version="v1")) is Reason.ERASURE_FAILED
    assert await refusal(store.forget(key, ids[0])) is Reason.ERASURE_FAILED
    failures = await sql.fetch(
        "SELECT operation, count(*) FROM governed_memory.ledger"
        " WHERE result='failed' AND reason='erasure_failed' AND scope_id=$1 GROUP BY operation",
        key.scope_id,
    )
    # forget-all failed once; status, write, grant and forget each tried to complete it first, and failed too
    assert dict(failures) == {"forget_all": 1, "complete_erasure": 4}
    await remove()
    result = await store.forget_all(key)
    assert result.erased == 2
    status = await store.status(key)
    assert status.last_erasure is not None
    assert (status.enabled, status.entries, status.last_erasure.result) == (True, 0, Erasure.VERIFIED)


async def test_a_delete_that_silently_keeps_rows_fails_verification(
    store: Store, key: ScopeKey, sql: asyncpg.Connection, failing_deletes: Faults
) -> None:
    install, remove = failing_deletes
    await _consented(store, key, "a", "b")
    await install("swallow")
    assert await refusal(store.off(key)) is Reason.ERASURE_FAILED
    status = await store.status(key)
    assert status.last_erasure is not None
    assert (status.enabled, status.last_erasure.result) == (False, Erasure.FAILED)
    await remove()
    await store.forget_all(key)  # the retry finishes what off began: everything gone, still disabled
    status = await store.status(key)
    assert status.last_erasure is not None
    assert (status.enabled, status.entries, status.last_erasure.result) == (False, 0, Erasure.VERIFIED)
    assert await _rows(sql, key) == set()


async def test_a_connection_killed_after_the_delete_committed_fails_closed(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    """The backend ends itself as the settle records its ledger row: the delete had committed, the
    verification ran, the settle is lost with the connection."""
    await _consented(store, key, "a", "b", "c")
    await sql.execute(
        "CREATE FUNCTION governed_memory.fault() RETURNS trigger LANGUAGE plpgsql"
        " AS $$ BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NULL; END $$;"
        "CREATE TRIGGER fault AFTER INSERT ON governed_memory.ledger FOR EACH ROW"
        " WHEN (NEW.operation = 'off' AND NEW.result = 'ok') EXECUTE FUNCTION governed_memory.fault()"
    )
    try:
        assert await refusal(store.off(key)) is Reason.ERASURE_FAILED
    finally:
        await sql.execute("DROP TRIGGER fault ON governed_memory.ledger; DROP FUNCTION governed_memory.fault()")
    assert await _rows(sql, key) == set()  # the delete had committed
    outcome = await sql.fetch(
        "SELECT operation, result FROM governed_memory.ledger WHERE scope_id=$1 AND operation <> 'write'"
        " ORDER BY ledger_id",
        key.scope_id,
    )
    assert [tuple(row) for row in outcome] == [("grant", "ok"), ("off", "failed")]
    # the scope's next operation verifies and settles it, still disabled (off)
    status = await store.status(key)
    assert status.last_erasure is not None
    assert (status.enabled, status.entries, status.last_erasure.result) == (False, 0, Erasure.VERIFIED)
    completed = "SELECT count(*) FROM governed_memory.ledger WHERE scope_id=$1 AND operation=$2 AND result='ok'"
    assert await sql.fetchval(completed, key.scope_id, "complete_erasure") == 1
    assert (await store.off(key)).erased == 0


async def test_a_failed_forget_one_is_recovered_by_forget_all_and_consent_resumes(
    store: Store, key: ScopeKey, failing_deletes: Faults
) -> None:
    install, remove = failing_deletes
    _, ids = await _consented(store, key, "a", "b")
    await install("raise")
    assert await refusal(store.forget(key, ids[0])) is Reason.ERASURE_FAILED
    assert (await store.status(key)).enabled is False
    await remove()
    assert (await store.forget_all(key)).erased == 2
    assert (await store.status(key)).enabled is True


@pytest.fixture
def crash_at_delete(store: Store) -> Iterator[Callable[[], None]]:
    """The process stops right after an erasure's fence committed: the task is cancelled as it calls the
    delete, so no failure is recorded either (the scope stays ``pending``, as after a crash)."""
    engine = store._engine.sync_engine  # fault injection only: tests reach the engine, package code never does

    def crash(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if statement.startswith("CALL governed_memory.clear"):
            raise asyncio.CancelledError

    event.listen(engine, "before_cursor_execute", crash)
    yield lambda: event.remove(engine, "before_cursor_execute", crash)
    if event.contains(engine, "before_cursor_execute", crash):
        event.remove(engine, "before_cursor_execute", crash)


async def _state(sql: asyncpg.Connection, key: ScopeKey) -> tuple[bool, str | None]:
    row = await sql.fetchrow("SELECT enabled, erasure FROM governed_memory.scopes WHERE scope_id=$1", key.scope_id)
    return row["enabled"], row["erasure"]


async def test_an_off_interrupted_after_its_fence_is_completed_by_sweep(
    store: Store, key: ScopeKey, sql: asyncpg.Connection, crash_at_delete: Callable[[], None]
) -> None:
    await _consented(store, key, "a", "b")
    with pytest.raises(asyncio.CancelledError):
        await store.off(key)
    crash_at_delete()
    assert await _state(sql, key) == (False, "pending") and len(await _rows(sql, key)) == 2
    await store.sweep()
    assert await _rows(sql, key) == set()
    assert await _state(sql, key) == (False, "verified")  # off: it stays disabled
    completed = await sql.fetchrow(
        "SELECT result, count FROM governed_memory.ledger WHERE scope_id=$1 AND operation='complete_erasure'",
        key.scope_id,
    )
    assert tuple(completed) == ("ok", 2)


async def test_a_forget_interrupted_after_its_fence_is_completed_exactly_by_the_next_inspect(
    store: Store, key: ScopeKey, sql: asyncpg.Connection, crash_at_delete: Callable[[], None]
) -> None:
    """The completion erases what the fence recorded, one entry, and the scope resumes as the forget would have."""
    _, ids = await _consented(store, key, "likes tea", "lives in Lisbon", "deploys on Fridays")
    with pytest.raises(asyncio.CancelledError):
        await store.forget(key, ids[1])
    crash_at_delete()
    assert await _state(sql, key) == (False, "pending")
    page = await store.inspect(key)
    assert {entry.entry_id for entry in page.entries} == {ids[0], ids[2]}
    status = await store.status(key)
    assert status.last_erasure is not None
    assert (status.enabled, status.entries, status.last_erasure.result) == (True, 2, Erasure.VERIFIED)
    await store.write(key, status.generation, facts("a new fact"))  # consent resumed under the fence's generation


async def test_each_operation_on_a_scope_completes_its_unfinished_erasure(
    store: Store, new_key: Callable[..., ScopeKey], sql: asyncpg.Connection, crash_at_delete: Callable[[], None]
) -> None:
    keys = [new_key() for _ in range(7)]
    generations = {}
    for key in keys:
        generations[key], _ = await _consented(store, key, "a fact")
        with pytest.raises(asyncio.CancelledError):
            await store.forget_all(key)
    crash_at_delete()
    fenced = [generations[key] + 1 for key in keys]
    work = [
        store.status(keys[0]),
        store.grant(keys[1], purpose="assist", policy_version="v2"),
        store.write(keys[2], generations[keys[2]], facts("x")),
        store.search(keys[3], generations[keys[3]], embed("x")),
        store.admit(keys[4], generations[keys[4]], "save", units=1),
        store.collect_turns(keys[5], generations[keys[5]], "session", ["turn"]),
        store.record_turn(keys[6], generations[keys[6]], "session", "turn", recalled=False),
    ]
    for key, operation in zip(keys, work, strict=True):
        with suppress(GovernedMemoryError):  # the data plane still refuses the stale generation
            await operation
        assert await _rows(sql, key) == set()
        assert await _state(sql, key) == (True, "verified")
    assert [(await store.status(key)).generation for key in keys] == [fenced[0], fenced[1] + 1, *fenced[2:]]


async def test_inspect_of_an_erasure_that_cannot_complete_shows_no_entries_only_the_state(
    store: Store, key: ScopeKey, failing_deletes: Faults
) -> None:
    install, remove = failing_deletes
    await _consented(store, key, "a", "b")
    await install("swallow")
    assert await refusal(store.off(key)) is Reason.ERASURE_FAILED
    assert await refusal(store.inspect(key)) is Reason.ERASURE_FAILED
    status = await store.status(key)  # the rows stay, their keys gone: none can be shown, so none is counted
    assert status.last_erasure is not None
    assert (status.enabled, status.entries, status.last_erasure.result) == (False, 0, Erasure.FAILED)
    assert await refusal(store.sweep()) is Reason.ERASURE_FAILED  # the CronJob fails, so an operator sees it
    await remove()
    assert (await store.inspect(key)).entries == []
    status = await store.status(key)
    assert status.last_erasure is not None and status.last_erasure.result is Erasure.VERIFIED


async def test_a_late_run_of_a_settled_erasure_never_deletes_what_a_new_grant_wrote(
    store: Store, key: ScopeKey, sql: asyncpg.Connection, crash_at_delete: Callable[[], None]
) -> None:
    """The original run of an erasure may resume after another run completed it and the subject consented
    again: its delete only acts while its fence stands, so the new entries stay."""
    await _consented(store, key, "old")
    with pytest.raises(asyncio.CancelledError):
        await store.forget_all(key)
    crash_at_delete()
    fenced = (await sql.fetchrow("SELECT generation FROM governed_memory.scopes WHERE scope_id=$1", key.scope_id))[0]
    await store.sweep()
    generation, [new] = await _consented(store, key, "new")
    late = Fence(fenced, withdrawn=False)
    assert await erasure._clear(store._db, key.scope_id, late, Operation.FORGET_ALL, entry_id=None) == 0
    assert await _rows(sql, key) == {new}
    status = await store.status(key)
    assert (status.enabled, status.generation, status.entries) == (True, generation, 1)
