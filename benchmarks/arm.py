"""One arm of ``storage.py``'s side-by-side comparison: a store of some version of this package, driven over stdin.

    python benchmarks/arm.py --url URL --scopes N --entries E --saves S [--key-store URL]

Run by ``storage.py`` with ``PYTHONPATH`` naming the tree whose ``kagent_memory_governed`` it measures (an earlier
revision, checked out by ``git archive``, or this one), so every arm runs the same code here against its own
store. It loads ``N`` scopes of ``E`` entries and ``S`` scopes of ``E - 1`` through the public API (grant, write),
then answers one JSON line per command line, ``{"op": "search" | "load" | "prefetch" | "save", "runs": k}``, with
the seconds of each run and, for reads, recall@5 against exact top-5 computed here with numpy.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from storage import SUBQUERIES, TOP_K, Data, _key  # noqa: E402  (the benchmark's data, same seed, same scopes)

from kagent_memory_governed.errors import Operation  # noqa: E402
from kagent_memory_governed.policy import Policy  # noqa: E402
from kagent_memory_governed.store import NewFact, Store  # noqa: E402


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--scopes", type=int, required=True)
    parser.add_argument("--entries", type=int, required=True)
    parser.add_argument("--saves", type=int, required=True)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--key-store")
    args = parser.parse_args()
    options = {}
    if "keys" in inspect.signature(Store.connect).parameters:  # a version that seals entries
        from kagent_memory_governed.settings import Settings

        try:
            from kagent_memory_governed.embedded import key_store as configured
        except ImportError:  # a version before the door chose the key store from the settings
            from kagent_memory_governed.keys import configured  # type: ignore[attr-defined,no-redef]

        options["keys"] = configured(Settings(key_store=args.key_store, key_store_token=_token()))
    store = Store.connect(args.url, Policy(), **options)
    await store.migrate()
    data, rng = Data(args.seed, args.entries), np.random.default_rng(args.seed + 1)
    scopes, fresh = [], []
    for index in range(args.scopes + args.saves):
        key = _key("arm", f"s{index}")
        generation = (await store.grant(key, purpose="bench", policy_version="v1")).generation
        vectors, topics, texts = data.scope(index)
        full = index < args.scopes
        count = args.entries if full else args.entries - 1
        ids = await store.write(
            key, generation, [NewFact(t, v.tolist()) for t, v in zip(texts[:count], vectors[:count], strict=True)]
        )
        (scopes if full else fresh).append((key, generation, index, {entry: i for i, entry in enumerate(ids)}))
    print(json.dumps({"loaded": len(scopes) + len(fresh)}), flush=True)  # noqa: T201

    def query(scope) -> tuple[np.ndarray, set[int]]:
        vectors, topics, _ = data.scope(scope[2])
        asked = data.query(rng, topics)
        return asked, Data.truth(vectors, asked, TOP_K)

    def recall(ids, known, truth) -> float:
        return len({known[i] for i in ids} & truth) / len(truth)

    for line in sys.stdin:
        command = json.loads(line)
        seconds, recalls = [], []
        for _ in range(command["runs"]):
            if command["op"] == "save":
                key, generation, index, _ = fresh.pop()
                vectors, _, texts = data.scope(index)
                fact = NewFact(texts[-1], vectors[-1].tolist())
                started = time.perf_counter()
                await store.admit(key, generation, Operation.AUTOSAVE, units=1)
                await store.write(key, generation, [fact])
                seconds.append(time.perf_counter() - started)
                continue
            scope = scopes[int(rng.integers(len(scopes)))]
            asked = [query(scope) for _ in range(SUBQUERIES if command["op"] == "prefetch" else 1)]
            started = time.perf_counter()
            if command["op"] == "load":  # the runtime's load_memory: admitted first, then searched
                await store.admit(scope[0], scope[1], Operation.LOAD, units=1)
            found = await store.search_many(
                scope[0], scope[1], [a.tolist() for a, _ in asked], top_k=TOP_K, min_score=-1.0
            )
            seconds.append(time.perf_counter() - started)
            recalls += [
                recall([h.entry_id for h in hits], scope[3], t) for hits, (_, t) in zip(found, asked, strict=True)
            ]
        print(json.dumps({"seconds": seconds, "recall": recalls}), flush=True)  # noqa: T201
    await store.close()


def _token() -> str | None:
    import os

    return os.environ.get("KAGENT_GOVERNED_MEMORY_KEY_STORE_TOKEN")


if __name__ == "__main__":
    asyncio.run(main())
