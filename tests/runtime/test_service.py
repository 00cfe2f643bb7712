"""The memory service takes what an Agent's kagent config says of memory: its ``ttl_days`` may lower the
expiry ceiling, never raise it (R20)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from freezegun import freeze_time
from kagent.adk.types import MemoryConfig
from support import facts

from kagent_memory_governed.adk.service import GovernedMemoryService
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import Store

T0 = datetime(2026, 5, 4, 9, 30, tzinfo=UTC)


async def test_an_agents_ttl_days_lowers_the_expiry_ceiling_and_never_raises_it(
    store: Store, database_url: str, key: ScopeKey
) -> None:
    # its own: the Agent's ttl lowers this store's ceiling
    store = Store.connect(database_url, Policy(), keys=store.key_store)
    try:
        service = GovernedMemoryService(store.plane())
        service.configure(MemoryConfig(ttl_days=30))
        assert store.policy.max_expiry_seconds == 7 * 24 * 3600  # kagent's laxer TTL changes nothing
        service.configure(MemoryConfig(ttl_days=3))
        assert store.policy.max_expiry_seconds == service.policy.max_expiry_seconds == 3 * 24 * 3600
        with freeze_time(T0, real_asyncio=True):
            grant = await store.grant(key, purpose="assist", policy_version="v1")
            assert grant.max_expiry_seconds == 3 * 24 * 3600 and (await store.status(key)).max_expiry_seconds == 259200
            [entry] = await store.write(key, grant.generation, facts("likes tea"))
            page = await store.inspect(key)
        assert page.entries[0].expires_at == T0 + timedelta(days=3) and page.entries[0].entry_id == entry
    finally:
        await store.close()
