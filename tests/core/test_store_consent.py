"""Consent precedes collection and retrieval; every grant and withdrawal advances the generation (R5-R8)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from freezegun import freeze_time
from support import facts, refusal

from kagent_memory_governed.errors import Reason
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import embed

SENTINEL = "SENTINEL-7d1f-the-user-secretly-hates-mondays"


async def test_nothing_can_be_written_or_read_before_consent(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    assert await refusal(store.write(key, 1, facts("likes tea"))) is Reason.CONSENT_MISSING
    assert await refusal(store.search(key, 1, embed("tea"))) is Reason.CONSENT_MISSING
    assert (await store.inspect(key)).entries == []
    status = await store.status(key)
    assert (status.enabled, status.generation, status.purpose, status.entries) == (False, 0, None, 0)
    assert await sql.fetchval("SELECT count(*) FROM governed_memory.entries") == 0


async def test_every_grant_advances_the_generation(store: Store, key: ScopeKey) -> None:
    first = await store.grant(key, purpose="assist", policy_version="v1")
    second = await store.grant(key, purpose="assist", policy_version="v2")
    assert (first.generation, second.generation) == (1, 2)
    status = await store.status(key)
    assert (status.enabled, status.generation, status.policy_version) == (True, 2, "v2")
    assert await refusal(store.write(key, 1, facts("old"))) is Reason.CONSENT_STALE


async def test_after_withdrawal_every_read_and_write_under_the_old_generation_is_refused(
    store: Store, key: ScopeKey
) -> None:
    grant = await store.grant(key, purpose="assist", policy_version="v1")
    await store.write(key, grant.generation, facts("likes tea"))
    off = await store.off(key)
    assert off.generation == grant.generation + 1
    assert await refusal(store.write(key, grant.generation, facts("x"))) is Reason.CONSENT_DISABLED
    assert await refusal(store.search(key, grant.generation, embed("tea"))) is Reason.CONSENT_DISABLED
    assert await refusal(store.write(key, off.generation, facts("x"))) is Reason.CONSENT_DISABLED
    regrant = await store.grant(key, purpose="assist", policy_version="v1")
    assert regrant.generation == off.generation + 1
    assert await refusal(store.write(key, grant.generation, facts("x"))) is Reason.CONSENT_STALE
    assert await refusal(store.search(key, off.generation, embed("tea"))) is Reason.CONSENT_STALE
    assert await store.search(key, regrant.generation, embed("tea")) == []  # the old fact is gone


async def test_consent_with_an_end_expires_at_that_instant(store: Store, key: ScopeKey) -> None:
    start = datetime(2026, 3, 1, 12, tzinfo=UTC)
    with freeze_time(start, real_asyncio=True) as frozen:
        grant = await store.grant(key, purpose="assist", policy_version="v1", valid_until=start + timedelta(hours=1))
        await store.write(key, grant.generation, facts("likes tea"))
        frozen.tick(timedelta(hours=1))
        assert await refusal(store.search(key, grant.generation, embed("tea"))) is Reason.CONSENT_EXPIRED
        assert await refusal(store.write(key, grant.generation, facts("x"))) is Reason.CONSENT_EXPIRED


async def test_bad_consent_labels_are_refused_and_nothing_is_enabled(store: Store, key: ScopeKey) -> None:
    assert await refusal(store.grant(key, purpose="has spaces", policy_version="v1")) is Reason.BAD_INPUT
    assert await refusal(store.grant(key, purpose="assist", policy_version="")) is Reason.BAD_INPUT
    naive = datetime(2030, 1, 1)
    assert await refusal(store.grant(key, purpose="a", policy_version="v1", valid_until=naive)) is Reason.BAD_INPUT
    assert (await store.status(key)).enabled is False


async def test_bad_data_plane_input_is_refused_before_the_database(store: Store, key: ScopeKey) -> None:
    grant = await store.grant(key, purpose="assist", policy_version="v1")
    g = grant.generation
    assert await refusal(store.write(key, 0, facts("x"))) is Reason.BAD_INPUT
    assert await refusal(store.write(key, g, [])) is Reason.BAD_INPUT
    assert await refusal(store.write(key, g, facts(*[f"f{n}" for n in range(101)]))) is Reason.BAD_INPUT
    assert await refusal(store.write(key, g, facts("x"), expires_in=0)) is Reason.BAD_INPUT
    assert await refusal(store.search(key, g, [0.0] * 768)) is Reason.BAD_INPUT
    assert await refusal(store.search(key, g, embed("x"), top_k=0)) is Reason.BAD_INPUT
    assert await refusal(store.search(key, g, embed("x"), min_score=2.0)) is Reason.BAD_INPUT
    assert await refusal(store.inspect(key, limit=51)) is Reason.BAD_INPUT
    assert await refusal(store.inspect(key, limit=0)) is Reason.BAD_INPUT
    assert (await store.status(key)).entries == 0


async def test_the_ledger_records_every_operation_and_holds_no_content(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    grant = await store.grant(key, purpose="assist", policy_version="v1")
    [entry] = await store.write(key, grant.generation, facts(SENTINEL))
    await store.search(key, grant.generation, embed(SENTINEL))
    await store.inspect(key)
    await refusal(store.write(key, grant.generation, facts(SENTINEL + "x" * 600)))
    forgotten = await store.forget(key, entry)
    await store.off(key)
    rows = await sql.fetch("SELECT operation, result, reason FROM governed_memory.ledger ORDER BY ledger_id")
    assert [tuple(r) for r in rows] == [
        ("grant", "ok", None),
        ("write", "ok", None),
        ("search", "ok", None),
        ("inspect", "ok", None),
        ("write", "refused", "fact_too_large"),
        ("forget", "ok", None),
        ("off", "ok", None),
    ]
    dump = await sql.fetchval("SELECT string_agg(l::text, '|') FROM governed_memory.ledger l")
    assert "SENTINEL" not in dump and "tea" not in dump
    assert str(entry) in dump and str(forgotten.generation) in dump


async def test_the_ledger_refuses_free_text_at_the_database(sql: asyncpg.Connection, store: Store) -> None:
    free_text = "user said: I hate mondays"
    with pytest.raises(asyncpg.CheckViolationError):
        await sql.execute(
            "INSERT INTO governed_memory.ledger (at, operation, result) VALUES (now(), $1, 'ok')", free_text
        )
    with pytest.raises(asyncpg.CheckViolationError):
        await sql.execute(
            "INSERT INTO governed_memory.ledger (at, operation, result, reason) VALUES (now(), 'write', 'ok', $1)",
            free_text,
        )


async def test_a_token_id_is_claimed_once_and_no_sweep_frees_it_while_the_token_may_be_spent(store: Store) -> None:
    valid_until = datetime.now(UTC) + timedelta(minutes=5)  # on the database's clock, which no test freezes
    await store.claim_once("jti-1", valid_until)
    assert await refusal(store.claim_once("jti-1", valid_until)) is Reason.ASSERTION_REPLAYED
    await store.claim_once("jti-2", valid_until)
    with freeze_time(valid_until + timedelta(days=1), real_asyncio=True):  # an application clock far ahead
        await store.sweep()
        assert await refusal(store.claim_once("jti-1", valid_until)) is Reason.ASSERTION_REPLAYED
    # when the database's clock passes valid_until, sweep deletes the record and no claim can spend it again:
    # tests/runtime/test_replay_clock.py
