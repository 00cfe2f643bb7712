"""A downstream agent's suite on governed memory: consent, a saved fact, a frozen-clock expiry, erase."""

import pytest
from freezegun import freeze_time

MY_AGENT = {  # your Agent's kagent config; the scripted model stands in for its provider
    "model": {"type": "openai", "model": "gpt-4o-mini"},
    "description": "travel helper",
    "instruction": "You plan trips.",
    "memory": {"ttl_days": 7},
}


@pytest.fixture
def governed_agent_config():
    return MY_AGENT


async def test_my_agent_remembers_only_with_consent_until_expiry_or_erasure(governed_agent):
    governed_agent.model.script(on_user=lambda text: [("save_memory", {"content": "prefers window seats"})])
    assert "consent_missing" in await governed_agent.send("Remember: window seats")
    await governed_agent.memory.consent("travel-planning", "2026-11")
    assert "Saved to long-term memory" in await governed_agent.send("Remember: window seats")
    [entry] = (await governed_agent.memory.entries()).entries
    with freeze_time(entry.expires_at, real_asyncio=True):  # expiry is authorization: gone at that instant
        assert (await governed_agent.memory.entries()).entries == []
    await governed_agent.memory.forget(entry.id)
    assert (await governed_agent.memory.status()).entries == 0
