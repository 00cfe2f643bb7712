"""Offboarding disables every scope of the exact principal first, then clears and verifies each (R29)."""

from __future__ import annotations

from collections.abc import Callable

import asyncpg
from support import facts, refusal

from kagent_memory_governed.consent import Erasure
from kagent_memory_governed.errors import Reason
from kagent_memory_governed.scope import Origin, ScopeKey
from kagent_memory_governed.store import Store


async def _consented(store: Store, key: ScopeKey, *texts: str) -> int:
    grant = await store.grant(key, purpose="assist", policy_version="v1")
    await store.write(key, grant.generation, facts(*texts))
    return grant.generation


async def test_offboarding_clears_every_scope_of_the_principal_across_agents(
    store: Store, new_key: Callable[..., ScopeKey], sql: asyncpg.Connection
) -> None:
    alice = [
        new_key(agent="kagent/helper"),
        new_key(agent="kagent/helper"),  # another control room
        new_key(agent="kagent/planner"),
        new_key(agent="team-b/helper"),
    ]
    bystanders = [new_key("bob"), new_key(origin=Origin.APPSERVICE)]  # same MXID, other origin: another principal
    generations = {key: await _consented(store, key, "fact one", "fact two") for key in alice + bystanders}

    result = await store.offboard(alice[0].principal)

    assert (result.scopes, result.erased) == (4, 8)
    for key in alice:
        status = await store.status(key)
        assert status.last_erasure is not None
        assert (status.enabled, status.entries, status.last_erasure.result) == (False, 0, Erasure.VERIFIED)
        assert await refusal(store.write(key, generations[key], facts("x"))) is Reason.CONSENT_DISABLED
    ids = [key.scope_id for key in alice]
    assert await sql.fetchval("SELECT count(*) FROM governed_memory.entries WHERE scope_id = ANY($1)", ids) == 0
    for key in bystanders:
        status = await store.status(key)
        assert (status.enabled, status.entries, status.generation) == (True, 2, generations[key])


async def test_offboarding_an_unknown_principal_is_an_empty_verified_result(
    store: Store, new_key: Callable[..., ScopeKey]
) -> None:
    result = await store.offboard(new_key("nobody").principal)
    assert (result.scopes, result.erased) == (0, 0)


async def test_offboarding_reports_a_failed_scope_and_keeps_it_disabled(
    store: Store, new_key: Callable[..., ScopeKey], sql: asyncpg.Connection
) -> None:
    first, second = new_key(), new_key()
    await _consented(store, first, "a")
    await _consented(store, second, "b")
    await sql.execute(
        "CREATE FUNCTION governed_memory.fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END; $$;"
        "CREATE TRIGGER fault BEFORE DELETE ON governed_memory.entries FOR EACH ROW"
        " EXECUTE FUNCTION governed_memory.fault()"
    )
    try:
        assert await refusal(store.offboard(first.principal)) is Reason.ERASURE_FAILED
        for key in (first, second):
            status = await store.status(key)
            assert status.last_erasure is not None
            assert (status.enabled, status.last_erasure.result) == (False, Erasure.FAILED)
    finally:
        await sql.execute("DROP TRIGGER fault ON governed_memory.entries; DROP FUNCTION governed_memory.fault()")
    result = await store.offboard(first.principal)
    assert (result.scopes, result.erased) == (2, 2)
