"""Maintenance, safe on every replica: scopes a database lost erasures of are brought forward (R44), unfinished
erasures are completed (R9), expired entries are deleted
physically with their keys destroyed first (R19, R42), and ledger records, token claims, usage records and
turns past their use are pruned.
Entries expire on the application clock bound into the statement; token claims on the database's clock,
the one every replica shares (``admission.claim_once``)."""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from datetime import datetime, timedelta

from sqlalchemy import delete, func, not_, select, tuple_

from kagent_memory_governed import clock
from kagent_memory_governed.errors import Cause, GovernedMemoryError, Operation, Reason, Result
from kagent_memory_governed.schema import entries, ledger, live, replays, scopes, turns, usage
from kagent_memory_governed.store import erasure, reconcile
from kagent_memory_governed.store.database import KEYS_DESTROYED, Database, record

logger = logging.getLogger(__name__)


async def sweep(db: Database, *, batch: int) -> int:
    # first: a database behind the key store brought forward, then content nobody may keep any longer
    _, keyrings_failed = await reconcile.check_all(db, batch=batch)
    unverified = await erasure.finish_all(db, batch=batch)
    now = clock.now()
    total, keys_failed = await _expire(db, now, batch=batch)
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
    if keys_failed or keyrings_failed:  # expired entries whose keys could not be destroyed stay (unreadable), and
        # scopes whose keyring could not be read stay unchecked, for the next run
        raise GovernedMemoryError(Reason.KEY_UNAVAILABLE)
    return total


async def _expire(db: Database, now: datetime, *, batch: int) -> tuple[int, bool]:
    """Delete expired entries physically, ``batch`` at a time, each scope's keys destroyed and verified gone
    first, as by every erasure: an expired entry is never readable (R18), and once its key is gone no copy of it
    can be opened either. A run interrupted between the two leaves expired rows whose keys are gone, which the
    next run deletes. Returns how many were deleted, and whether the key store failed to destroy or to verify
    (that scope's rows stay, unreadable, for the next run)."""
    total, after, failed = 0, None, False
    while True:
        doomed = select(entries.c.scope_id, entries.c.entry_id).where(not_(live(now)))
        if after is not None:
            doomed = doomed.where(tuple_(entries.c.scope_id, entries.c.entry_id) > tuple_(*after))
        found = await db.call(doomed.order_by(entries.c.scope_id, entries.c.entry_id).limit(batch))
        if not found:
            return total, failed
        by_scope: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
        for row in found:
            by_scope[row.scope_id].append(row.entry_id)
        pairs = []
        for scope, expired in by_scope.items():
            try:
                await db.keys.store.destroy(scope, entries=expired)
                gone = await db.keys.store.destroyed(scope, entries=expired)
            except GovernedMemoryError as error:
                logger.warning("sweep: expired keys not destroyed: %s", erasure.failure_cause(error))
                failed = True
                continue
            if not gone:
                logger.warning("sweep: expired keys not destroyed: %s", Cause.KEYS_NOT_DESTROYED)
                failed = True
                continue
            pairs += [(scope, entry) for entry in expired]
        if pairs:
            async with db.transaction() as conn:
                await conn.execute(select(func.set_config(KEYS_DESTROYED, "on", True)))  # verified above
                deleted = await conn.execute(
                    delete(entries).where(tuple_(entries.c.scope_id, entries.c.entry_id).in_(pairs), not_(live(now)))
                )
                total += deleted.rowcount
        if len(found) < batch:
            return total, failed
        after = (found[-1].scope_id, found[-1].entry_id)
