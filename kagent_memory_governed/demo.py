"""``kagent-memory-governed demo``: the governed lifecycle, step by step, on the embedded default.

Synthetic facts for one demo subject; the deterministic local embedder stands in for a provider.
Each step prints what the store answered: ids, counts, generations and reason codes. Fact text is
shown only where the subject's own inspect view would show it.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable
from datetime import timedelta

from freezegun import freeze_time

from kagent_memory_governed import clock
from kagent_memory_governed.embedded import database_url
from kagent_memory_governed.errors import GovernedMemoryError
from kagent_memory_governed.local_embedding import embed
from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey
from kagent_memory_governed.settings import Settings
from kagent_memory_governed.store import NewFact, Store

FACTS = ["The user prefers green tea over coffee", "The user's team deploys on Fridays", "The user lives in Lisbon"]


def _step(title: str) -> None:
    print(f"\n== {title}")


async def _refusal(work: Awaitable[object]) -> str:
    try:
        await work
    except GovernedMemoryError as refused:
        return refused.reason.value
    raise AssertionError("the store admitted what it must refuse")


async def run(settings: Settings) -> None:
    store = Store.connect(database_url(settings), settings.load_policy())
    try:
        await _lifecycle(store)
    finally:
        await store.close()


async def _lifecycle(store: Store) -> None:
    key = ScopeKey(
        Principal.parse("@demo:localhost", "native"),
        AgentId.parse("kagent/demo-agent"),
        ControlRoom.parse(f"!demo{uuid.uuid4().hex[:12]}:localhost"),
    )
    other_room = ScopeKey(key.principal, key.agent, ControlRoom.parse(f"!other{uuid.uuid4().hex[:12]}:localhost"))
    facts = [NewFact(text, embed(text)) for text in FACTS]

    _step("migrate")
    print(f"schema revision {await store.migrate()}")

    _step("before consent nothing runs")
    print(f"write refused: {await _refusal(store.write(key, 1, facts))}")
    print(f"search refused: {await _refusal(store.search(key, 1, embed('tea')))}")

    _step("explicit, versioned consent for one control room")
    grant = await store.grant(key, purpose="personal-assistant", policy_version="2026-11")
    print(f"enabled at generation {grant.generation}; max expiry {grant.max_expiry_seconds}s; cap {grant.entry_cap}")

    _step("save under the consented generation")
    ids = await store.write(key, grant.generation, facts)
    print(f"stored {len(ids)} entries")

    _step("search within the scope (exact cosine, live entries only)")
    hits = await store.search(key, grant.generation, embed("which tea does the user like"), top_k=1)
    print(f"best hit {hits[0].entry_id} score {hits[0].score:.2f}")
    print(f"same subject, another room sees: {await _refusal(store.search(other_room, 1, embed('tea')))}")

    _step("inspect (the subject's own view), two per page")
    page = await store.inspect(key, limit=2)
    for entry in page.entries:
        print(f"{entry.entry_id}  {entry.source_scope}  expires {entry.expires_at:%Y-%m-%dT%H:%M:%SZ}  {entry.text!r}")
    print(f"next cursor: {'yes' if page.next_cursor else 'no'}")

    _step("forget exactly one entry, verified")
    forgotten = await store.forget(key, ids[0])
    status = await store.status(key)
    print(f"erased {forgotten.erased}; verified; {status.entries} entries left; generation now {status.generation}")
    print(f"a save under the old generation: {await _refusal(store.write(key, grant.generation, facts[:1]))}")

    _step("hard expiry under a frozen clock (7 days later)")
    with freeze_time(clock.now() + timedelta(days=7), real_asyncio=True):
        later = await store.status(key)
        found = await store.search(key, later.generation, embed("Lisbon"))
        print(f"live entries {later.entries}; search hits {len(found)}; swept {await store.sweep()}")

    _step("entry cap: refuse when full, never evict")
    status = await store.status(key)
    filler = [NewFact(f"demo fact number {n}", embed(f"demo fact number {n}")) for n in range(status.entry_cap)]
    await store.write(key, status.generation, filler)
    one_more = await _refusal(store.write(key, status.generation, facts[:1]))
    print(f"{(await store.status(key)).entries} entries; one more: {one_more}")

    _step("off: disable first, then erase and verify")
    off = await store.off(key)
    status = await store.status(key)
    print(f"enabled {status.enabled}; generation {off.generation}; erased {off.erased}")
    print(f"last erasure: {status.last_erasure.result}")
    print(
        f"a background save admitted before off: {await _refusal(store.write(key, status.generation - 1, facts[:1]))}"
    )

    _step("offboard the principal: every scope, every agent")
    result = await store.offboard(key.principal)
    print(f"scopes {result.scopes}; erased {result.erased}; verified")
