"""The text data plane (R46): through the service, each operation is one call (``Recall``, ``Remember``) in which the
service admits, embeds with the calling agent's model (an OpenAI-compatible server on loopback) and then searches or
writes; a refusal before any work spends nothing, and a failing provider writes nothing and says nothing of the text."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from support import refusal
from test_data_plane import HOURLY, bearer_file, plane, scope_key, serving, token_for

from kagent_memory_governed.embedding import Embedders, EmbeddingModel
from kagent_memory_governed.errors import Cause, GovernedMemoryError, Operation, Reason
from kagent_memory_governed.service import server
from kagent_memory_governed.service.plane import RequestScope
from kagent_memory_governed.service.remote import RemoteStore
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import Bridge, embed, openai_compatible_url
from kagent_memory_governed.testing.embedder import embedding_server

SENTINEL = "ibex-sentinel-9c0e the user's safe combination is 4412"


def embedders(url: str | None = None, agent: str = "*") -> Embedders:
    return Embedders({agent: EmbeddingModel(url=url or openai_compatible_url(), model="local-hash-768")})


@pytest.fixture
async def client(store: Store, bridge: Bridge, tmp_path: Path) -> AsyncIterator[RemoteStore]:
    async with serving(plane(store, bridge, embedders=embedders())) as port:
        remote_store = RemoteStore.connect(f"http://127.0.0.1:{port}", token_file=bearer_file(tmp_path))
        yield remote_store
        await remote_store.close()


async def granted(store: Store, bridge: Bridge) -> RequestScope:
    key = scope_key()
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    return RequestScope(key, generation, token=token_for(bridge, key, generation))


async def test_each_operation_is_one_call_and_the_service_embeds(
    store: Store, bridge: Bridge, client: RemoteStore, sql: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    answer = server.DataPlane._do

    async def counted(self: server.DataPlane, method: str, *args: Any) -> Any:
        calls.append(method)
        return await answer(self, method, *args)

    monkeypatch.setattr(server.DataPlane, "_do", counted)
    scope = await granted(store, bridge)
    ids = await client.remember(scope, ["likes green tea", "lives in Lisbon"], Operation.SAVE)
    assert await client.remember(scope, ["likes  green tea"], Operation.AUTOSAVE) == ids[:1]  # a live fact: its id
    found = await client.recall(scope, ["green tea", "Lisbon", "cello"], Operation.PREFETCH)
    assert calls == ["remember", "remember", "recall"]  # one round trip an operation, no Admit before it
    assert [hit.entry_id for hit in found[0]][:1] == ids[:1] and [hit.entry_id for hit in found[1]] == ids[1:]
    assert found[2] == []  # nothing scores 0.3 against it
    direct = await store.search(scope.key, scope.generation, embed("Lisbon"), top_k=5, min_score=0.3)
    assert [(h.entry_id, round(h.score, 5)) for h in direct] == [(h.entry_id, round(h.score, 5)) for h in found[1]]
    assert await sql.fetchval(HOURLY) == 2 + 1 + 3  # one unit a fact and a query, admitted in the same call
    assert (await store.status(scope.key)).entries == 2


async def test_a_load_and_a_save_are_rate_limited_per_sender_where_they_are_done(
    store: Store, bridge: Bridge, client: RemoteStore
) -> None:
    scope = await granted(store, bridge)
    for _ in range(3):  # the burst
        await client.recall(scope, ["tea"], Operation.LOAD)
    assert await refusal(client.remember(scope, ["likes tea"], Operation.SAVE)) is Reason.RATE_LIMITED
    await client.remember(scope, ["likes tea"], Operation.AUTOSAVE)  # not the model's: no sender bucket


async def test_what_cannot_be_done_is_refused_before_anything_is_admitted_or_embedded(
    store: Store, bridge: Bridge, client: RemoteStore, sql: asyncpg.Connection, tmp_path: Path
) -> None:
    asked: list[list[str]] = []
    provider = embedding_server()

    def counted(texts: list[str]) -> list[list[float]]:
        asked.append(texts)
        return [embed(text) for text in texts]

    provider.batch = counted
    try:
        await refused_before_any_work(store, bridge, client, sql, tmp_path)
    finally:
        provider.batch = None
    assert asked == []  # the provider was never asked
    scope = await granted(store, bridge)
    assert len(await client.recall(scope, ["q" * 512] * 8, Operation.PREFETCH)) == 8  # the bounds themselves pass
    assert await sql.fetchval(HOURLY) == 8


async def refused_before_any_work(
    store: Store, bridge: Bridge, client: RemoteStore, sql: asyncpg.Connection, tmp_path: Path
) -> None:
    scope = await granted(store, bridge)
    for work, reason in [
        (client.recall(scope, ["q"] * 9, Operation.PREFETCH), Reason.BAD_INPUT),  # more than 8 subqueries
        (client.recall(scope, ["x" * 513], Operation.LOAD), Reason.BAD_INPUT),  # past the query's bytes
        (client.recall(scope, [" "], Operation.LOAD), Reason.BAD_INPUT),
        (client.recall(scope, [], Operation.LOAD), Reason.BAD_INPUT),
        (client.recall(scope, ["q"], Operation.SAVE), Reason.BAD_INPUT),  # not a search
        (client.remember(scope, ["x" * 600], Operation.SAVE), Reason.FACT_TOO_LARGE),
        (client.remember(scope, [], Operation.SAVE), Reason.BAD_INPUT),
        (client.remember(scope, ["fact"], Operation.PREFETCH), Reason.BAD_INPUT),  # not a write
        (client.remember(scope, ["fact"], Operation.SAVE, expires_in=0), Reason.BAD_INPUT),  # no lifetime
        (client.recall(scope, ["\ud800"], Operation.LOAD), Reason.BAD_INPUT),  # not encodable: refused by the client
    ]:
        assert await refusal(work) is reason
    assert await sql.fetchval(HOURLY) == 0
    async with serving(plane(store, bridge, embedders=embedders(agent="kagent/other"))) as port:  # none for helper
        unconfigured = RemoteStore.connect(f"http://127.0.0.1:{port}", token_file=bearer_file(tmp_path))
        with pytest.raises(GovernedMemoryError) as refused:
            await unconfigured.recall(scope, ["tea"], Operation.LOAD)
        await unconfigured.close()
    assert refused.value.reason is Reason.EMBEDDING_FAILED and await sql.fetchval(HOURLY) == 0


async def test_a_failing_provider_writes_nothing_and_no_text_leaves_the_service(
    store: Store, bridge: Bridge, tmp_path: Path, sql: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    async def echoing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        request = await reader.readexactly(length)  # echoed back, as some providers' errors do
        assert SENTINEL.encode() in request
        body = json.dumps({"error": request.decode("utf-8", "replace")}).encode()
        writer.write(b"HTTP/1.1 500 X\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    provider = await asyncio.start_server(echoing, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{provider.sockets[0].getsockname()[1]}/v1"
    scope = await granted(store, bridge)
    async with serving(plane(store, bridge, embedders=embedders(url))) as port:
        client = RemoteStore.connect(f"http://127.0.0.1:{port}", token_file=bearer_file(tmp_path))
        errors = []
        for work in (
            client.remember(scope, [SENTINEL], Operation.SAVE),
            client.recall(scope, [SENTINEL], Operation.LOAD),
        ):
            with pytest.raises(GovernedMemoryError) as refused:
                await work
            errors.append(refused.value)
        await client.close()
    provider.close()
    assert [error.reason for error in errors] == [Reason.EMBEDDING_FAILED] * 2
    assert (await store.status(scope.key)).entries == 0
    assert await sql.fetchval(HOURLY) == 2  # admitted before the provider was asked, as in process
    assert "embedding_failed (status_500)" in caplog.text  # the service's own line: the reason and the cause
    shown = caplog.text + "".join(f"{e} {e!r} {e.explained()}" for e in errors)
    assert "ibex" not in shown and "4412" not in shown
    assert Cause.STATUS_500.value not in "".join(str(e) for e in errors)  # the cause stays the service's
