"""A database behind the key store, brought forward to the last erasure the key store saw (R44).

Every erasure records itself in the scope's keyring, in the write that destroys the keys (``keys.Fence``: the
generation its fence advanced the scope to, and whether the scope stays disabled). The key store is kept apart
from the database, so it remembers an erasure the database may lose: a failover to an asynchronous standby that
had not received it, a point-in-time recovery, a restore from a backup taken before it. Such a database shows the
scope at an earlier generation, perhaps enabled again, with rows whose keys are gone.

``bring_forward`` re-applies what the database lost: the scope's generation advances to the recorded one (work
admitted under an earlier one is fenced off, as it was by the erasure), the scope is disabled if the erasure left
it so, and every row whose key the key store no longer holds is deleted (it can never be opened again: deleting
it loses nothing). It runs:
- in admission, when the keyring records a later erasure than the work's generation: the work is refused
  ``store_regressed`` before any model or embedding call;
- before every control-plane operation of the scope (``check``), so ``status`` and the bridge see the scope as
  the erasure left it, and before every erasure, so one that re-enables (``forget-all``) never settles a withdrawn
  scope enabled on a database behind the key store;
- in ``sweep``, for every scope (``check_all``).
A keyring kept from before the erasure never opens what such a database returns: the statement that first
reaches another server drops every kept keyring (``Keyrings.serving``).
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from sqlalchemy import delete, func, literal, select, update

from kagent_memory_governed import clock
from kagent_memory_governed.errors import Cause, GovernedMemoryError, Operation, Reason, Result
from kagent_memory_governed.keys import Fence, fence_of
from kagent_memory_governed.schema import entries, scopes
from kagent_memory_governed.store.database import KEYS_DESTROYED, Database, record

logger = logging.getLogger(__name__)
_AT_ONCE = 16  # keyrings a sweep asks the key store for at once


async def check(db: Database, sid: uuid.UUID) -> bool:
    """Bring the scope forward if its database is behind its keyring's last erasure; whether it was."""
    fence = fence_of(await db.keys.store.fetch(sid))
    return fence is not None and await bring_forward(db, sid, fence)


async def refuse_behind(db: Database, sid: uuid.UUID, fence: Fence, operation: str) -> None:
    """Work admitted under a generation below ``fence``'s: refused ``store_regressed`` once the scope is brought
    forward, if the database was behind it; else the work's generation is merely stale (``consent_stale``)."""
    await refuse_if_regressed(db, sid, fence, operation)
    await _refuse(db, sid, Reason.CONSENT_STALE, operation)


async def refuse_if_regressed(db: Database, sid: uuid.UUID, fence: Fence, operation: str) -> None:
    """Refuse ``store_regressed`` once the scope is brought forward to ``fence``, if its database was behind it;
    else return (the statement of the work then fences it, with its own reason)."""
    if await bring_forward(db, sid, fence):
        await _refuse(db, sid, Reason.STORE_REGRESSED, operation)


async def _refuse(db: Database, sid: uuid.UUID, reason: Reason, operation: str) -> None:
    async with db.transaction() as conn:
        await record(conn, operation, Result.REFUSED, reason=reason, scope_id=sid)
    raise GovernedMemoryError(reason)


async def bring_forward(db: Database, sid: uuid.UUID, fence: Fence) -> bool:
    """If the database holds the scope at a generation below ``fence``'s, delete the rows whose keys are gone, then
    advance it (disabled if the erasure left it so); returns whether it did. The rows first: deleting a keyless row
    is safe whatever follows, and a failure before the advance leaves the scope behind, to be brought forward by the
    next check. A scope at or past ``fence`` costs one read."""
    held = await db.call(select(scopes.c.generation).where(scopes.c.scope_id == sid))
    if not held or held[0].generation >= fence.generation:
        return False
    await _delete_keyless(db, sid)
    now = clock.now()
    enabled = literal(not fence.withdrawn)
    async with db.transaction() as conn:
        moved = await conn.scalar(
            update(scopes)
            .where(scopes.c.scope_id == sid, scopes.c.generation < fence.generation)
            .values(
                generation=fence.generation,
                enabled=scopes.c.enabled & enabled,
                resume=scopes.c.resume & enabled,
                updated_at=now,
            )
            .returning(scopes.c.generation)
        )
        if moved is None:  # another replica brought it forward meanwhile
            return False
        await record(
            conn, Operation.RECONCILE, Result.OK, scope_id=sid, generation=moved, at=now, cause=Cause.STORE_REGRESSED
        )
    logger.warning("store regressed: a scope was behind the key store's last erasure and was brought forward")
    return True


async def _delete_keyless(db: Database, sid: uuid.UUID) -> int:
    """Delete the scope's rows whose keys the key store no longer holds. Rows are read first, then the keyring:
    a row committed before the read had its key stored before its commit, so a key missing from the keyring
    read after it was destroyed (or lost), never not yet stored."""
    held = [row.entry_id for row in await db.call(select(entries.c.entry_id).where(entries.c.scope_id == sid))]
    if not held:
        return 0
    keyring = await db.keys.store.fetch(sid)
    gone = [entry for entry in held if entry not in keyring]
    if not gone:
        return 0
    async with db.transaction() as conn:
        await conn.execute(select(func.set_config(KEYS_DESTROYED, "on", True)))  # their keys are gone, read above
        deleted = await conn.execute(delete(entries).where(entries.c.scope_id == sid, entries.c.entry_id.in_(gone)))
        await record(conn, Operation.RECONCILE, Result.OK, scope_id=sid, count=deleted.rowcount)
    return int(deleted.rowcount)


async def check_all(db: Database, *, batch: int) -> tuple[int, bool]:
    """``check`` every scope of the database, ``batch`` rows at a time, ``_AT_ONCE`` keyrings at once; returns how
    many scopes were brought forward, and whether the key store failed to answer for any (checked next run)."""
    brought, failed, after = 0, False, None
    while True:
        query = select(scopes.c.scope_id, scopes.c.generation)
        if after is not None:
            query = query.where(scopes.c.scope_id > after)
        found = await db.call(query.order_by(scopes.c.scope_id).limit(batch))
        for start in range(0, len(found), _AT_ONCE):
            chunk = found[start : start + _AT_ONCE]
            fetched = await asyncio.gather(
                *(db.keys.store.fetch(row.scope_id) for row in chunk), return_exceptions=True
            )
            for row, keyring in zip(chunk, fetched, strict=True):
                if isinstance(keyring, BaseException):
                    if not isinstance(keyring, GovernedMemoryError):
                        raise keyring
                    failed = True
                    continue
                fence = fence_of(keyring)
                if fence is None or fence.generation <= row.generation:
                    continue
                try:
                    brought += await bring_forward(db, row.scope_id, fence)
                except GovernedMemoryError:  # that scope waits for the next run; the sweep goes on
                    failed = True
        if len(found) < batch:
            return brought, failed
        after = found[-1].scope_id
