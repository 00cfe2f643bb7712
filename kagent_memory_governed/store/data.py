"""The data plane: facts written and searched under a consent generation, fenced in the transaction that
does the work; and the subject's own paged view of its entries, with cursors bound to their scope."""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, insert, select, true, tuple_
from sqlalchemy.dialects.postgresql import JSON

from kagent_memory_governed import clock
from kagent_memory_governed.consent import admit_generation, fence, grant_refusal
from kagent_memory_governed.errors import GovernedMemoryError, Operation, Reason, Result
from kagent_memory_governed.policy import admit_embedding, admit_fact, admit_int, expiry_seconds
from kagent_memory_governed.schema import entries, scopes
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store.database import STATE_COLUMNS, Database, record, refuse, scope_state, state_of
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
    now = clock.now()
    texts = list(dict.fromkeys(fact for fact, _ in admitted))
    async with db.transaction() as conn:
        state = await scope_state(conn, sid, lock=True)
        refusal = fence(state, generation, now)
        if refusal is None:
            # counted after the lock; a fact equal to a live entry keeps that entry and its expiry (R36)
            live, known = (
                await conn.execute(
                    select(
                        func.count(),
                        func.json_object_agg(entries.c.text, entries.c.entry_id, type_=JSON).filter(
                            entries.c.text.in_(texts)
                        ),
                    ).where(entries.c.scope_id == sid, entries.c.expires_at > now)
                )
            ).one()
            known = {text: uuid.UUID(entry_id) for text, entry_id in (known or {}).items()}
            new: dict[str, list[float]] = {}
            for fact, vector in admitted:
                if fact not in known:
                    new.setdefault(fact, vector)
            if new and live + len(new) > min(state.entry_cap, db.policy.entry_cap):
                refusal = Reason.ENTRY_CAP_REACHED
        if refusal is not None:
            await refuse(conn, Operation.WRITE, refusal, scope_id=sid, generation=generation, at=now)
        lifetime = timedelta(seconds=expiry_seconds(expires_in, db.policy, state.max_expiry_seconds))
        known |= {fact: uuid.uuid4() for fact in new}
        if new:
            await conn.execute(
                insert(entries),
                [
                    {
                        "scope_id": sid,
                        "entry_id": known[fact],
                        "text": fact,
                        "embedding": vector,
                        "generation": generation,
                        "created_at": now,
                        "expires_at": now + lifetime,
                    }
                    for fact, vector in new.items()
                ],
            )
        await record(conn, Operation.WRITE, Result.OK, scope_id=sid, generation=generation, count=len(new), at=now)
    return [known[fact] for fact, _ in admitted]


async def search(
    db: Database, key: ScopeKey, generation: int, embedding: Sequence[float], *, top_k: int, min_score: float
) -> list[Hit]:
    sid = key.scope_id
    async with db.checking(Operation.SEARCH, scope_id=sid):
        admit_generation(generation)
        query = admit_embedding(embedding)
        admit_int(top_k, low=1, high=db.policy.entry_cap)
        if not -1.0 <= float(min_score) <= 1.0:
            raise GovernedMemoryError(Reason.BAD_INPUT)
    now = clock.now()
    distance = entries.c.embedding.cosine_distance(query)
    hits = (
        select(
            entries.c.entry_id,
            entries.c.text,
            entries.c.created_at,
            entries.c.expires_at,
            distance.label("distance"),
        )
        .where(entries.c.scope_id == scopes.c.scope_id, entries.c.expires_at > now, distance <= 1.0 - min_score)
        .order_by(distance, entries.c.entry_id)
        .limit(top_k)
        .lateral("hits")
    )
    statement = (
        select(*STATE_COLUMNS, hits)
        .select_from(scopes.outerjoin(hits, true()))
        .where(scopes.c.scope_id == sid)
        .order_by(hits.c.distance, hits.c.entry_id)
    )
    async with db.transaction(durable=False) as conn:
        rows = (await conn.execute(statement)).all()
        refusal = fence(state_of(rows[0]) if rows else None, generation, now)
        if refusal is not None:
            await refuse(conn, Operation.SEARCH, refusal, scope_id=sid, generation=generation, at=now)
        found = [
            Hit(r.entry_id, r.text, 1.0 - r.distance, r.created_at, r.expires_at)
            for r in rows
            if r.entry_id is not None
        ]
        await record(conn, Operation.SEARCH, Result.OK, scope_id=sid, generation=generation, count=len(found), at=now)
    return found


async def inspect(db: Database, key: ScopeKey, *, limit: int, cursor: str | None) -> Page:
    sid = key.scope_id
    async with db.checking(Operation.INSPECT, scope_id=sid):
        admit_int(limit, low=1, high=MAX_PAGE)
        after = _decode_cursor(key, cursor) if cursor is not None else None
    now = clock.now()
    query = (
        select(entries.c.entry_id, entries.c.text, entries.c.created_at, entries.c.expires_at)
        .where(entries.c.scope_id == sid, entries.c.expires_at > now)
        .order_by(entries.c.created_at, entries.c.entry_id)
        .limit(limit + 1)
    )
    if after is not None:
        query = query.where(tuple_(entries.c.created_at, entries.c.entry_id) > tuple_(*after))
    async with db.transaction(durable=False) as conn:
        # entries an unfinished erasure is removing are never shown: only the state (``status``) is
        refusal = grant_refusal(await scope_state(conn, sid, lock=False))
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
