"""Admission as the store decides it (R21-R26): may this memory work start now, before any model or
embedding call? Decided by the database function ``governed_memory.admit`` (``store/sql/admit.sql``) in one round
trip, under the scope lock, in state every replica shares:

- the consent fence;
- explicit ``load_memory``/``save_memory``: a token bucket of ``explicit_burst`` tokens refilled at
  ``explicit_ops_per_minute`` per minute, and at most ``explicit_ops_per_minute`` in any rolling
  minute, per (sender, agent);
- every summarization, prefetch subquery, explicit load or save and embedding item is one unit of
  the scope's rolling hourly ceiling, ``scope_ops_per_hour``.

Admitted work is recorded as used; refused work is not, and leaves a ledger row.

Also: single-use control tokens, each spent once on every replica. Replicas verify a token on their own
clocks, which may disagree; whether it may still be spent is decided on the one clock they share, the
database's (see ``claim_once``)."""

from __future__ import annotations

from contextlib import suppress
from datetime import datetime

from sqlalchemy import func
from sqlalchemy.dialects.postgresql import insert as pg_insert

from kagent_memory_governed import clock
from kagent_memory_governed.consent import admit_generation
from kagent_memory_governed.errors import GovernedMemoryError, Operation, Reason, Result
from kagent_memory_governed.keys import fence_of
from kagent_memory_governed.policy import admit_int
from kagent_memory_governed.schema import replays
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import erasure, functions, reconcile
from kagent_memory_governed.store.database import Database, raise_refusal, record, refuse


async def admit_work(
    db: Database, key: ScopeKey, generation: int, operation: str, *, units: int, explicit: bool
) -> None:
    """``admit``, then the scope's keyring, fetched meanwhile for the work, compared with the work's generation:
    a keyring that records a later erasure than the work's generation refuses it, ``store_regressed`` once the
    scope is brought forward if the database was behind the key store (``reconcile``), else ``consent_stale``."""
    sid = key.scope_id
    pending = db.keys.start(sid, generation)
    work = admit(db, key, generation, operation, units=units, explicit=explicit)
    try:
        await erasure.finishing(db, sid, work)
        keyring = await db.keys.ring(sid, generation, task=pending)
    except GovernedMemoryError as refused:
        db.keys.cancel(sid, pending)  # refused work reads no key
        if refused.reason is Reason.KEY_UNAVAILABLE:
            with suppress(GovernedMemoryError):
                async with db.transaction() as conn:
                    await record(conn, operation, Result.REFUSED, reason=refused.reason, scope_id=sid)
        raise
    fence = fence_of(keyring)
    if fence is not None and fence.generation > generation:
        db.keys.drop(sid)
        await reconcile.refuse_behind(db, sid, fence, operation)


async def admit(db: Database, key: ScopeKey, generation: int, operation: str, *, units: int, explicit: bool) -> None:
    sid = key.scope_id
    async with db.checking(operation, scope_id=sid):
        admit_generation(generation)
        admit_int(units, low=0, high=db.policy.entry_cap)
    parameters = {
        "scope": sid,
        "generation": generation,
        "now": clock.now(),
        "operation": str(operation),
        "units": units,
        "bucket": key.sender_agent_id if explicit else None,
        "burst": db.policy.explicit_burst,
        "per_minute": db.policy.explicit_ops_per_minute,
        "per_hour": db.policy.scope_ops_per_hour,
    }
    raise_refusal(await db.call(functions.ADMIT, parameters))


async def claim_once(db: Database, jti: str, valid_until: datetime) -> None:
    """Spend token ``jti``, valid until ``valid_until`` (its expiry plus the leeway), once on every replica.

    Its record is kept until the database's clock passes ``valid_until`` (``sweep`` deletes by that clock too),
    and a token is spent only while the database's clock is before ``valid_until``, read after the record is in
    place: a record can only have been swept once that clock passed it, so a token whose record is gone can
    never be spent again, whatever the clocks of the replicas that verify it, sweep or replay it. Refuses a
    second claim (``assertion_replayed``) and a token the database's clock has seen expire (``bad_assertion``:
    a replica whose clock runs behind it by more than the leeway still accepted it)."""
    async with db.transaction() as conn:
        spendable = await conn.scalar(
            pg_insert(replays)
            .values(jti=jti, expires_at=valid_until)
            .on_conflict_do_nothing(index_elements=[replays.c.jti])
            .returning(func.clock_timestamp() < replays.c.expires_at)  # evaluated once the row is inserted
        )
        if spendable is None:
            await refuse(conn, Operation.CLAIM, Reason.ASSERTION_REPLAYED)
        if not spendable:  # the record stays until swept: a later claim is a replay
            await refuse(conn, Operation.CLAIM, Reason.BAD_ASSERTION)
