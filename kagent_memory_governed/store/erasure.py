"""Erasure: fence, delete, verify, settle (R8, R9, R12, R13, R29); and the completion of an interrupted one.

Every erasure first brings the scope forward to the key store's record of its last erasure, if its database is
behind it (``reconcile``), then fences in a transaction of its own (disable the scope, advance its generation,
record what it erases), so work admitted before it cannot write again; then destroys the erased entries' keys in
the key store and verifies the store cannot give them back (R42: from here no copy of the entries can be opened);
then deletes; then verifies in a fresh transaction; then settles the scope. That is three round trips to the
database: the record's comparison, the fence's statement, then one call of the procedure
``governed_memory.clear`` (``store/sql/clear.sql``), which commits the delete before it verifies; and three calls
of the key store. A failure
anywhere leaves the scope disabled, ``erasure = failed``, with a content-free ledger row, and raises
``erasure_failed``.

An erasure interrupted after its fence (a crash, a lost connection, a failed delete or verification) is
completed by ``finish``: the same delete, verify and settle under the generation and target its fence
recorded. ``sweep`` runs it for every such scope and the scope's next operation runs it for that scope, so
an unfinished erasure never waits for a person. Several runs of one erasure may overlap (the original, a
sweep, another replica's operation); each deletes only while the erasure's fence still stands.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Coroutine
from contextlib import suppress
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import case, exists, func, literal, select, update

from kagent_memory_governed import clock
from kagent_memory_governed.consent import Erasure, grant_refusal
from kagent_memory_governed.errors import Cause, GovernedMemoryError, Operation, Reason, Result
from kagent_memory_governed.keys import Fence
from kagent_memory_governed.schema import entries, scopes
from kagent_memory_governed.scope import Principal, ScopeKey
from kagent_memory_governed.store import functions, reconcile
from kagent_memory_governed.store.database import Database, erasure_state, record, refuse
from kagent_memory_governed.store.replication import durable
from kagent_memory_governed.store.values import Erased, Offboarded

T = TypeVar("T")
logger = logging.getLogger(__name__)
_UNFINISHED = (Erasure.PENDING.value, Erasure.FAILED.value)


async def caught_up(db: Database, sid: uuid.UUID) -> None:
    """Before a control-plane operation of the scope: bring it forward if its database is behind the key store
    (``reconcile``), then complete its unfinished erasure, if any. Neither failure is raised here: the operation then
    refuses, or reports it from the scope's state."""
    await _forward(db, sid)
    with suppress(GovernedMemoryError):
        await finish(db, sid)


async def _forward(db: Database, sid: uuid.UUID) -> None:
    """Bring the scope forward to the key store's record, if its database is behind it; unanswered, the erasure or
    operation that follows fails closed on its own."""
    with suppress(GovernedMemoryError):
        await reconcile.check(db, sid)


async def forget(db: Database, key: ScopeKey, entry_id: uuid.UUID) -> Erased:
    """One entry; its scope brought forward first by the control plane, as for every operation (``caught_up``)."""
    async with db.checking(Operation.FORGET, scope_id=key.scope_id):
        if not isinstance(entry_id, uuid.UUID):
            raise GovernedMemoryError(Reason.BAD_INPUT)
    return await _erase(db, key.scope_id, Operation.FORGET, entry_id=entry_id, resume=True)


async def forget_all(db: Database, key: ScopeKey) -> Erased:
    # from the key store's record: on a database behind it, a forget-all would settle a withdrawn scope enabled
    await _forward(db, key.scope_id)
    return await _erase(db, key.scope_id, Operation.FORGET_ALL, entry_id=None, resume=True)


async def off(db: Database, key: ScopeKey) -> Erased:
    await _forward(db, key.scope_id)
    return await _erase(db, key.scope_id, Operation.OFF, entry_id=None, resume=False)


async def offboard(db: Database, principal: Principal) -> Offboarded:
    held = select(scopes.c.scope_id).where(
        scopes.c.principal == principal.mxid, scopes.c.origin == principal.origin.value
    )
    for row in await db.call(held):  # each brought forward to the key store's record first, as by off
        await _forward(db, row.scope_id)
    now = clock.now()
    async with db.transaction() as conn:
        fenced = (
            await conn.execute(
                update(scopes)
                .where(scopes.c.principal == principal.mxid, scopes.c.origin == principal.origin.value)
                .values(_fenced_values(now, resume=False, entry_id=None))
                .returning(scopes.c.scope_id, scopes.c.generation)
            )
        ).all()
        await record(conn, Operation.OFFBOARD_FENCE, Result.OK, count=len(fenced), at=now)
    erased, failed = 0, 0
    for sid, generation in sorted(fenced):
        try:
            erased += await _clear(db, sid, Fence(generation, withdrawn=True), Operation.OFFBOARD, entry_id=None)
        except GovernedMemoryError:
            failed += 1
    if failed:
        with suppress(GovernedMemoryError):
            async with db.transaction() as conn:
                await record(conn, Operation.OFFBOARD, Result.FAILED, reason=Reason.ERASURE_FAILED, count=failed)
        raise GovernedMemoryError(Reason.ERASURE_FAILED)
    async with db.transaction() as conn:
        await record(conn, Operation.OFFBOARD, Result.OK, count=len(fenced))
    return Offboarded(len(fenced), erased)


async def finish(db: Database, sid: uuid.UUID) -> bool:
    """Complete the scope's unfinished erasure, if it has one; returns whether it had one. Raises
    ``erasure_failed`` if it still cannot be verified (the scope stays disabled), or ``store_unavailable``."""
    unfinished = await db.call(
        select(scopes.c.generation, scopes.c.erasure_entry, scopes.c.resume).where(
            scopes.c.scope_id == sid, scopes.c.erasure.in_(_UNFINISHED)
        )
    )
    if not unfinished:
        return False
    [row] = unfinished
    fence = Fence(row.generation, withdrawn=not row.resume)
    await _clear(db, sid, fence, Operation.COMPLETE_ERASURE, entry_id=row.erasure_entry)
    return True


async def finish_all(db: Database, *, batch: int) -> int:
    """Complete every unfinished erasure, ``batch`` scopes at a time; returns how many could not be verified
    (those scopes stay disabled, ``erasure = failed``, for the next run)."""
    failed, after = 0, None
    while True:
        query = select(scopes.c.scope_id).where(scopes.c.erasure.in_(_UNFINISHED))
        if after is not None:
            query = query.where(scopes.c.scope_id > after)
        found = [row.scope_id for row in await db.call(query.order_by(scopes.c.scope_id).limit(batch))]
        for sid in found:
            try:
                await finish(db, sid)
            except GovernedMemoryError:
                failed += 1
        if len(found) < batch:
            return failed
        after = found[-1]


async def finished_first(db: Database, sid: uuid.UUID, work: Coroutine[Any, Any, T]) -> T:
    """``work``, once an unfinished erasure of the scope is completed: the control plane's one spelling (the data
    plane's is ``finishing``, which completes one only when the fence refuses). If it still cannot be completed,
    ``work`` refuses or reports it from the scope's state."""
    try:
        await caught_up(db, sid)
    except BaseException:
        work.close()
        raise
    return await work


async def finishing(db: Database, sid: uuid.UUID, work: Awaitable[T]) -> T:
    """``work`` on the scope's data plane. Refused because the scope is disabled, it first completes the
    scope's unfinished erasure, if any; the refusal stands whatever the completion does."""
    try:
        return await work
    except GovernedMemoryError as refused:
        if refused.reason is Reason.CONSENT_DISABLED:
            with suppress(GovernedMemoryError):
                await finish(db, sid)
        raise


def _fenced_values(now: datetime, *, resume: bool, entry_id: uuid.UUID | None) -> dict[str, Any]:
    """Disable, advance the generation and record the target in one statement. ``resume`` re-enables after
    verification only if the scope was enabled (or was resuming from an unfinished erasure)."""
    interrupted = scopes.c.erasure.in_(_UNFINISHED)
    return {
        "enabled": False,
        "generation": scopes.c.generation + 1,
        "erasure": Erasure.PENDING.value,
        "erasure_at": now,
        "erasure_entry": entry_id,
        "resume": case((scopes.c.enabled, True), (interrupted, scopes.c.resume), else_=False)
        if resume
        else literal(False),
        "updated_at": now,
    }


async def _erase(
    db: Database, sid: uuid.UUID, operation: Operation, *, entry_id: uuid.UUID | None, resume: bool
) -> Erased:
    now = clock.now()
    fence = (  # ``durable``: its commit waits for a synchronous standby even where the role lowered synchronous_commit
        update(scopes)
        .where(scopes.c.scope_id == sid, durable())
        .values(_fenced_values(now, resume=resume, entry_id=entry_id))
    )
    if entry_id is not None:  # one entry: no unfinished erasure first (as for a grant), and the entry is held
        fence = fence.where(
            func.coalesce(scopes.c.erasure, "").not_in(_UNFINISHED),
            exists().where(entries.c.scope_id == sid, entries.c.entry_id == entry_id),
        )
    rows = await db.call(fence.returning(scopes.c.generation, scopes.c.resume))  # committed first, in one trip
    if not rows:  # refused, or never consented: decided and recorded under the scope lock
        async with db.transaction() as conn:
            recorded, erasure = await erasure_state(conn, sid, lock=True)
            if entry_id is not None:
                refusal = grant_refusal(erasure)
                held = select(literal(True)).where(entries.c.scope_id == sid, entries.c.entry_id == entry_id)
                if refusal is None and (not recorded or not await conn.scalar(held)):
                    refusal = Reason.NOT_FOUND
                if refusal is not None:
                    await refuse(conn, operation, refusal, scope_id=sid, at=now)
            if not recorded:  # nothing to fence or erase
                await record(conn, operation, Result.OK, scope_id=sid, count=0, at=now)
                return Erased(0, 0)
            rows = list((await conn.execute(fence.returning(scopes.c.generation, scopes.c.resume))).all())
            if not rows:  # the entry went meanwhile (swept once expired): nothing of this scope's to fence
                await refuse(conn, operation, Reason.NOT_FOUND, scope_id=sid, at=now)
    fenced = Fence(rows[0].generation, withdrawn=not rows[0].resume)
    return Erased(fenced.generation, await _clear(db, sid, fenced, operation, entry_id=entry_id))


async def _clear(
    db: Database, sid: uuid.UUID, fence: Fence, operation: Operation, *, entry_id: uuid.UUID | None
) -> int:
    """Destroy the erased keys and verify them gone from the key store (``_destroy_keys``); then delete, verify
    in a fresh transaction, and settle the fenced scope: one call of the procedure ``governed_memory.clear``,
    which commits between those steps and deletes only while this erasure's fence stands. Any failure leaves the
    scope disabled with ``erasure = failed`` and raises ``erasure_failed`` (R9); every step may run again. The key
    store records ``fence`` as the scope's last erasure in the write that destroys the keys: a database that later
    comes back from before it is brought forward to it (``store/reconcile.py``)."""
    generation = fence.generation
    parameters = {"scope": sid, "generation": generation, "operation": str(operation), "entry": entry_id}
    db.keys.drop(sid)
    try:
        await _destroy_keys(db, sid, fence, entry_id)
        [outcome] = await db.call(functions.CLEAR, parameters | {"now": clock.now()})
        if outcome.remaining:  # a settled fence counts none: whoever settled it verified
            raise GovernedMemoryError(Reason.ERASURE_FAILED, cause=Cause.ROWS_REMAIN)
        return int(outcome.erased)
    except Exception as error:  # whatever failed, the scope stays disabled (R9)
        cause = failure_cause(error)
        logger.warning("erasure failed closed: %s (%s)", operation.value, cause)
        await _mark_failed(db, sid, generation, operation, entry_id, cause)
        raise GovernedMemoryError(Reason.ERASURE_FAILED, cause=cause) from None


def failure_cause(error: BaseException) -> Cause:
    """Why an erasure failed, as one content-free code for its ledger row and log line: the key store's or the
    database's cause (``permission_denied``), else the reason code (a ``Cause`` of the same value: those the store
    can meet here, ``store_unavailable``, ``bad_input``, ``key_unavailable``), else ``internal_error`` (a defect)."""
    if isinstance(error, GovernedMemoryError):
        if error.cause is not None:
            return error.cause
        try:
            return Cause(error.reason.value)
        except ValueError:  # a reason the store never meets in an erasure
            return Cause.INTERNAL_ERROR
    return Cause.INTERNAL_ERROR


async def _destroy_keys(db: Database, sid: uuid.UUID, fence: Fence, entry_id: uuid.UUID | None) -> None:
    """Destroy the keys this erasure covers, then verify the key store can give none of them back: the entry's,
    or every key written before the fence at ``generation`` (never one written after it, so a late run of a
    settled erasure cannot touch a new grant's entries); verified for every key written before the fence, or, while
    writers the fence refused keep storing keys of their own, for the keys of every row the erasure deletes. First,
    while the fence keeps every reader out: from then on no copy of the entries, anywhere, can be opened, whatever
    happens to the delete that follows."""
    generation = fence.generation
    covered = {"entries": [entry_id]} if entry_id is not None else {"before": generation}
    for _ in range(3):  # a write admitted before the fence may store its key after a destroy; its statement is
        # then refused by the fence, so that key never opens anything, but it is destroyed all the same
        await db.keys.store.destroy(sid, **covered, fence=fence)
        if await db.keys.store.destroyed(sid, **covered):
            return
    # Writers fenced out keep storing such keys. What must be gone are the keys of the rows this erasure deletes:
    # each was stored before its row was committed, so before the fence, so before the first destroy above, which
    # reached it (a row already deleted had its key destroyed before its delete).
    if entry_id is None and await db.keys.store.destroyed(sid, entries=await _held(db, sid, generation)):
        return
    raise GovernedMemoryError(Reason.ERASURE_FAILED, cause=Cause.KEYS_NOT_DESTROYED)


async def _held(db: Database, sid: uuid.UUID, generation: int) -> list[uuid.UUID]:
    """The scope's rows written before the fence at ``generation``: what the erasure deletes."""
    rows = await db.call(select(entries.c.entry_id).where(entries.c.scope_id == sid, entries.c.generation < generation))
    return [row.entry_id for row in rows]


async def _mark_failed(
    db: Database, sid: uuid.UUID, generation: int, operation: Operation, entry_id: uuid.UUID | None, cause: Cause
) -> None:
    """Best effort: if the database is gone too, the scope stays ``pending``, which is just as disabled
    (and as unfinished: ``finish`` completes either). A fence another run settled meanwhile stays settled."""
    now = clock.now()
    with suppress(GovernedMemoryError):
        async with db.transaction() as conn:
            await conn.execute(
                update(scopes)
                .where(scopes.c.scope_id == sid, scopes.c.generation == generation, scopes.c.erasure.in_(_UNFINISHED))
                .values(enabled=False, erasure=Erasure.FAILED.value, erasure_at=now, updated_at=now)
            )
            await record(
                conn,
                operation,
                Result.FAILED,
                reason=Reason.ERASURE_FAILED,
                scope_id=sid,
                generation=generation,
                entry_id=entry_id,
                at=now,
                cause=cause,
            )
