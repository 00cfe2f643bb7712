"""Admission as the store decides it: may this work start now? The consent fence, the sender/agent rate
limit and the scope's hourly ceiling, under the scope lock in state every replica shares; and control
tokens, each accepted once."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from kagent_memory_governed import clock
from kagent_memory_governed.admission import HOUR, MINUTE, Bucket, explicit_refusal, hourly_refusal, refill
from kagent_memory_governed.consent import admit_generation, fence
from kagent_memory_governed.errors import Operation, Reason
from kagent_memory_governed.policy import admit_int
from kagent_memory_governed.schema import buckets, replays, usage
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store.database import Database, refuse, scope_state


async def admit(db: Database, key: ScopeKey, generation: int, operation: str, *, units: int, explicit: bool) -> None:
    sid = key.scope_id
    async with db.checking(operation, scope_id=sid):
        admit_generation(generation)
        admit_int(units, low=0, high=db.policy.entry_cap)
    now = clock.now()
    bucket_id = key.sender_agent_id
    async with db.transaction() as conn:
        # each count below is its own statement, so it sees what earlier lock holders committed
        refusal = fence(await scope_state(conn, sid, lock=True), generation, now)
        tokens = 0.0
        if refusal is None and explicit:
            tokens, recent = await _bucket(db, conn, bucket_id, now)
            refusal = explicit_refusal(tokens, recent, db.policy)
        if refusal is None and units:
            used = await conn.scalar(
                select(func.coalesce(func.sum(usage.c.units), 0)).where(
                    usage.c.subject_id == sid, usage.c.kind == "hourly", usage.c.at > now - HOUR
                )
            )
            refusal = hourly_refusal(used, units, db.policy)
        if refusal is not None:
            await refuse(conn, operation, refusal, scope_id=sid, generation=generation, at=now)
        if explicit:
            await conn.execute(
                update(buckets).where(buckets.c.bucket_id == bucket_id).values(tokens=tokens - 1.0, updated_at=now)
            )
        spent = [{"subject_id": bucket_id, "kind": "explicit", "at": now, "units": 1}] if explicit else []
        spent += [{"subject_id": sid, "kind": "hourly", "at": now, "units": units}] if units else []
        if spent:
            await conn.execute(insert(usage), spent)


async def _bucket(db: Database, conn: AsyncConnection, bucket_id: uuid.UUID, now: datetime) -> tuple[float, int]:
    """The sender/agent bucket's tokens at ``now`` (its row locked) and its operations in the rolling minute."""
    row = (
        await conn.execute(
            pg_insert(buckets)
            .values(bucket_id=bucket_id, tokens=float(db.policy.explicit_burst), updated_at=now)
            .on_conflict_do_update(index_elements=[buckets.c.bucket_id], set_={"bucket_id": bucket_id})
            .returning(buckets.c.tokens, buckets.c.updated_at)
        )
    ).one()
    recent = await conn.scalar(
        select(func.count()).where(
            usage.c.subject_id == bucket_id, usage.c.kind == "explicit", usage.c.at > now - MINUTE
        )
    )
    return refill(Bucket(row.tokens, row.updated_at), now, db.policy), recent


async def claim_once(db: Database, jti: str, valid_until: datetime) -> None:
    async with db.transaction() as conn:
        claimed = await conn.scalar(
            pg_insert(replays)
            .values(jti=jti, expires_at=valid_until)
            .on_conflict_do_nothing(index_elements=[replays.c.jti])
            .returning(replays.c.jti)
        )
        if claimed is None:
            await refuse(conn, Operation.CLAIM, Reason.ASSERTION_REPLAYED)
