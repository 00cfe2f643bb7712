"""Maintenance, safe on every replica: unfinished erasures are completed (R9), expired entries are deleted
physically (R19), and ledger records, token claims, usage records and turns past their use are pruned.
Entries expire on the application clock bound into the statement; token claims on the database's clock,
the one every replica shares (``admission.claim_once``)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete, func, not_, select, tuple_

from kagent_memory_governed import clock
from kagent_memory_governed.errors import GovernedMemoryError, Operation, Reason, Result
from kagent_memory_governed.schema import entries, ledger, live, replays, scopes, turns, usage
from kagent_memory_governed.store import erasure
from kagent_memory_governed.store.database import Database, record


async def sweep(db: Database, *, batch: int) -> int:
    unverified = await erasure.finish_all(db, batch=batch)  # first: content nobody may keep any longer
    now = clock.now()
    total = 0
    while True:
        doomed = (
            select(entries.c.scope_id, entries.c.entry_id)
            .where(not_(live(now)))
            .limit(batch)
            .with_for_update(skip_locked=True)
        )
        async with db.transaction() as conn:
            result = await conn.execute(
                delete(entries).where(tuple_(entries.c.scope_id, entries.c.entry_id).in_(doomed))
            )
            total += result.rowcount
        if result.rowcount < batch:
            break
    retained = now - timedelta(days=db.policy.ledger_retention_days)
    while True:
        aged = select(ledger.c.ledger_id).where(ledger.c.at < retained).limit(batch).with_for_update(skip_locked=True)
        async with db.transaction() as conn:
            pruned = (await conn.execute(delete(ledger).where(ledger.c.ledger_id.in_(aged)))).rowcount
        if pruned < batch:
            break
    async with db.transaction() as conn:
        await conn.execute(delete(replays).where(replays.c.expires_at <= func.now()))  # the database's clock
        await conn.execute(delete(usage).where(usage.c.at <= now - timedelta(hours=1)))
        # turns can only be collected under their scope's current generation, and not after the ceiling
        await conn.execute(
            delete(turns).where(
                turns.c.scope_id == scopes.c.scope_id,
                (turns.c.generation != scopes.c.generation)
                | (turns.c.at <= now - timedelta(seconds=db.policy.max_expiry_seconds)),
            )
        )
        await record(conn, Operation.SWEEP, Result.OK, count=total, at=now)
    if unverified:  # the rest is done; the operator learns that an erasure still cannot be verified
        raise GovernedMemoryError(Reason.ERASURE_FAILED)
    return total
