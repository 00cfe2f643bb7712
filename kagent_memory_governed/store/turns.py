"""Conversation turns, the input of auto-save (R36): recorded under the generation that admitted them,
collected once, and never across an erasure or a withdrawal. Only references derived from ids are kept.
Each is one call of a database function (``store/sql/``), fenced in the statement that does the work."""

from __future__ import annotations

from collections.abc import Sequence

from kagent_memory_governed import clock
from kagent_memory_governed.consent import admit_generation
from kagent_memory_governed.errors import Reason
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import functions
from kagent_memory_governed.store.database import Database, raise_refusal
from kagent_memory_governed.store.values import Turn, turn_ref


async def record_turn(
    db: Database, key: ScopeKey, generation: int, session_id: str, invocation_id: str, *, recalled: bool
) -> tuple[Reason | None, int]:
    admit_generation(generation)
    parameters = {
        "scope": key.scope_id,
        "generation": generation,
        "now": clock.now(),
        "session": turn_ref(session_id),
        "invocation": turn_ref(invocation_id),
        "recalled": recalled,
    }
    [row] = await db.call(functions.RECORD_TURN, parameters)
    return (Reason(row.refusal) if row.refusal else None), row.waiting


async def collect_turns(
    db: Database, key: ScopeKey, generation: int, session_id: str, candidates: Sequence[str]
) -> list[Turn]:
    admit_generation(generation)
    refs = {turn_ref(invocation): invocation for invocation in candidates}
    parameters = {
        "scope": key.scope_id,
        "generation": generation,
        "now": clock.now(),
        "session": turn_ref(session_id),
        "candidates": list(refs),
    }
    rows = await db.call(functions.COLLECT_TURNS, parameters)
    raise_refusal(rows)
    return [Turn(refs[row.invocation_ref], row.recalled) for row in rows]
