"""The storage benchmark runs end to end in a tiny configuration on the test database.

A smoke test, not a timing test: it asserts that the run completes, reports every figure, finds what
exact search must find, and leaves no baseline schema behind. No assertion is about speed.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import asyncpg

_BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "storage.py"


def _storage_benchmark():
    name = "benchmarks_storage"
    if name not in sys.modules:  # dataclasses resolve annotations through sys.modules
        spec = importlib.util.spec_from_file_location(name, _BENCHMARK)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


async def test_storage_benchmark_runs_in_a_tiny_configuration(database_url: str) -> None:
    storage = _storage_benchmark()

    result = await storage.run(database_url, scopes=5, entries=20, queries=10)

    assert {"config", "server", "load", "storage", "search", "admission", "save", "breakdown", "off", "targets"} <= (
        result.keys()
    )
    search = result["search"]
    for side in ("governed", "baseline"):
        assert {"median_ms", "p95_ms", "runs", "recall_at_5"} <= search[side].keys()
        assert 0.0 <= search[side]["recall_at_5"] <= 1.0
    assert search["governed"]["recall_at_5"] == 1.0  # exact search within the scope
    assert {"median", "p95"} <= search["ratio"].keys()
    assert {"governed", "baseline_insert", "ratio"} <= result["save"].keys()
    assert {"governed", "baseline_delete", "ratio"} <= result["off"].keys()
    assert result["off"]["entries"] == 20
    assert result["storage"]["governed"]["bytes_per_entry"] > 0
    assert result["storage"]["baseline"]["bytes_per_entry"] > 0
    assert result["admission"]["governed"]["runs"] == 10
    assert {"search", "admit_units_1", "write_1", "off", "baseline_search", "floor"} <= result["breakdown"].keys()
    assert storage.table(result)
    json.dumps(result)

    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        leftover = await conn.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'upstream_baseline%'")
    finally:
        await conn.close()
    assert leftover == 0
