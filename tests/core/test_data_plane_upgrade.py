"""Across the text data plane (#47, R46), with the previous release's real package (``previous.py``): its agent
runtime, which embeds and makes two calls an operation, keeps working against this service, which still serves
``Admit``, ``Search`` and ``Write``; this release's runtime meeting the previous release's ``serve`` runs memory-free
with a reason code (``bad_input``: a request that service does not know), nothing admitted and nothing written."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import asyncpg
import pytest
from cluster import Cluster, Key
from previous import drive, python_of
from service import HELPER, environment, projected, running, start, stop
from support import refusal

from kagent_memory_governed.errors import Operation, Reason
from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey
from kagent_memory_governed.service.plane import RequestScope
from kagent_memory_governed.service.remote import RemoteStore
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import Bridge, embed
from kagent_memory_governed.testing.bridge import HOMESERVER

PREVIOUS = "a1e7cc5"  # the last release whose runtime embeds: serve, Exchange, Admit before Search and Write
HOURLY = "SELECT coalesce(sum(units), 0) FROM governed_memory.usage WHERE kind = 'hourly'"


async def granted(store: Store, bridge: Bridge) -> tuple[ScopeKey, int, str]:
    room = f"!upgrade{uuid.uuid4().hex[:12]}:{HOMESERVER}"
    key = ScopeKey(Principal.parse(f"@alice:{HOMESERVER}", "native"), AgentId.parse(HELPER), ControlRoom.parse(room))
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    token = bridge.sign(time.time(), sub=key.principal.mxid, aud=HELPER, room=room, gen=generation)
    return key, generation, token


@pytest.mark.long
async def test_the_previous_releases_runtime_keeps_working_against_this_service(
    store: Store,
    bridge: Bridge,
    database_url: str,
    kube: tuple[Cluster, Key],
    tmp_path: Path,
    sql: asyncpg.Connection,
) -> None:
    key, generation, token = await granted(store, bridge)
    fact = "the user takes the night train to Vienna"
    with running(tmp_path, bridge, database_url, kube[0]) as service:
        request = {
            "url": service.data,
            "token_file": str(projected(tmp_path, kube[1], HELPER)),
            "scope": {"mxid": key.principal.mxid, "room": key.room.room_id},
            "generation": generation,
            "token": token,
            "fact": fact,
            "vector": embed(fact),
        }
        answers = await asyncio.to_thread(drive, PREVIOUS, "runtime", request, {})
    assert answers["admit save"] == ["ok", None] and answers["admit load"] == ["ok", None], answers
    assert answers["write"][0] == "ok" and len(answers["write"][1]) == 1, answers
    assert answers["search"][0] == "ok" and answers["search"][1][0][0]["text"] == fact, answers
    assert (await store.status(key)).entries == 1
    assert await sql.fetchval(HOURLY) == 2  # each Admit recorded once, and taken by the call it admitted


@pytest.mark.long
async def test_this_runtime_meeting_the_previous_service_is_refused_bad_input_and_nothing_is_spent(
    store: Store,
    bridge: Bridge,
    database_url: str,
    kube: tuple[Cluster, Key],
    tmp_path: Path,
    sql: asyncpg.Connection,
) -> None:
    key, generation, token = await granted(store, bridge)
    command = python_of(PREVIOUS).parent / "kagent-memory-governed"
    env = environment(tmp_path, bridge, database_url, kube[0])
    del env["KAGENT_GOVERNED_MEMORY_EMBEDDINGS"]  # a setting it does not know: it would refuse to start
    service = await asyncio.to_thread(start, env, tmp_path / "previous-serve.log", str(command))
    try:
        client = RemoteStore.connect(service.data, token_file=projected(tmp_path, kube[1], HELPER))
        scope = RequestScope(key, generation, token=token)
        try:
            assert await refusal(client.remember(scope, ["likes tea"], Operation.SAVE)) is Reason.BAD_INPUT
            assert await refusal(client.recall(scope, ["tea"], Operation.PREFETCH)) is Reason.BAD_INPUT
            assert await client.record(scope, "session-1", "invocation-1", recalled=False) == 1  # unchanged calls
        finally:
            await client.close()
    finally:
        await asyncio.to_thread(stop, service)
    assert (await store.status(key)).entries == 0 and await sql.fetchval(HOURLY) == 0
