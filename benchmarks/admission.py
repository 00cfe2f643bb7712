"""The added latency of cost admission against a plain governed save.

    python benchmarks/admission.py [--url postgresql+asyncpg://...] [--runs 500]

Prints medians and writes benchmarks/results/admission.json. Unset --url: the embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from kagent_memory_governed.embedded import key_store, start
from kagent_memory_governed.keys import LocalKeyStore
from kagent_memory_governed.mode import load
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey
from kagent_memory_governed.store import NewFact, Store
from kagent_memory_governed.testing.embedder import embed


def key() -> ScopeKey:
    room = ControlRoom.parse(f"!bench{uuid.uuid4().hex[:12]}:example.org")
    return ScopeKey(
        Principal.parse(f"@u{uuid.uuid4().hex[:8]}:example.org", "native"), AgentId.parse("kagent/bench"), room
    )


async def measure(store: Store, runs: int) -> dict[str, float]:
    fact = [NewFact("the user prefers green tea", embed("the user prefers green tea"))]
    plain, admitted, admission = [], [], []
    for _ in range(runs):
        scope = key()  # a fresh principal and scope per run: the check runs in full and never refuses
        generation = (await store.grant(scope, purpose="bench", policy_version="v1")).generation
        started = time.perf_counter()
        await store.write(scope, generation, fact)
        plain.append(time.perf_counter() - started)
        started = time.perf_counter()
        await store.admit(scope, generation, "save", units=1, explicit=True)
        middle = time.perf_counter()
        await store.write(scope, generation, fact)
        admitted.append(time.perf_counter() - started)
        admission.append(middle - started)
        await store.off(scope)
    return {
        "runs": runs,
        "plain_save_median_ms": statistics.median(plain) * 1000,
        "admission_median_ms": statistics.median(admission) * 1000,
        "admitted_save_median_ms": statistics.median(admitted) * 1000,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url")
    parser.add_argument("--runs", type=int, default=500)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp())
    url = args.url or start(scratch / "pg")
    # a throwaway database has a key store of its own beside it; a given one, the settings' (as the CLI's)
    keys = key_store(load()) if args.url else LocalKeyStore(scratch / "keys")
    store = Store.connect(url, Policy(), keys=keys)
    try:
        await store.migrate()
        await measure(store, 20)  # warm the pool and the plans
        result = await measure(store, args.runs)
    finally:
        await store.close()
    for name, value in result.items():
        print(f"{name:28} {value:.3f}" if isinstance(value, float) else f"{name:28} {value}")  # noqa: T201
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "admission.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
