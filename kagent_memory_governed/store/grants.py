"""Consent as the store keeps it: a grant advances the scope's generation; status reads it back."""

from __future__ import annotations

from contextlib import suppress
from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from kagent_memory_governed import clock
from kagent_memory_governed.consent import Erasure, admit_label, grant_refusal
from kagent_memory_governed.errors import GovernedMemoryError, Operation, Reason, Result
from kagent_memory_governed.keys import fence_of
from kagent_memory_governed.schema import live, scope_rows, scopes
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store.database import Database, admit_read, erasure_state, record, refuse
from kagent_memory_governed.store.values import ErasureRecord, Grant, Status


async def grant(
    db: Database, key: ScopeKey, *, purpose: str, policy_version: str, valid_until: datetime | None
) -> Grant:
    sid = key.scope_id
    async with db.checking(Operation.GRANT, scope_id=sid):
        admit_label(purpose)
        admit_label(policy_version)
        if valid_until is not None and valid_until.tzinfo is None:
            raise GovernedMemoryError(Reason.BAD_INPUT)
    # a scope the database lost whole (a restore) starts above the key store's last erasure of it; unanswered, the
    # grant is refused (from 0 it would be brought back down to that erasure, disabled, on its next use)
    async with db.checking(Operation.GRANT, scope_id=sid):
        recorded = fence_of(await db.keys.store.fetch(sid))
    floor = recorded.generation if recorded is not None else 0
    now = clock.now()
    async with db.transaction() as conn:
        await conn.execute(
            pg_insert(scopes)
            .values(
                scope_id=sid,
                principal=key.principal.mxid,
                origin=key.principal.origin.value,
                agent=str(key.agent),
                scope_kind=key.room.kind.value,
                room=key.room.room_id,
                enabled=False,
                generation=floor,
                max_expiry_seconds=db.policy.max_expiry_seconds,
                entry_cap=db.policy.entry_cap,
                resume=False,
                updated_at=now,
            )
            .on_conflict_do_nothing(index_elements=[scopes.c.scope_id])
        )
        _, erasure = await erasure_state(conn, sid, lock=True)
        refusal = grant_refusal(erasure)
        if refusal is not None:
            await refuse(conn, Operation.GRANT, refusal, scope_id=sid, at=now)
        generation = await conn.scalar(
            update(scopes)
            .where(scopes.c.scope_id == sid)
            .values(
                enabled=True,
                generation=func.greatest(scopes.c.generation, floor) + 1,
                purpose=purpose,
                policy_version=policy_version,
                consented_at=now,
                consent_expires_at=valid_until,
                max_expiry_seconds=db.policy.max_expiry_seconds,
                entry_cap=db.policy.entry_cap,
                resume=False,
                updated_at=now,
            )
            .returning(scopes.c.generation)
        )
        if generation is None:  # the row was inserted above, in this transaction
            raise GovernedMemoryError(Reason.STORE_UNAVAILABLE)
        await record(conn, Operation.GRANT, Result.OK, scope_id=sid, generation=generation, at=now)
    return Grant(generation, db.policy.max_expiry_seconds, db.policy.entry_cap)


async def status(db: Database, key: ScopeKey) -> Status:
    sid = key.scope_id
    now = clock.now()
    scoped = scope_rows(sid, "entry_id", "expires_at")
    held = select(func.array_agg(scoped.c.entry_id)).where(live(now, scoped)).scalar_subquery()  # at most the cap
    async with db.transaction(durable=False) as conn:
        await admit_read(conn, sid, now, db.policy.control_reads_per_hour)
        row = (
            await conn.execute(
                select(
                    scopes.c.enabled,
                    scopes.c.generation,
                    scopes.c.purpose,
                    scopes.c.policy_version,
                    scopes.c.max_expiry_seconds,
                    scopes.c.entry_cap,
                    scopes.c.erasure,
                    scopes.c.erasure_at,
                    held.label("live"),
                ).where(scopes.c.scope_id == sid)
            )
        ).one_or_none()
        await record(conn, Operation.STATUS, Result.OK, scope_id=sid, at=now)
    if row is None:
        return Status(False, 0, None, None, db.policy.max_expiry_seconds, db.policy.entry_cap, 0, None)
    last = ErasureRecord(row.erasure_at, Erasure(row.erasure)) if row.erasure else None
    shown = row.live or []
    with suppress(GovernedMemoryError):  # counted as the database holds them while the key store cannot answer
        keyring = await db.keys.store.fetch(sid)  # read after the rows: a row's key was stored before its commit
        shown = [entry for entry in shown if entry in keyring]  # a row whose key is gone can never be shown
    return Status(
        row.enabled,
        row.generation,
        row.purpose,
        row.policy_version,
        min(row.max_expiry_seconds, db.policy.max_expiry_seconds),
        min(row.entry_cap, db.policy.entry_cap),
        len(shown),
        last,
    )
