"""The storage benchmark runs end to end in a tiny configuration on the test database.

A smoke test, not a timing test: it asserts that the run completes, reports every figure (the floor with the
sealing work and key-store calls it counts, each operation's ratio to it and to the baseline, the round trips
counted), finds what exact search must find, and leaves no baseline schema behind. No assertion is about speed.
"""

from __future__ import annotations

import json
from pathlib import Path

import asyncpg
import pytest
from support import benchmark, key_store_of

from kagent_memory_governed.keys import LocalKeyStore


async def test_storage_benchmark_runs_in_a_tiny_configuration(database_url: str, key_store: LocalKeyStore) -> None:
    storage = benchmark("storage")

    result = await storage.run(database_url, scopes=5, entries=20, queries=10, keys=key_store)

    assert {
        "config",
        "server",
        "load",
        "storage",
        "search",
        "prefetch",
        "admission",
        "save",
        "breakdown",
        "off",
        "floor",
        "operations",
        "targets",
    } <= result.keys()
    search = result["search"]
    for side in ("governed", "baseline"):
        assert {"median_ms", "p95_ms", "runs", "recall_at_5"} <= search[side].keys()
        assert 0.0 <= search[side]["recall_at_5"] <= 1.0
    assert search["governed"]["recall_at_5"] == 1.0  # exact search within the scope
    assert result["prefetch"]["governed"]["recall_at_5"] == 1.0  # every subquery exact too
    assert {"median", "p95"} <= search["ratio"].keys()
    assert {"governed", "governed_admit", "governed_write", "baseline_insert", "ratio"} <= result["save"].keys()
    assert {"governed", "baseline_delete", "ratio"} <= result["off"].keys()
    assert result["off"]["entries"] == 20
    assert result["storage"]["governed"]["bytes_per_entry"] > 0
    assert result["storage"]["baseline"]["bytes_per_entry"] > 0
    assert result["storage"]["governed_entry"]["columns"]["sealed"] > 3000  # text and embedding, one ciphertext
    assert result["admission"]["governed"]["runs"] == 10
    assert {"search", "prefetch", "save", "off", "baseline_search"} <= result["breakdown"].keys()
    floor = result["floor"]
    assert {"round_trip_ms", "empty_transaction_ms", "durable_autocommit_ms", "durable_commit_ms"} <= floor.keys()
    assert floor["round_trip_ms"] > 0
    assert floor["entries"] == 20  # the floor opens as many entries as a scope holds
    assert floor["sealing_ms"].keys() == {"open", "rank", "rank_prefetch", "seal"}
    assert floor["key_store_ms"].keys() == {"store", "fetch", "destroy", "destroyed"}
    assert all(ms > 0 for ms in [*floor["sealing_ms"].values(), *floor["key_store_ms"].values()])
    for name in ("search", "save", "off", "prefetch"):
        operation = result["operations"][name]
        assert operation["floor_ms"] == pytest.approx(
            operation["fewest_round_trips"] * floor["round_trip_ms"]
            + operation["server_ms"]
            + operation["durable_commits"] * floor["durable_commit_ms"]
            + operation["sealing_ms"]
            + operation["key_store_ms"]
        )
        assert operation["round_trips"] >= 1  # counted from the statements the store sent
        assert {"median", "p95"} <= operation["ratio_to_floor"].keys()
        assert {"median", "p95"} <= operation["ratio_to_baseline"].keys()
    operations = result["operations"]
    for name, prefetch in (("search", False), ("prefetch", True)):  # a search opens and ranks the scope's entries
        ranked = floor["sealing_ms"]["rank_prefetch" if prefetch else "rank"]
        assert operations[name]["sealing_ms"] == pytest.approx(floor["sealing_ms"]["open"] + ranked)
    # an erasure reads the key store's record, destroys the keys and verifies them gone; a save stores its key
    erasure = floor["key_store_ms"]["fetch"] + floor["key_store_ms"]["destroy"] + floor["key_store_ms"]["destroyed"]
    assert operations["off"]["key_store_ms"] == pytest.approx(erasure)
    assert operations["save"]["key_store_ms"] == pytest.approx(floor["key_store_ms"]["store"])
    assert len(result["load_average_at_start"]) == 3 and len(result["load_average"]["after"]) == 3
    assert all({"measured", "limit", "met"} <= check.keys() for check in result["targets"].values())
    assert storage.table(result)
    json.dumps(result)

    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        leftover = await conn.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'upstream_baseline%'")
    finally:
        await conn.close()
    assert leftover == 0


@pytest.mark.long
async def test_the_side_by_side_block_compares_the_plain_text_store_with_this_one(
    database_url: str, tmp_path: Path
) -> None:
    """Each arm loads and answers; recall stays exact on both sides. No assertion is about speed."""
    storage = benchmark("storage")

    side = await storage.side_by_side(
        database_url, storage.BEFORE, scopes=3, entries=8, runs=4, seed=7, work=tmp_path / "side"
    )

    if "skipped" in side:  # a shallow clone without the earlier revision
        return
    assert {"before", "after"} <= side["arms"].keys()
    for name, arm in side["arms"].items():
        assert arm["search"]["recall_at_5"] == 1.0 and arm["prefetch"]["recall_at_5"] == 1.0, name
        assert arm["save"]["runs"] == 4
    assert {"search", "save", "prefetch", "load"} == side["arms"]["after"]["ratio"].keys()
    lines = storage.side_lines(side)
    assert any("side by side" in line and "load average" in line for line in lines)
    # a cold search at most 2.0x the plain-text store's (the 1.5x line is retired), save and prefetch 1.5x
    for op, bound in (("search", 2.0), ("save", 1.5), ("prefetch", 1.5)):
        assert any(f"after (embedded keys) {op} median <= {bound}x before" in line for line in lines), op
    assert not any("search median <= 1.5x" in line for line in lines)


@pytest.mark.long
async def test_the_data_plane_benchmark_runs_every_operation_on_every_arm(database_url: str, tmp_path: Path) -> None:
    """Search, save and prefetch in-process, through a serve process and on one loop, each embedded by one provider
    process, then the breakdown against a timed serve process. No assertion is about speed."""
    data_plane = benchmark("data_plane")

    result = await data_plane.run(
        database_url,
        key_store=key_store_of(database_url),
        runs=3,
        breakdown_runs=3,
        warmup=2,
        entries=10,
        micro_runs=20,
        work=tmp_path / "dp",
    )
    assert result["entries"] == 10

    for op in ("search", "save", "prefetch"):
        row = result["side_by_side"]["operations"][op]
        assert {"in-process", "service", "same loop"} <= row.keys()
        assert all(row[arm]["runs"] == 3 for arm in ("in-process", "service", "same loop"))
        assert row["bound_ms"] == row["in-process"]["median_ms"] + 1.5
        terms = result["breakdown"][op]["terms_ms"]
        assert abs(sum(terms.values()) - result["breakdown"][op]["added_ms"]) < 1e-6  # the terms add up
    served = result["breakdown"]["service"].keys()  # timed inside the second serve process
    assert {"handler recall", "handler remember", "embed x1", "embed x8", "scope token", "workload identity"} <= served
    assert result["breakdown"]["floor_ms"] and result["breakdown"]["costs_us"]
    assert any("added =" in line for line in data_plane.table(result))
    json.dumps(result)


@pytest.mark.long
async def test_the_turns_benchmark_does_memory_work_in_both_arms(database_url: str, tmp_path: Path) -> None:
    """Two users, one round of five-turn sessions, in-process and through a serve process: every enabled turn is
    recorded, every session prefetches and auto-saves, nothing is refused. No assertion is about speed."""
    turns = benchmark("turns")

    result = await turns.run(
        database_url, key_store=key_store_of(database_url), users=2, turns=5, rounds=1, work=tmp_path / "turns"
    )

    for name in ("in-process", "service"):
        arm = result["arms"][name]
        assert arm["free"]["runs"] == arm["enabled"]["runs"] == 10
        assert arm["counts"]["turn recorded"] == 10
        assert arm["counts"]["prefetch"] == 2 and arm["counts"]["prefetch hits"] > 0
        assert arm["counts"]["autosave"] == 2 and arm["counts"]["summaries"] == 2
        assert not [key for key in arm["counts"] if "refused" in key], arm["counts"]
    assert turns.table(result)
    json.dumps(result)
