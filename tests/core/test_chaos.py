"""A CI-sized run of benchmarks/chaos.py: the server killed and terminated mid-statement under concurrent load
and restarted on the same data directory; every invariant holds after every strike, only reason codes leave
the store, interrupted erasures are completed, and no log record of any logger carries a sentinel fact."""

from __future__ import annotations

import pytest
from support import benchmark, private_directory


@pytest.mark.long
async def test_a_short_chaos_run_keeps_every_invariant() -> None:
    result = await benchmark("chaos").run(private_directory("chaos") / "pg", seconds=35, workers=10, scopes=8, seed=20)
    assert result["violations"] == 0, (result["violation_kinds"], result["escape_kinds"], result["sentinel_in_logs"])
    events = result["events"]
    assert {"postmaster", "backend", "terminate"} <= events.keys()  # and targeted strikes, mid-erasure:
    assert events.get("targeted postmaster: between fence and delete", 0) + events.get(
        "targeted terminate: between fence and delete", 0
    )
    checks = result["checks"]
    assert checks["checks"] == result["kill_events"] + 1  # after every strike, and at the end
    assert checks["interrupted erasures found"] > 0
    assert checks["interrupted erasures completed"] == checks["interrupted erasures found"]
    outcomes = result["outcomes"]
    assert outcomes["write ok"] and outcomes["search ok"] and outcomes["forget_all ok"] and outcomes["sentinel writes"]
    assert outcomes.get("write store_unavailable", 0) + outcomes.get("search store_unavailable", 0)  # struck mid-work
    assert result["log_records"] > 1000 and result["sentinel_in_logs"] == {}
