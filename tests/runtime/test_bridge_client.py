"""The bridge client against the real app: every operation answers typed values or the server's reason
code, the generation follows consent and erasures, tokens follow a frozen clock, and nothing it logs
holds a token or a fact."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from freezegun import freeze_time

from kagent_memory_governed.assertion import Trust, verify
from kagent_memory_governed.bridge import AsyncControlClient, Memories, ScopeSigner, Subject
from kagent_memory_governed.clock import now
from kagent_memory_governed.contract import ControlOperation as Operation
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.scope import AgentId
from kagent_memory_governed.testing import AGENT, HOMESERVER, ISSUER, Bridge, ScriptedModel, build_app, reply_text
from kagent_memory_governed.testing.agent import A2AClient

if TYPE_CHECKING:
    from kagent_memory_governed import Runtime
    from kagent_memory_governed.store import Store

FACT = "my bike is a green SENTINEL-fact-bicycle"


def subject() -> Subject:
    return Subject(f"@client{uuid.uuid4().hex[:6]}:{HOMESERVER}", f"!client{uuid.uuid4().hex[:8]}:{HOMESERVER}")


@pytest.fixture
async def memory(runtime: Runtime, governed_signer: ScopeSigner) -> AsyncIterator[AsyncControlClient]:
    model = ScriptedModel().script(on_user=lambda text: [("save_memory", {"content": FACT})])
    app = build_app(model)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
        yield AsyncControlClient(http, governed_signer, subject())
    await runtime.service.drain()


async def remember(memory: AsyncControlClient) -> str:
    return reply_text(await A2AClient(memory.http).send_as(memory.headers(), "remember my bike"))


async def test_every_operation_answers_typed_values_and_the_generation_follows(memory: AsyncControlClient) -> None:
    before = await memory.status()
    assert (before.enabled, before.generation, before.entries, before.last_erasure) == (False, 0, 0, None)
    consent = await memory.consent("assist", "v1")
    assert consent.enabled and memory.generation == consent.generation == 1
    assert "Saved to long-term memory" in await remember(memory)
    page = await memory.entries(limit=10)
    assert isinstance(page, Memories) and [entry.text for entry in page.entries] == [FACT]
    forgot = await memory.forget(page.entries[0].id)
    assert forgot.verified and memory.generation == forgot.generation == 2
    assert "Saved to long-term memory" in await remember(memory)  # the next header carries generation 2
    assert (await memory.forget_all()).erased == 1 and memory.generation == 3
    off = await memory.off()
    assert off.verified and memory.generation == off.generation == 4
    status = await memory.status()
    assert not status.enabled and status.last_erasure is not None and status.last_erasure.result == "verified"
    offboarded = await memory.offboard()
    assert offboarded.verified and offboarded.scopes == 1


def test_a_forget_token_from_the_signer_names_its_entry(governed_signer: ScopeSigner, bridge: Bridge) -> None:
    entry = uuid.uuid4()
    who = subject()
    token = governed_signer.control(who, "forget", entry=entry)
    assertion = verify(token, bridge.trust(), now=now(), purpose="control", op=Operation.FORGET)
    assert assertion.entry == entry
    assert (
        verify(
            governed_signer.control(who, "forget"), bridge.trust(), now=now(), purpose="control", op=Operation.FORGET
        ).entry
        is None
    )


async def test_refusals_raise_the_servers_reason_code(memory: AsyncControlClient) -> None:
    with pytest.raises(GovernedMemoryError) as refused:
        await memory.forget(uuid.uuid4())
    assert refused.value.reason is Reason.NOT_FOUND
    with pytest.raises(GovernedMemoryError) as refused:
        await memory.consent("has spaces", "v1")
    assert refused.value.reason is Reason.BAD_INPUT
    with pytest.raises(GovernedMemoryError) as refused:
        await memory.entries(limit=51)
    assert refused.value.reason is Reason.BAD_INPUT
    stranger = AsyncControlClient(memory.http, ScopeSigner(Ed25519PrivateKey.generate(), ISSUER, AGENT), subject())
    with pytest.raises(GovernedMemoryError) as refused:
        await stranger.status()
    assert refused.value.reason is Reason.BAD_ASSERTION


async def test_tokens_follow_the_frozen_clock(memory: AsyncControlClient, governed_signer: ScopeSigner) -> None:
    later = now() + timedelta(days=30)
    with freeze_time(later, real_asyncio=True) as frozen:
        assert (await memory.status()).generation == 0  # minted and verified at the frozen time
        header = governed_signer.scope(memory.subject, 1)
        key = Trust.load_public_key(governed_signer.public_pem)
        trust = Trust(key, ISSUER, AgentId.parse(AGENT), HOMESERVER)
        assert verify(header, trust, now=now(), user_id=memory.subject.mxid).generation == 1
        frozen.tick(timedelta(seconds=governed_signer.lifetime + 31))
        with pytest.raises(GovernedMemoryError) as refused:
            verify(header, trust, now=now(), user_id=memory.subject.mxid)
        assert refused.value.reason is Reason.BAD_ASSERTION


def test_a_signer_refuses_lifetimes_past_the_contract() -> None:
    with pytest.raises(ValueError):
        ScopeSigner(Ed25519PrivateKey.generate(), ISSUER, AGENT, lifetime_seconds=301)


async def test_nothing_the_client_logs_holds_a_token_or_a_fact(
    memory: AsyncControlClient, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens: list[str] = []
    mint = ScopeSigner._sign

    def recording(self: ScopeSigner, audience: str, claims: dict[str, Any]) -> str:
        tokens.append(mint(self, audience, claims))
        return tokens[-1]

    monkeypatch.setattr(ScopeSigner, "_sign", recording)
    caplog.set_level(logging.DEBUG)
    await memory.consent("assist", "v1")
    await remember(memory)
    [entry] = (await memory.entries()).entries
    await memory.forget(entry.id)
    with pytest.raises(GovernedMemoryError):
        await memory.forget(entry.id)
    assert len(tokens) >= 5
    logged = "\n".join(f"{record.getMessage()} {record.args}" for record in caplog.records)
    assert FACT not in logged and "SENTINEL" not in logged
    assert not any(token in logged or token.split(".")[1] in logged for token in tokens)


@pytest.mark.long
def test_the_synchronous_client_speaks_to_a_served_agent(
    tmp_path: Path, bridge: Bridge, database_url: str, store: Store
) -> None:
    from support import pod_environment, serve, wait_for_health

    from kagent_memory_governed.bridge import ControlClient

    env = pod_environment(tmp_path, bridge, database_url)
    env.pop("KAGENT_GOVERNED_MEMORY")
    server, url = serve(tmp_path, env)
    try:
        assert wait_for_health(server, url) is not None
        with httpx.Client(base_url=url, timeout=10) as http:
            memory = ControlClient(http, ScopeSigner(bridge.private_key, ISSUER, AGENT), subject())
            assert memory.consent("assist", "v1").generation == memory.generation == 1
            assert memory.entries().entries == []
            assert memory.off().generation == memory.generation == 2
            with pytest.raises(GovernedMemoryError) as refused:
                memory.forget(uuid.uuid4())
            assert refused.value.reason is Reason.NOT_FOUND
    finally:
        server.terminate()
        server.wait(timeout=30)
