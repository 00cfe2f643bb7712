"""A CI-sized run of benchmarks/race.py: zero violations, and both sides of every race exercised."""

from __future__ import annotations

import pytest
from support import benchmark

from kagent_memory_governed.store import Store

race = benchmark("race")


@pytest.mark.long
async def test_a_small_race_run_keeps_every_invariant(database_url: str, store: Store) -> None:
    result = await race.run(database_url, trials=60, seed=11, keys=store.key_store)
    assert result["violations"] == 0, result["violation_kinds"]
    outcomes = result["outcomes"]
    assert outcomes["writes"] > 0 and outcomes["reads"] > 0
    assert outcomes.get("consent_disabled", 0) + outcomes.get("consent_stale", 0) > 0  # fenced work was refused
    assert sum(outcomes.get(kind, 0) for kind in ("off", "forget_all", "offboard")) == 60
    # summarizing auto-saves ran on both sides of a single-entry forget (R36)
    assert outcomes["forget"] > 0 and outcomes["summarized_writes"] > 0
    assert outcomes.get("autosave_consent_stale", 0) + outcomes.get("autosave_consent_disabled", 0) > 0
