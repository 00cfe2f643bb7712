"""Race harness: concurrent saves, auto-save batches, summarizing auto-saves and searches across scopes
while withdrawals, forget-alls, offs, offboards and single-entry forgets land at random points. Every
trial checks the invariants:

- after an erasure is verified, the erased scope has zero rows and keeps zero rows (every worker
  holds the generation admitted before the erasure);
- no read under a fenced-off generation returns anything;
- no scope ever holds more live entries than its cap;
- a fact forgotten while an auto-save was summarizing the turns that said it never comes back, and no
  admitted turn is collected twice (R36).

    python benchmarks/race.py [--url postgresql+asyncpg://...] [--trials 10000] [--seed 1]

Prints trials, operations and violations (goal: 0) and writes benchmarks/results/race.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from kagent_memory_governed.embedded import key_store, start
from kagent_memory_governed.errors import GovernedMemoryError
from kagent_memory_governed.keys import KeyStore, LocalKeyStore
from kagent_memory_governed.mode import load
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey
from kagent_memory_governed.store import NewFact, Store
from kagent_memory_governed.testing.embedder import embed

CAP = 12  # a low cap, so the cap is contended too
VECTOR = embed("a remembered fact")
SAID = "I drink lapsang souchong"


def _keys(principal: Principal, count: int) -> list[ScopeKey]:
    agents = [AgentId.parse("kagent/helper"), AgentId.parse("kagent/planner")]
    return [
        ScopeKey(principal, agents[n % 2], ControlRoom.parse(f"!race{uuid.uuid4().hex[:16]}:example.org"))
        for n in range(count)
    ]


async def _yield(rng: random.Random) -> None:
    for _ in range(rng.randint(0, 8)):
        await asyncio.sleep(0)  # interleaving, not waiting


async def trial(store: Store, rng: random.Random, tally: Counter) -> list[str]:
    """One trial; returns the violations it found (empty when every invariant held)."""
    subject = Principal.parse(f"@r{uuid.uuid4().hex[:10]}:example.org", "native")
    keys = _keys(subject, 3)
    generations = {key: (await store.grant(key, purpose="race", policy_version="v1")).generation for key in keys}
    fenced: dict[ScopeKey, bool] = {key: False for key in keys}
    violations: list[str] = []

    async def save(key: ScopeKey, batch: int) -> None:
        await _yield(rng)
        try:
            await store.admit(key, generations[key], "autosave" if batch > 1 else "save", units=batch)
            await store.write(key, generations[key], [NewFact(f"fact {n}", VECTOR) for n in range(batch)])
            tally["writes"] += 1
        except GovernedMemoryError as refused:
            tally[refused.reason.value] += 1

    async def search(key: ScopeKey) -> None:
        await _yield(rng)
        was_fenced = fenced[key]
        try:
            hits = await store.search(key, generations[key], VECTOR, top_k=CAP)
        except GovernedMemoryError as refused:
            tally[refused.reason.value] += 1
            return
        tally["reads"] += 1
        if was_fenced and hits:
            violations.append("read under a fenced-off generation returned entries")

    async def erase() -> None:
        await _yield(rng)
        kind = rng.choice(["off", "forget_all", "offboard"])
        targets = keys if kind == "offboard" else [rng.choice(keys)]
        try:
            if kind == "offboard":
                await store.offboard(subject)
            else:
                await getattr(store, kind)(targets[0])
        except GovernedMemoryError as refused:
            tally[refused.reason.value] += 1
            return
        tally[kind] += 1
        for key in targets:
            fenced[key] = True
            if (await store.status(key)).entries:
                violations.append(f"rows left after a verified {kind}")

    said = keys[0]  # a fact said in this scope's conversation, stored, and forgotten at a random point
    [remembered] = await store.write(said, generations[said], [NewFact(SAID, VECTOR)])
    turns = [f"turn-{n}" for n in range(5)]
    for turn in turns:
        await store.record_turn(said, generations[said], "session", turn, recalled=rng.random() < 0.2)
    collected: list[str] = []
    forgotten = False
    # the forget lands before the first auto-save collects, while it summarizes, after it admits, or after it wrote
    stages = [asyncio.Event() for _ in range(4)]
    lands_at = rng.randrange(len(stages) + 1)

    async def summarizing_autosave(first: bool) -> None:
        """The auto-save's steps as the runtime takes them: collect, summarize (time passes), admit, write."""
        reached = list(stages) if first else []

        def reach() -> None:
            if reached:
                reached.pop(0).set()

        await _yield(rng)
        try:
            reach()
            taken = await store.collect_turns(said, generations[said], "session", turns)
            collected.extend(turn.invocation_id for turn in taken)
            if not taken:
                return
            reach()
            await _yield(rng)  # the model is summarizing
            await store.admit(said, generations[said], "autosave", units=2)
            reach()
            await store.write(said, generations[said], [NewFact(SAID, VECTOR), NewFact("another fact", VECTOR)])
            tally["summarized_writes"] += 1
        except GovernedMemoryError as refused:
            tally[f"autosave_{refused.reason.value}"] += 1
        finally:
            for stage in reached:
                stage.set()

    async def forget() -> None:
        nonlocal forgotten
        if lands_at < len(stages):
            await stages[lands_at].wait()
        await _yield(rng)
        try:
            await store.forget(said, remembered)
        except GovernedMemoryError as refused:
            tally[f"forget_{refused.reason.value}"] += 1
            return
        forgotten = True
        tally["forget"] += 1

    work = [erase(), forget(), *(summarizing_autosave(n == 0) for n in range(rng.randint(1, 2)))]
    for _ in range(rng.randint(6, 14)):
        key = rng.choice(keys)
        work.append(save(key, rng.choice([1, 1, 1, 4, 10])) if rng.random() < 0.7 else search(key))
    await asyncio.gather(*work)
    if len(collected) != len(set(collected)):
        violations.append("an admitted turn was collected twice")
    if forgotten and any(entry.text == SAID for entry in (await store.inspect(said)).entries):
        violations.append("a forgotten fact came back from a summarizing auto-save")
    for key in keys:
        entries = (await store.status(key)).entries
        if fenced[key] and entries:
            violations.append("an erased scope gained rows afterwards")
        if entries > CAP:
            violations.append("a scope passed its cap")
    return violations


async def run(url: str, trials: int, seed: int = 1, keys: KeyStore | None = None) -> dict:
    """``trials`` races over ``url``; ``keys``: its key store (unset: the one the settings name, as the CLI's)."""
    keys = keys or key_store(load())
    store = Store.connect(url, Policy(entry_cap=CAP), keys=keys, pool_size=10, max_overflow=10)
    tally: Counter = Counter()
    violations: list[str] = []
    started = time.perf_counter()
    try:
        await store.migrate()
        for number in range(trials):
            violations += await trial(store, random.Random(seed * 1_000_003 + number), tally)
    finally:
        await store.close()
    return {
        "trials": trials,
        "seconds": round(time.perf_counter() - started, 1),
        "violations": len(violations),
        "violation_kinds": dict(Counter(violations)),
        "outcomes": dict(tally),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url")
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp())
    url = args.url or start(scratch / "pg")
    keys = None if args.url else LocalKeyStore(scratch / "keys")  # a throwaway database's keys beside it
    result = asyncio.run(run(url, args.trials, args.seed, keys))
    print(json.dumps(result, indent=2))  # noqa: T201
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "race.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
