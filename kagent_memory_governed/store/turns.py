"""Conversation turns, the input of auto-save (R36): recorded under the generation that admitted them,
collected once, and never across an erasure or a withdrawal. Only references derived from ids are kept.
Each is one call of a database function (migration 0007), fenced in the statement that does the work."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import BigInteger, Boolean, DateTime, bindparam, func, select
from sqlalchemy.dialects.postgresql import ARRAY, UUID

from kagent_memory_governed import clock
from kagent_memory_governed.consent import admit_generation
from kagent_memory_governed.errors import Reason
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store.database import Database, raise_refusal
from kagent_memory_governed.store.values import Turn, turn_ref


async def record_turn(
    db: Database, key: ScopeKey, generation: int, session_id: str, invocation_id: str, *, recalled: bool
) -> tuple[Reason | None, int]:
    admit_generation(generation)
    call = func.governed_memory.record_turn(
        bindparam("scope", key.scope_id, type_=UUID),
        bindparam("generation", generation, type_=BigInteger),
        bindparam("now", clock.now(), type_=DateTime(timezone=True)),
        bindparam("session", turn_ref(session_id), type_=UUID),
        bindparam("invocation", turn_ref(invocation_id), type_=UUID),
        bindparam("recalled", recalled, type_=Boolean),
    ).table_valued("refusal", "waiting")
    [row] = await db.call(select(call.c.refusal, call.c.waiting))
    return (Reason(row.refusal) if row.refusal else None), row.waiting


async def collect_turns(
    db: Database, key: ScopeKey, generation: int, session_id: str, candidates: Sequence[str]
) -> list[Turn]:
    admit_generation(generation)
    refs = {turn_ref(invocation): invocation for invocation in candidates}
    call = func.governed_memory.collect_turns(
        bindparam("scope", key.scope_id, type_=UUID),
        bindparam("generation", generation, type_=BigInteger),
        bindparam("now", clock.now(), type_=DateTime(timezone=True)),
        bindparam("session", turn_ref(session_id), type_=UUID),
        bindparam("candidates", list(refs), type_=ARRAY(UUID)),
    ).table_valued("refusal", "invocation_ref", "recalled")
    rows = await db.call(select(call.c.refusal, call.c.invocation_ref, call.c.recalled))
    raise_refusal(rows)
    return [Turn(refs[row.invocation_ref], row.recalled) for row in rows]
