"""The data plane: facts written and searched under a consent generation, fenced in the transaction that
does the work; and the subject's own paged view of its entries, with cursors bound to their scope."""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy import select, tuple_

from kagent_memory_governed import clock
from kagent_memory_governed.consent import admit_generation, grant_refusal
from kagent_memory_governed.errors import GovernedMemoryError, Operation, Reason, Result
from kagent_memory_governed.policy import admit_embedding, admit_fact, admit_int, expiry_seconds
from kagent_memory_governed.schema import entries, live
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import functions
from kagent_memory_governed.store.database import Database, admit_read, erasure_state, raise_refusal, record, refuse
from kagent_memory_governed.store.values import MAX_PAGE, Entry, Hit, NewFact, Page


async def write(
    db: Database, key: ScopeKey, generation: int, facts: Sequence[NewFact], *, expires_in: int | None
) -> list[uuid.UUID]:
    sid = key.scope_id
    async with db.checking(Operation.WRITE, scope_id=sid):
        admit_generation(generation)
        if not facts or len(facts) > db.policy.entry_cap:
            raise GovernedMemoryError(Reason.BAD_INPUT)
        admitted = [(admit_fact(f.text, db.policy), admit_embedding(f.embedding)) for f in facts]
        # the policy's bound; the function lowers it to what the scope's consent allows
        lifetime = expiry_seconds(expires_in, db.policy, db.policy.max_expiry_seconds)
    parameters = {
        "scope": sid,
        "generation": generation,
        "now": clock.now(),
        "facts": [fact for fact, _ in admitted],
        "vectors": [vector for _, vector in admitted],
        "cap": db.policy.entry_cap,
        "lifetime": lifetime,
    }
    rows = await db.call(functions.WRITE, parameters)
    raise_refusal(rows)
    stored = {row.fact: row.entry_id for row in rows}
    return [stored[fact] for fact, _ in admitted]


async def search(
    db: Database,
    key: ScopeKey,
    generation: int,
    embeddings: Sequence[Sequence[float]],
    *,
    top_k: int,
    min_score: float,
) -> list[list[Hit]]:
    sid = key.scope_id
    async with db.checking(Operation.SEARCH, scope_id=sid):
        admit_generation(generation)
        admit_int(len(embeddings), low=1, high=db.policy.prefetch_max_subqueries)
        queries = [admit_embedding(embedding) for embedding in embeddings]
        admit_int(top_k, low=1, high=db.policy.entry_cap)
        if not -1.0 <= float(min_score) <= 1.0:
            raise GovernedMemoryError(Reason.BAD_INPUT)
    parameters = {
        "scope": sid,
        "generation": generation,
        "now": clock.now(),
        "queries": queries,
        "top_k": top_k,
        "max_distance": 1.0 - float(min_score),
    }
    rows = await db.call(functions.SEARCH, parameters)
    raise_refusal(rows)
    found: list[list[Hit]] = [[] for _ in queries]
    for r in rows:
        if r.entry_id is not None:
            found[r.query - 1].append(Hit(r.entry_id, r.fact, 1.0 - r.distance, r.created_at, r.expires_at))
    return found


async def inspect(db: Database, key: ScopeKey, *, limit: int, cursor: str | None) -> Page:
    sid = key.scope_id
    async with db.checking(Operation.INSPECT, scope_id=sid):
        admit_int(limit, low=1, high=MAX_PAGE)
        after = _decode_cursor(key, cursor) if cursor is not None else None
    now = clock.now()
    query = (
        select(entries.c.entry_id, entries.c.text, entries.c.created_at, entries.c.expires_at)
        .where(entries.c.scope_id == sid, live(now))
        .order_by(entries.c.created_at, entries.c.entry_id)
        .limit(limit + 1)
    )
    if after is not None:
        query = query.where(tuple_(entries.c.created_at, entries.c.entry_id) > tuple_(*after))
    async with db.transaction(durable=False) as conn:
        await admit_read(conn, sid, now, db.policy.control_reads_per_hour)
        # entries an unfinished erasure is removing are never shown: only the state (``status``) is
        _, erasure = await erasure_state(conn, sid, lock=False)
        refusal = grant_refusal(erasure)
        if refusal is not None:
            await refuse(conn, Operation.INSPECT, refusal, scope_id=sid, at=now)
        rows = (await conn.execute(query)).all()
        await record(conn, Operation.INSPECT, Result.OK, scope_id=sid, count=min(len(rows), limit), at=now)
    page = [Entry(r.entry_id, r.text, str(key.room), r.created_at, r.expires_at) for r in rows[:limit]]
    more = len(rows) > limit
    return Page(page, _encode_cursor(key, page[-1].created_at, page[-1].entry_id) if more else None)


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
