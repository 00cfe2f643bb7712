"""The data plane: facts written and searched under a consent generation, fenced in the statement that does the
work; and the subject's own paged view of its entries, with cursors bound to their scope. Entries are sealed
under keys of their own before they are written, and opened and ranked here after they are read
(``store/entry_format.py``, ``store/ranking.py``); the keys come from the key store, never from the database."""

from __future__ import annotations

import asyncio
import base64
import binascii
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy
from sqlalchemy import Row, Select, literal, select, tuple_

from kagent_memory_governed import clock
from kagent_memory_governed.consent import admit_generation, grant_refusal
from kagent_memory_governed.errors import Cause, GovernedMemoryError, Operation, Reason, Result
from kagent_memory_governed.keys import Keyring, fence_of
from kagent_memory_governed.policy import admit_embedding, admit_fact, admit_int, expiry_seconds
from kagent_memory_governed.schema import live, scope_rows
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.service.values import Embedding, Fact
from kagent_memory_governed.store import entry_format, functions, keyrings, ranking, reconcile
from kagent_memory_governed.store.database import Database, admit_read, erasure_state, raise_refusal, record, refuse
from kagent_memory_governed.store.values import MAX_PAGE, Entry, Hit, Page

_ATTEMPTS = 16  # each retry follows a concurrent writer's commit; a scope holds at most 100 entries


async def write(
    db: Database, key: ScopeKey, generation: int, facts: Sequence[Fact], *, expires_in: int | None
) -> list[uuid.UUID]:
    sid = key.scope_id
    pending = db.keys.start(sid, generation)  # fetched while the facts are checked and sealed
    async with _cancelling(db, sid, pending), db.checking(Operation.WRITE, scope_id=sid):
        admit_generation(generation)
        if not facts or len(facts) > db.policy.entry_cap:
            raise GovernedMemoryError(Reason.BAD_INPUT)
        admitted = [(admit_fact(f.text, db.policy), admit_embedding(f.embedding)) for f in facts]
        # the policy's bound; the function lowers it to what the scope's consent allows
        lifetime = expiry_seconds(expires_in, db.policy, db.policy.max_expiry_seconds)
    distinct: dict[str, numpy.ndarray] = {}  # one entry a fact, with the first of its embeddings
    for fact, vector in admitted:
        distinct.setdefault(fact, vector)
    new = {fact: (uuid.uuid4(), entry_format.new_key(fact, sid, generation)) for fact in distinct}
    sealed = [entry_format.seal(new[fact][1], sid, new[fact][0], fact, vector) for fact, vector in distinct.items()]
    keys = {entry: entry_key for entry, entry_key in new.values()}
    try:
        # durable before any ciphertext it opens is committed; the keyring was being fetched meanwhile
        _, keyring = await asyncio.gather(db.keys.store.store(sid, keys), db.keys.ring(sid, generation, task=pending))
    except GovernedMemoryError as failed:
        db.keys.cancel(sid, pending)
        await _record_refusal(db, Operation.WRITE, failed.reason, sid, generation)
        raise
    try:  # a write need not follow an admission (the service's data plane): a database behind is caught here
        await _regressed(db, sid, keyring, generation, Operation.WRITE)
    except GovernedMemoryError:
        with suppress(GovernedMemoryError):
            await db.keys.store.destroy(sid, entries=keys)  # stored above; they open nothing
        raise
    for attempt in range(1, _ATTEMPTS + 1):
        position = {new[fact][1].token: i for i, fact in enumerate(distinct, 1)}
        same = [(position[k.token], entry) for entry, k in keyring.items() if k.token in position and entry not in keys]
        parameters = {
            "scope": sid,
            "generation": generation,
            "now": clock.now(),
            "ids": [new[fact][0] for fact in distinct],
            "sealed": sealed,
            "same_of": [i for i, _ in same],
            "same": [entry for _, entry in same],
            "known": list(keyring),
            "cap": db.policy.entry_cap,
            "lifetime": lifetime,
        }
        rows = await db.call(functions.WRITE, parameters)
        if not rows or rows[0].refusal != Reason.KEYRING_STALE or attempt == _ATTEMPTS:
            break
        db.keys.drop(sid)  # another writer stored an entry this keyring lacks: fetch it again, decide again
        keyring = await db.keys.ring(sid, generation) | keys
    stale = bool(rows) and rows[0].refusal == Reason.KEYRING_STALE
    stored = dict(zip(distinct, [row.entry_id for row in rows], strict=False)) if not stale else {}
    unused = [entry for fact, (entry, _) in new.items() if stored.get(fact) != entry]
    if unused:  # refused, or facts already held by a live entry: their keys open nothing
        with suppress(GovernedMemoryError):
            await db.keys.store.destroy(sid, entries=unused)
    if stale:
        raise GovernedMemoryError(Reason.STORE_UNAVAILABLE, cause=Cause.KEYRING_CONTENDED)
    raise_refusal(rows)
    db.keys.add(sid, generation, {entry: k for entry, k in keys.items() if entry not in unused})
    return [stored[fact] for fact, _ in admitted]


async def search(
    db: Database,
    key: ScopeKey,
    generation: int,
    embeddings: Sequence[Embedding],
    *,
    top_k: int,
    min_score: float,
) -> list[list[Hit]]:
    sid = key.scope_id
    pending = db.keys.start(sid, generation)  # the keyring is fetched while the input is checked and the statement runs
    async with _cancelling(db, sid, pending), db.checking(Operation.SEARCH, scope_id=sid):
        admit_generation(generation)
        admit_int(len(embeddings), low=1, high=db.policy.prefetch_max_subqueries)
        queries = [admit_embedding(embedding) for embedding in embeddings]
        admit_int(top_k, low=1, high=db.policy.entry_cap)
        if not -1.0 <= float(min_score) <= 1.0:
            raise GovernedMemoryError(Reason.BAD_INPUT)
    try:
        rows = await db.call(functions.SEARCH, {"scope": sid, "generation": generation, "now": clock.now()})
        raise_refusal(rows)
    except GovernedMemoryError:
        db.keys.cancel(sid, pending)
        raise
    if rows[0].entry_id is None:  # nothing live: no key needed
        db.keys.cancel(sid, pending)
        return [[] for _ in queries]
    # unpacked, not by name: a hundred rows' attributes by name cost half a millisecond
    sealed_rows: list[entry_format.SealedRow] = [(entry, sealed, at, until) for _, entry, sealed, at, until, _ in rows]
    keyring = await db.keys.ring(sid, generation, needs=[row[0] for row in sealed_rows], task=pending)
    # a search need not follow an admission (the service's data plane): a database behind is caught here
    await _regressed(db, sid, keyring, generation, Operation.SEARCH)
    batch = entry_format.open_batch(sid, sealed_rows, keyring)
    ranked = ranking.rank(batch.matrix, queries, top_k=top_k, max_distance=1.0 - float(min_score))
    return [
        [
            Hit(batch.ids[i], batch.texts[i].decode("utf-8"), 1.0 - d, batch.created_at[i], batch.expires_at[i])
            for i, d in hits
        ]
        for hits in ranked
    ]


async def _regressed(db: Database, sid: uuid.UUID, keyring: Keyring, generation: int, operation: str) -> None:
    """Refuse ``store_regressed`` if the keyring records a later erasure than the work's generation and the database
    was behind it (``reconcile``); a database that has it fences the work in its statement, with its own reason."""
    fence = fence_of(keyring)
    if fence is not None and fence.generation > generation:
        db.keys.drop(sid)
        await reconcile.refuse_if_regressed(db, sid, fence, operation)


@asynccontextmanager
async def _cancelling(db: Database, sid: uuid.UUID, pending: asyncio.Task[Keyring]) -> AsyncIterator[None]:
    """Input refused before any statement: keep nothing of the keyring fetch begun for it."""
    try:
        yield
    except GovernedMemoryError:
        db.keys.cancel(sid, pending)
        raise


async def _record_refusal(db: Database, operation: str, reason: Reason, sid: uuid.UUID, generation: int) -> None:
    """The ledger row of work refused before its statement (the key store could not serve)."""
    with suppress(GovernedMemoryError):
        async with db.transaction() as conn:
            await record(conn, operation, Result.REFUSED, reason=reason, scope_id=sid, generation=generation)


async def inspect(db: Database, key: ScopeKey, *, limit: int, cursor: str | None) -> Page:
    sid = key.scope_id
    async with db.checking(Operation.INSPECT, scope_id=sid):
        admit_int(limit, low=1, high=MAX_PAGE)
        after = _decode_cursor(key, cursor) if cursor is not None else None
    now = clock.now()
    scoped = scope_rows(sid, "entry_id", "sealed", "created_at", "expires_at")
    query = (
        select(scoped.c.entry_id, scoped.c.sealed, scoped.c.created_at, scoped.c.expires_at)
        .where(live(now, scoped))
        .order_by(scoped.c.created_at, scoped.c.entry_id)
        .limit(limit + 1)
    )
    if after is not None:
        query = query.where(
            tuple_(scoped.c.created_at, scoped.c.entry_id) > tuple_(literal(after[0]), literal(after[1]))
        )
    keyring = asyncio.ensure_future(db.keys.store.fetch(sid))  # the subject's own read: never a kept keyring
    keyring.add_done_callback(keyrings.retrieve)
    try:
        rows = await _page(db, sid, query, now, limit)
        sealed_rows = [entry_format.Row(r.entry_id, r.sealed, r.created_at, r.expires_at) for r in rows[:limit]]
        opened = {e.entry_id: e for e in entry_format.open_entries(sid, sealed_rows, await keyring)}
    finally:
        keyring.cancel()
    page = [
        Entry(r.entry_id, opened[r.entry_id].text, str(key.room), r.created_at, r.expires_at)
        for r in rows[:limit]
        if r.entry_id in opened  # a row without its key is being erased or expiring: never shown
    ]
    more = len(rows) > limit
    last = rows[limit - 1] if more else None
    return Page(page, _encode_cursor(key, last.created_at, last.entry_id) if last is not None else None)


async def _page(db: Database, sid: uuid.UUID, query: Select[Any], now: datetime, limit: int) -> Sequence[Row[Any]]:
    async with db.transaction(durable=False) as conn:
        await admit_read(conn, sid, now, db.policy.control_reads_per_hour)
        # entries an unfinished erasure is removing are never shown: only the state (``status``) is
        _, erasure = await erasure_state(conn, sid, lock=False)
        refusal = grant_refusal(erasure)
        if refusal is not None:
            await refuse(conn, Operation.INSPECT, refusal, scope_id=sid, at=now)
        rows = (await conn.execute(query)).all()
        await record(conn, Operation.INSPECT, Result.OK, scope_id=sid, count=min(len(rows), limit), at=now)
    return rows


def _encode_cursor(key: ScopeKey, created_at: datetime, entry_id: uuid.UUID) -> str:
    micros = int(created_at.timestamp() * 1_000_000)
    raw = key.scope_id.bytes[:8] + micros.to_bytes(8, "big", signed=True) + entry_id.bytes
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(key: ScopeKey, cursor: object) -> tuple[datetime, uuid.UUID]:
    """A cursor only moves within the scope it was issued for; anything else is ``bad_input``."""
    if not isinstance(cursor, str) or len(cursor) != 43:
        raise GovernedMemoryError(Reason.BAD_INPUT)
    try:
        raw = base64.urlsafe_b64decode(cursor + "=")
    except (binascii.Error, ValueError):
        raise GovernedMemoryError(Reason.BAD_INPUT) from None
    if len(raw) != 32 or raw[:8] != key.scope_id.bytes[:8]:
        raise GovernedMemoryError(Reason.BAD_INPUT)
    micros = int.from_bytes(raw[8:16], "big", signed=True)
    try:
        created_at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
    except OverflowError:
        raise GovernedMemoryError(Reason.BAD_INPUT) from None
    return created_at, uuid.UUID(bytes=raw[16:])
