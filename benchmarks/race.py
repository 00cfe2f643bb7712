"""Race harness: concurrent saves, auto-save batches and searches across scopes while withdrawals,
forget-alls, offs and offboards land at random points. Every trial checks the invariants:

- after an erasure is verified, the erased scope has zero rows and keeps zero rows (every worker
  holds the generation admitted before the erasure);
- no read under a fenced-off generation returns anything;
- no scope ever holds more live entries than its cap.

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

from kagent_memory_governed.embedded import start
from kagent_memory_governed.errors import GovernedMemoryError
from kagent_memory_governed.local_embedding import embed
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey
from kagent_memory_governed.store import NewFact, Store

CAP = 12  # a low cap, so the cap is contended too
VECTOR = embed("a remembered fact")


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

    work = [erase()]
    for _ in range(rng.randint(6, 14)):
        key = rng.choice(keys)
        work.append(save(key, rng.choice([1, 1, 1, 4, 10])) if rng.random() < 0.7 else search(key))
    await asyncio.gather(*work)
    for key in keys:
        entries = (await store.status(key)).entries
        if fenced[key] and entries:
            violations.append("an erased scope gained rows afterwards")
        if entries > CAP:
            violations.append("a scope passed its cap")
    return violations


async def run(url: str, trials: int, seed: int = 1) -> dict:
    store = Store.connect(url, Policy(entry_cap=CAP), pool_size=10, max_overflow=10)
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
    url = args.url or start(Path(tempfile.mkdtemp()) / "pg")
    result = asyncio.run(run(url, args.trials, args.seed))
    print(json.dumps(result, indent=2))  # noqa: T201
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "race.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
