"""Writes admitted under generation g race a withdrawal or forget-all; after verification nothing survives (R7, R8).

Each trial uses its own seed, so a failing interleaving is reproducible from the trial number.
``KAGENT_GOVERNED_MEMORY_RACE_TRIALS`` raises the count (default 200).
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter

import asyncpg
import pytest
from support import facts, make_key

from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import embed

TRIALS = int(os.environ.get("KAGENT_GOVERNED_MEMORY_RACE_TRIALS", "200"))
FENCED = {Reason.CONSENT_DISABLED, Reason.CONSENT_STALE, Reason.ENTRY_CAP_REACHED}


async def _yield(rng: random.Random) -> None:
    for _ in range(rng.randint(0, 6)):
        await asyncio.sleep(0)  # hand the loop to another task: interleaving, not waiting


async def _trial(store: Store, sql: asyncpg.Connection, trial: int, outcomes: Counter[str]) -> None:
    rng = random.Random(trial)
    key = make_key(f"racer{trial % 7}")
    g = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    written_ids = await store.write(key, g, facts("already there"))
    erase = rng.choice([store.off, store.forget_all])
    # A sealed write stores its key before its row, so an eraser that yields a few times nearly always fences
    # every write; in a third of the trials it waits for the first write to land, then races the rest.
    after_a_write = rng.random() < 1 / 3
    written = asyncio.Event()

    async def writer(n: int) -> None:
        for m in range(rng.randint(1, 3)):
            await _yield(rng)
            try:
                written_ids.extend(await store.write(key, g, facts(f"trial {trial} writer {n} fact {m}")))
                outcomes["written"] += 1
                written.set()
            except GovernedMemoryError as refused:
                assert refused.reason in FENCED, (trial, refused.reason)
                outcomes["fenced"] += 1

    async def reader() -> None:
        await _yield(rng)
        try:
            await store.search(key, g, embed("fact"))
        except GovernedMemoryError as refused:
            assert refused.reason in FENCED, (trial, refused.reason)

    async def eraser() -> None:
        if after_a_write:
            await written.wait()  # set by the first write, which nothing can fence before the erasure
        await _yield(rng)
        # writers fenced out still store a key each before their refused statement, through every round of the
        # erasure's destroy and verify: it is verified against the keys of the rows it deletes, and completes
        await erase(key)

    await asyncio.gather(eraser(), reader(), *(writer(n) for n in range(rng.randint(2, 8))))
    assert await store.key_store.destroyed(key.scope_id, entries=written_ids), trial
    left = await sql.fetchval("SELECT count(*) FROM governed_memory.entries WHERE scope_id = $1", key.scope_id)
    assert left == 0, f"trial {trial}: {left} rows survived {erase.__name__}"
    with pytest.raises(GovernedMemoryError) as late:
        await store.write(key, g, facts("a late background save"))
    assert late.value.reason in (Reason.CONSENT_DISABLED, Reason.CONSENT_STALE)
    assert (await store.status(key)).entries == 0


@pytest.mark.long
async def test_no_write_under_an_old_generation_survives_an_erasure(store: Store, sql: asyncpg.Connection) -> None:
    outcomes: Counter[str] = Counter()
    for trial in range(TRIALS):
        await _trial(store, sql, trial, outcomes)
    assert outcomes["written"] > 0 and outcomes["fenced"] > 0  # both sides of the race were exercised
