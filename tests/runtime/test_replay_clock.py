"""Single-use control tokens are spent on the database's clock (#27, finding 1): replicas whose application
clocks disagree by more than the leeway can neither sweep a replay record early nor spend a token twice.

Each replica is a ``Store`` of its own on the one database; a replica's clock is the frozen application clock
while it acts. The database's clock is the real one, never frozen: these tests place tokens around it."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from freezegun import freeze_time
from support import refusal

from kagent_memory_governed import control
from kagent_memory_governed.assertion import LEEWAY_SECONDS
from kagent_memory_governed.errors import Reason
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import Bridge

SKEW = timedelta(seconds=3 * LEEWAY_SECONDS)  # well past the leeway


@pytest.fixture
async def other(store: Store, database_url: str) -> AsyncIterator[Store]:
    """A second replica on the same database (``store`` is the first)."""
    replica = Store.connect(database_url, Policy(), keys=store.key_store)
    yield replica
    await replica.close()


async def _records(sql: asyncpg.Connection, jti: str) -> int:
    records: int = await sql.fetchval("SELECT count(*) FROM governed_memory.replays WHERE jti = $1", jti)
    return records


async def test_a_replica_whose_clock_is_ahead_cannot_sweep_a_record_another_still_needs(
    store: Store, other: Store, sql: asyncpg.Connection
) -> None:
    now = datetime.now(UTC)
    valid_until = now + timedelta(seconds=LEEWAY_SECONDS)  # a token still valid on the database's clock
    with freeze_time(now, real_asyncio=True):
        await store.claim_once("spent-once", valid_until)
    with freeze_time(now + SKEW, real_asyncio=True):  # past valid_until on this replica's clock only
        await other.sweep()
    assert await _records(sql, "spent-once") == 1
    with freeze_time(now + timedelta(seconds=1), real_asyncio=True):
        assert await refusal(store.claim_once("spent-once", valid_until)) is Reason.ASSERTION_REPLAYED


async def test_a_token_the_database_clock_has_seen_expire_is_never_spent(store: Store, other: Store) -> None:
    """A replica running behind by more than the leeway still accepts a token the database's clock has seen
    expire; it is refused, before and after any sweep, so no sweep can make it spendable."""
    now = datetime.now(UTC)
    valid_until = now - timedelta(seconds=1)
    with freeze_time(now - SKEW, real_asyncio=True):
        assert await refusal(store.claim_once("late", valid_until)) is Reason.BAD_ASSERTION
    for moment in (now - SKEW, now, now + SKEW):
        with freeze_time(moment, real_asyncio=True):
            await other.sweep()
        with freeze_time(now - SKEW, real_asyncio=True):
            assert await refusal(store.claim_once("late", valid_until)) in {
                Reason.BAD_ASSERTION,
                Reason.ASSERTION_REPLAYED,
            }


async def test_records_are_swept_on_the_database_clock_whatever_the_application_clock(
    store: Store, sql: asyncpg.Connection
) -> None:
    now = datetime.now(UTC)
    await store.claim_once("valid", now + timedelta(minutes=5))
    await sql.execute(  # a record whose token the database's clock has seen expire
        "INSERT INTO governed_memory.replays (jti, expires_at) VALUES ('expired', now() - interval '1 second')"
    )
    with freeze_time(now + timedelta(days=365), real_asyncio=True):
        await store.sweep()
    assert (await _records(sql, "valid"), await _records(sql, "expired")) == (1, 0)
    with freeze_time(now - timedelta(days=365), real_asyncio=True):
        await store.claim_once("fresh", now + timedelta(minutes=5))  # and a claim does not read the frozen clock
        assert await refusal(store.claim_once("fresh", now + timedelta(minutes=5))) is Reason.ASSERTION_REPLAYED


def _replica(store: Store, bridge: Bridge) -> httpx.AsyncClient:
    app = FastAPI()
    control.mount(app, store, bridge.trust())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent")


async def test_a_consent_token_replayed_after_a_skewed_sweep_cannot_switch_memory_back_on(
    store: Store, other: Store, bridge: Bridge
) -> None:
    """The attack of #27: consent, off, a sweep by a replica (or the sweep CronJob's pod) whose clock runs ahead
    by more than the leeway, then the consent token replayed on a replica with the right time."""
    signed = time.time()

    def token(op: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {bridge.sign(signed, 'control', op=op, jti=uuid.uuid4().hex)}"}

    consent, body = token("consent"), {"purpose": "assist", "policy_version": "v1"}
    right, ahead = _replica(store, bridge), _replica(other, bridge)
    async with right, ahead:
        with freeze_time(datetime.fromtimestamp(signed, UTC), real_asyncio=True):
            assert (await right.post("/memory/v1/consent", json=body, headers=consent)).status_code == 200
            assert (await right.post("/memory/v1/off", json={"confirm": True}, headers=token("off"))).status_code == 200
        lifetime = timedelta(seconds=120 + LEEWAY_SECONDS)  # the bridge double's tokens, plus the leeway
        with freeze_time(datetime.fromtimestamp(signed, UTC) + lifetime + SKEW, real_asyncio=True):
            await other.sweep()
        with freeze_time(datetime.fromtimestamp(signed + 20, UTC), real_asyncio=True):
            replayed = await right.post("/memory/v1/consent", json=body, headers=consent)
            status = await right.get("/memory/v1/status", headers=token("status"))
    assert (replayed.status_code, replayed.json()) == (401, {"error": "assertion_replayed"})
    assert status.json()["enabled"] is False
