"""The package's pytest plugin as a downstream suite uses it: a real agent per test, a fresh subject,
tables emptied after each test, and every limit following a frozen clock."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from freezegun import freeze_time

from kagent_memory_governed.clock import now
from kagent_memory_governed.testing.plugin import GovernedAgent


def saving(text: str) -> list[tuple[str, dict[str, Any]]]:
    return [("save_memory", {"content": text})]


async def test_rate_limits_and_token_lifetimes_follow_the_frozen_clock(governed_agent: GovernedAgent) -> None:
    governed_agent.model.script(on_user=saving)
    with freeze_time(now() + timedelta(days=3), real_asyncio=True) as frozen:
        await governed_agent.memory.consent("assist", "v1")
        replies = [await governed_agent.send(f"fact {n}") for n in range(4)]
        assert ["Saved to long-term memory" in reply for reply in replies] == [True, True, True, False]
        assert "rate_limited" in replies[3]  # a burst of three explicit saves
        frozen.tick(timedelta(seconds=61))  # the frozen minute passes; tokens are minted at the new time
        assert "Saved to long-term memory" in await governed_agent.send("fact 4")
    assert (await governed_agent.memory.status()).entries == 4


async def test_each_test_starts_from_empty_tables_and_a_memory_free_send_is_refused(
    governed_agent: GovernedAgent,
) -> None:
    governed_agent.model.script(on_user=saving)
    status = await governed_agent.memory.status()
    assert (status.enabled, status.entries, status.last_erasure) == (False, 0, None)
    assert "Memory unavailable: consent_missing" in await governed_agent.send("hello")
    assert "Memory unavailable: no_assertion" in await governed_agent.send("hello", scope=False)
