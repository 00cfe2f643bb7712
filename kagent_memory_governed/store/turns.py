"""Conversation turns, the input of auto-save (R36): recorded under the generation that admitted them,
collected once, and never across an erasure or a withdrawal. Only references derived from ids are kept."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from kagent_memory_governed import clock
from kagent_memory_governed.consent import admit_generation, fence
from kagent_memory_governed.errors import Operation, Result
from kagent_memory_governed.schema import turns
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store.database import Database, record, refuse, scope_state
from kagent_memory_governed.store.values import Turn, turn_ref


async def record_turn(
    db: Database, key: ScopeKey, generation: int, session_id: str, invocation_id: str, *, recalled: bool
) -> int:
    sid = key.scope_id
    admit_generation(generation)
    session = turn_ref(session_id)
    now = clock.now()
    async with db.transaction(durable=False) as conn:
        if fence(await scope_state(conn, sid, lock=False), generation, now) is not None:
            return 0
        await conn.execute(
            pg_insert(turns)
            .values(
                scope_id=sid,
                session_ref=session,
                invocation_ref=turn_ref(invocation_id),
                generation=generation,
                recalled=recalled,
                at=now,
            )
            .on_conflict_do_update(
                index_elements=[turns.c.scope_id, turns.c.session_ref, turns.c.invocation_ref],
                set_={"recalled": turns.c.recalled | recalled},
            )
        )
        return await conn.scalar(
            select(func.count()).where(
                turns.c.scope_id == sid, turns.c.session_ref == session, turns.c.generation == generation
            )
        )


async def collect_turns(
    db: Database, key: ScopeKey, generation: int, session_id: str, candidates: Sequence[str]
) -> list[Turn]:
    sid = key.scope_id
    admit_generation(generation)
    refs = {turn_ref(invocation): invocation for invocation in candidates}
    now = clock.now()
    async with db.transaction() as conn:
        refusal = fence(await scope_state(conn, sid, lock=False), generation, now)
        if refusal is not None:
            await refuse(conn, Operation.COLLECT, refusal, scope_id=sid, generation=generation, at=now)
        this_session = [turns.c.scope_id == sid, turns.c.session_ref == turn_ref(session_id)]
        await conn.execute(delete(turns).where(*this_session, turns.c.generation != generation))
        taken = (
            await conn.execute(
                delete(turns)
                .where(*this_session, turns.c.invocation_ref.in_(list(refs)))
                .returning(turns.c.invocation_ref, turns.c.recalled)
            )
        ).all()
        await record(conn, Operation.COLLECT, Result.OK, scope_id=sid, generation=generation, count=len(taken), at=now)
    return [Turn(refs[row.invocation_ref], row.recalled) for row in taken]
