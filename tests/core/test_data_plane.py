"""The data plane (#35, ADR 0001) as a runtime meets it: a real ``grpc.aio`` server on loopback over the suite's real
PostgreSQL store, reached through ``RemoteStore`` (and, for what a client would never send, the generated stub).
The service verifies the caller's identity and the bridge's scope token on every call and acts on that scope only."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest
from freezegun import freeze_time
from support import facts, free_port, refusal

from kagent_memory_governed import clock
from kagent_memory_governed.embedding import Embedders
from kagent_memory_governed.errors import ConfigurationError, GovernedMemoryError, Reason
from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey
from kagent_memory_governed.service import data_plane_pb2 as pb
from kagent_memory_governed.service import data_plane_pb2_grpc as pb_grpc
from kagent_memory_governed.service import remote, server, wire
from kagent_memory_governed.service.plane import RequestScope
from kagent_memory_governed.service.remote import RemoteStore
from kagent_memory_governed.service.wire import status
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import HOMESERVER, ISSUER, Bridge, embed

HELPER, OTHER = AgentId.parse("kagent/helper"), AgentId.parse("kagent/other")
SENTINEL = "zebra-sentinel-7f3a the user keeps a spare key under the blue flowerpot"


class TableIdentity:
    """A TEST DOUBLE of the workload identity: a static table of bearer strings to agents, no cluster."""

    def __init__(self, table: Mapping[str, AgentId]) -> None:
        self._table = dict(table)

    async def agent(self, metadata: Mapping[str, str]) -> AgentId:
        scheme, _, bearer = metadata.get("authorization", "").partition(" ")
        if scheme != "Bearer" or bearer not in self._table:
            raise GovernedMemoryError(Reason.BAD_IDENTITY)
        return self._table[bearer]


IDENTITY = TableIdentity({"token-of-helper": HELPER, "token-of-other": OTHER})


def scope_key(agent: AgentId = HELPER, room: str = f"!control:{HOMESERVER}") -> ScopeKey:
    return ScopeKey(Principal.parse(f"@alice:{HOMESERVER}", "native"), agent, ControlRoom.parse(room))


def token_for(bridge: Bridge, key: ScopeKey, generation: int, **changes: object) -> str:
    claims: dict[str, Any] = {
        "sub": key.principal.mxid,
        "aud": str(key.agent),
        "room": key.room.room_id,
        "gen": generation,
        **changes,
    }
    return bridge.sign(clock.now().timestamp(), **claims)


@contextmanager
def presenting(token: str | None) -> Iterator[None]:
    carried = remote.carry(token)
    try:
        yield
    finally:
        remote._scope_token.reset(carried)


@asynccontextmanager
async def serving(plane: object, *, tls: server.ServerTLS | None = None) -> AsyncIterator[int]:
    grpc_server, port = server.build(plane, "127.0.0.1:0", tls=tls)  # type: ignore[arg-type]
    await grpc_server.start()
    try:
        yield port
    finally:
        await grpc_server.stop(None)


def plane(store: Store, bridge: Bridge, *, embedders: Embedders | None = None, **options: float) -> server.DataPlane:
    public_key = bridge.private_key.public_key()
    return server.DataPlane(
        store,
        IDENTITY,
        public_key=public_key,
        issuer=ISSUER,
        homeserver=HOMESERVER,
        embedders=embedders,
        handler_seconds=options.get("handler_seconds", wire.DEFAULT_HANDLER_SECONDS),
    )


@pytest.fixture
async def port(store: Store, bridge: Bridge) -> AsyncIterator[int]:
    async with serving(plane(store, bridge)) as port:
        yield port


def bearer_file(tmp_path: Path, bearer: str = "token-of-helper") -> Path:
    path = tmp_path / f"token-{uuid.uuid4().hex}"
    path.write_text(bearer + "\n")
    return path


@pytest.fixture
async def client(port: int, tmp_path: Path) -> AsyncIterator[RemoteStore]:
    remote_store = RemoteStore.connect(f"http://127.0.0.1:{port}", token_file=bearer_file(tmp_path))
    yield remote_store
    await remote_store.close()


async def raw(port: int, method: str, request: object, metadata: list[tuple[str, str]]) -> tuple[object, str]:
    """What the service answers a call that no ``RemoteStore`` would make: (status code, details)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            await getattr(pb_grpc.DataPlaneStub(channel), method)(request, metadata=metadata, timeout=5)
        except grpc.aio.AioRpcError as error:
            return error.code(), error.details()
    return grpc.StatusCode.OK, ""


async def test_each_call_round_trips_through_the_service(store: Store, bridge: Bridge, client: RemoteStore) -> None:
    key = scope_key()
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    assert await client.refresh_policy() == store.policy
    with presenting(token_for(bridge, key, generation)):
        await client.admit(key, generation, "save", units=2, explicit=True)
        ids = await client.write(key, generation, facts("likes green tea", "lives in Lisbon"))
        assert len(ids) == 2 and all(isinstance(entry, uuid.UUID) for entry in ids)
        assert await client.write(key, generation, facts("likes  green tea")) == ids[:1]  # a live fact, its own id
        await client.admit(key, generation, "prefetch", units=1)  # each search or write is admitted
        [hits] = await client.search_many(key, generation, [embed("likes green tea")])
        assert hits[0].entry_id == ids[0] and hits[0].text == "likes green tea" and hits[0].score > 0.9
        assert hits[0].created_at.tzinfo is not None and hits[0].expires_at > hits[0].created_at
        direct = await store.search(key, generation, embed("lives in Lisbon"), top_k=5, min_score=0.3)
        assert await client.search(key, generation, embed("lives in Lisbon")) == [
            type(hits[0])(h.entry_id, h.text, h.score, h.created_at, h.expires_at) for h in direct
        ]
        assert await client.record_turn(key, generation, "session-1", "invocation-1", recalled=True) == 1
        [turn] = await client.collect_turns(key, generation, "session-1", ["invocation-1", "invocation-2"])
        assert (turn.invocation_id, turn.recalled) == ("invocation-1", True)
        assert await client.collect_turns(key, generation, "session-1", ["invocation-1"]) == []  # once
    assert (await store.status(key)).entries == 2


async def test_the_service_answers_the_stores_refusals_as_reason_codes(
    store: Store, bridge: Bridge, client: RemoteStore
) -> None:
    key = scope_key()
    with presenting(token_for(bridge, key, 1)):
        assert await refusal(client.admit(key, 1, "save", units=1)) is Reason.CONSENT_MISSING
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    with presenting(token_for(bridge, key, generation)):
        await client.admit(key, generation, "save", units=1)
        assert await refusal(client.write(key, generation, facts("x" * 600))) is Reason.FACT_TOO_LARGE
        assert await refusal(client.admit(key, generation, "grant", units=1)) is Reason.BAD_INPUT  # not the runtime's
        assert await refusal(client.record_turn(key, generation, "", "i", recalled=False)) is Reason.BAD_INPUT


async def test_a_token_for_another_agent_is_refused_even_when_correctly_signed(
    store: Store, bridge: Bridge, port: int, tmp_path: Path
) -> None:
    key = scope_key(HELPER)
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    await store.write(key, generation, facts("likes green tea"))
    other = RemoteStore.connect(f"http://127.0.0.1:{port}", token_file=bearer_file(tmp_path, "token-of-other"))
    with presenting(token_for(bridge, key, generation)):  # helper's token, presented by other's pod
        assert await refusal(other.search(key, generation, embed("likes green tea"))) is Reason.BAD_ASSERTION
        assert await refusal(other.write(key, generation, facts("planted"))) is Reason.BAD_ASSERTION
    await other.close()
    assert (await store.status(key)).entries == 1


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"iss": "another-bridge.example"}, Reason.BAD_ASSERTION),
        ({"aud": "kagent/helper#control", "op": "status"}, Reason.BAD_ASSERTION),  # a control token replayed here
        ({"gen": 2}, Reason.CONSENT_STALE),
        ({"room": f"!elsewhere:{HOMESERVER}"}, Reason.CONSENT_MISSING),  # another scope's token: never this one's
        ({"sub": "@alice:other.example"}, Reason.PRINCIPAL_NOT_ADMITTED),
        ({"origin": "appservice"}, Reason.PRINCIPAL_NOT_ADMITTED),
    ],
)
async def test_a_refused_token_answers_its_reason_code(
    store: Store, bridge: Bridge, port: int, changes: dict[str, object], reason: Reason
) -> None:
    key = scope_key()
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    token = token_for(bridge, key, generation, **changes)
    metadata = [("authorization", "Bearer token-of-helper"), ("x-memory-scope", token)]
    planted = [pb.Fact(text="planted", embedding=pb.Vector(values=embed("planted")))]
    request = pb.WriteRequest(facts=planted, operation="save")
    assert await raw(port, "Write", request, metadata) == (status(reason), reason.value)
    assert (await store.status(key)).entries == 0


async def test_a_token_past_its_lifetime_and_leeway_is_refused(
    store: Store, bridge: Bridge, client: RemoteStore
) -> None:
    start = datetime.now(UTC).replace(microsecond=0)
    with freeze_time(start, real_asyncio=True) as frozen:
        key = scope_key()
        generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
        with presenting(token_for(bridge, key, generation)):  # exp = start + 120
            frozen.move_to(start + timedelta(seconds=149))
            await client.admit(key, generation, "load", units=1, explicit=True)  # within exp + 30 s
            frozen.move_to(start + timedelta(seconds=150))
            assert await refusal(client.admit(key, generation, "load", units=1)) is Reason.BAD_ASSERTION


def test_a_token_verified_once_is_still_held_to_its_window(store: Store, bridge: Bridge) -> None:
    """The service keeps a verified scope token by its digest: on the same clock, the same answers as verifying it
    again, at both ends of its window."""
    start = datetime.now(UTC).replace(microsecond=0)
    data_plane = plane(store, bridge)
    with freeze_time(start) as frozen:
        key = scope_key()
        metadata = {"x-memory-scope": token_for(bridge, key, 1)}  # iat = start, exp = start + 120
        assert data_plane._verified(metadata, HELPER) == RequestScope(key, 1)  # verified, and kept
        for moment, admitted in ((-31, False), (-30, True), (149, True), (150, False), (0, True)):
            frozen.move_to(start + timedelta(seconds=moment))
            if admitted:
                assert data_plane._verified(metadata, HELPER) == RequestScope(key, 1), moment
            else:
                with pytest.raises(GovernedMemoryError) as refused:
                    data_plane._verified(metadata, HELPER)
                assert refused.value.reason is Reason.BAD_ASSERTION, moment


async def test_a_token_verified_for_one_agent_is_refused_to_another(store: Store, bridge: Bridge, port: int) -> None:
    key = scope_key()
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    token = token_for(bridge, key, generation)
    request = pb.AdmitRequest(operation="load", units=1)
    helper = [("authorization", "Bearer token-of-helper"), ("x-memory-scope", token)]
    other = [("authorization", "Bearer token-of-other"), ("x-memory-scope", token)]
    assert await raw(port, "Admit", request, helper) == (grpc.StatusCode.OK, "")
    assert await raw(port, "Admit", request, other) == (status(Reason.BAD_ASSERTION), "bad_assertion")


@pytest.mark.parametrize(
    ("metadata", "reason"),
    [
        ([], Reason.BAD_IDENTITY),
        ([("x-memory-scope", "SCOPE")], Reason.BAD_IDENTITY),  # a scope token, no bearer
        ([("authorization", "Bearer not-a-known-token"), ("x-memory-scope", "SCOPE")], Reason.BAD_IDENTITY),
        ([("authorization", "Basic token-of-helper"), ("x-memory-scope", "SCOPE")], Reason.BAD_IDENTITY),
        ([("authorization", "Bearer token-of-helper")], Reason.NO_ASSERTION),
        ([("authorization", "Bearer token-of-helper"), ("x-memory-scope", "not.a.jws")], Reason.BAD_ASSERTION),
        (
            [("authorization", "Bearer token-of-helper"), ("x-memory-scope", "SCOPE"), ("x-memory-scope", "SCOPE")],
            Reason.BAD_ASSERTION,
        ),
    ],
)
async def test_a_call_without_a_known_identity_or_one_scope_token_is_refused(
    store: Store, bridge: Bridge, port: int, metadata: list[tuple[str, str]], reason: Reason
) -> None:
    key = scope_key()
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    token = token_for(bridge, key, generation)
    sent = [(name, token if value == "SCOPE" else value) for name, value in metadata]
    assert await raw(port, "Admit", pb.AdmitRequest(operation="load", units=1), sent) == (status(reason), reason.value)
    assert await raw(port, "Policy", pb.PolicyRequest(), []) == (status(Reason.BAD_IDENTITY), "bad_identity")


async def test_the_client_presents_only_the_token_of_the_scope_it_is_asked_about(
    store: Store, bridge: Bridge, client: RemoteStore
) -> None:
    key = scope_key()
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    assert await refusal(client.admit(key, generation, "load", units=1)) is Reason.NO_ASSERTION
    with presenting(token_for(bridge, key, generation)):
        assert await refusal(client.admit(scope_key(OTHER), generation, "load")) is Reason.SCOPE_MISMATCH
        assert await refusal(client.admit(key, generation + 1, "load")) is Reason.SCOPE_MISMATCH


async def test_the_bearer_is_read_from_its_file_for_each_call(
    store: Store, bridge: Bridge, port: int, tmp_path: Path
) -> None:
    key = scope_key()
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    path = bearer_file(tmp_path)
    client = RemoteStore.connect(f"http://127.0.0.1:{port}", token_file=path)
    with presenting(token_for(bridge, key, generation)):
        await client.admit(key, generation, "load", units=1)
        path.write_text("token-of-other")  # the kubelet rotated it: another identity now
        assert await refusal(client.admit(key, generation, "load", units=1)) is Reason.BAD_ASSERTION
        path.unlink()
        with pytest.raises(GovernedMemoryError) as failed:
            await client.admit(key, generation, "load", units=1)
    assert (failed.value.reason, failed.value.cause) == (Reason.SERVICE_UNAVAILABLE, "identity_token_unreadable")
    await client.close()


async def test_one_service_keeps_two_agents_apart(store: Store, bridge: Bridge, port: int, tmp_path: Path) -> None:
    mine, theirs = scope_key(HELPER), scope_key(OTHER)  # the same user and room, two agents
    helper = RemoteStore.connect(f"http://127.0.0.1:{port}", token_file=bearer_file(tmp_path, "token-of-helper"))
    other = RemoteStore.connect(f"http://127.0.0.1:{port}", token_file=bearer_file(tmp_path, "token-of-other"))
    generations = [(await store.grant(k, purpose="assist", policy_version="v1")).generation for k in (mine, theirs)]
    with presenting(token_for(bridge, mine, generations[0])):
        await helper.admit(mine, generations[0], "save", units=1)
        await helper.write(mine, generations[0], facts("likes green tea"))
    with presenting(token_for(bridge, theirs, generations[1])):
        await other.admit(theirs, generations[1], "prefetch", units=1)
        assert await other.search(theirs, generations[1], embed("likes green tea")) == []
        await other.admit(theirs, generations[1], "save", units=1)
        await other.write(theirs, generations[1], facts("prefers coffee"))
    with presenting(token_for(bridge, mine, generations[0])):
        await helper.admit(mine, generations[0], "prefetch", units=1)
        assert [hit.text for hit in await helper.search(mine, generations[0], embed("prefers coffee"))] == []
    assert [(await store.status(k)).entries for k in (mine, theirs)] == [1, 1]
    await helper.close()
    await other.close()


async def test_nothing_of_a_fact_reaches_a_log_line_or_a_status(
    store: Store, bridge: Bridge, client: RemoteStore, port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    key = scope_key()
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    errors: list[GovernedMemoryError] = []
    with presenting(token_for(bridge, key, generation)):
        await client.admit(key, generation, "save", units=1)
        await client.write(key, generation, facts(SENTINEL))
        await client.admit(key, generation, "load", units=1)
        assert (await client.search(key, generation, embed(SENTINEL)))[0].text == SENTINEL
        await client.admit(key, generation, "save", units=1)
        for work in (client.write(key, generation, facts(SENTINEL * 10)), client.write(key, generation + 1, [])):
            with pytest.raises(GovernedMemoryError) as refused:
                await work
            errors.append(refused.value)
    token = token_for(bridge, key, generation, iss=SENTINEL)
    request = pb.WriteRequest(facts=[pb.Fact(text=SENTINEL, embedding=pb.Vector(values=embed("x")))])
    code, details = await raw(
        port, "Write", request, [("authorization", "Bearer token-of-helper"), ("x-memory-scope", token)]
    )
    assert details == "bad_assertion"
    shown = caplog.text + "".join(f"{e} {e!r} {e.explained()}" for e in errors) + details
    assert "zebra-sentinel" not in shown and "flowerpot" not in shown
    assert [e.reason for e in errors] == [Reason.FACT_TOO_LARGE, Reason.SCOPE_MISMATCH]


class Misbehaving:
    """A stand-in service that answers on ``Exchange`` what the real one never does (``unimplemented``: it has none)."""

    def __init__(self, answer: str) -> None:
        self.answer = answer

    def handler(self) -> grpc.GenericRpcHandler:
        async def exchange(calls: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            async for raw_call in calls:
                call = pb.Call.FromString(raw_call)
                if self.answer == "hang":
                    await asyncio.Event().wait()
                if self.answer == "ends":
                    return
                if self.answer == "status":
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, SENTINEL)
                yield {
                    "garbage": b"\xff\xff\xff\xff",
                    "refusal_text": pb.Answer(id=call.id, refused=pb.Refusal(reason=SENTINEL)).SerializeToString(),
                    "reason_of_nothing": pb.Answer(id=call.id).SerializeToString(),
                    "another_kind": pb.Answer(id=call.id, search=pb.SearchReply()).SerializeToString(),
                }[self.answer]

        method = grpc.stream_stream_rpc_method_handler(exchange, request_deserializer=None, response_serializer=None)
        methods = {} if self.answer == "unimplemented" else {"Exchange": method}
        return grpc.method_handlers_generic_handler("governed_memory.v1.DataPlane", methods)


@pytest.mark.parametrize(
    ("answer", "cause"),
    [
        ("garbage", "bad_answer"),
        ("refusal_text", "bad_answer"),
        ("reason_of_nothing", "bad_answer"),
        ("another_kind", "bad_answer"),
        ("status", "failed_precondition"),
        ("ends", "transport"),
        ("unimplemented", "unimplemented"),
        ("hang", "deadline_exceeded"),
        ("down", "unavailable"),
    ],
)
async def test_a_service_down_slow_or_answering_garbage_is_service_unavailable(
    bridge: Bridge, tmp_path: Path, answer: str, cause: str
) -> None:
    key = scope_key()
    grpc_server = grpc.aio.server()
    grpc_server.add_generic_rpc_handlers((Misbehaving(answer).handler(),))
    port = grpc_server.add_insecure_port("127.0.0.1:0") if answer != "down" else free_port()
    if answer != "down":
        await grpc_server.start()
    client = RemoteStore.connect(f"http://127.0.0.1:{port}", token_file=bearer_file(tmp_path), deadline=0.5)
    with presenting(token_for(bridge, key, 1)):
        with pytest.raises(GovernedMemoryError) as failed:
            await client.admit(key, 1, "load", units=1)
    await client.close()
    await grpc_server.stop(None)
    assert (failed.value.reason, failed.value.cause) == (Reason.SERVICE_UNAVAILABLE, cause)
    assert str(failed.value) == "service_unavailable" and failed.value.__cause__ is None
    assert "zebra" not in failed.value.explained()


async def test_every_handler_is_bounded_in_time(store: Store, bridge: Bridge, client: RemoteStore) -> None:
    class Hanging:
        async def agent(self, metadata: Mapping[str, str]) -> AgentId:
            await asyncio.Event().wait()
            raise AssertionError

    bounded = server.DataPlane(
        store,
        Hanging(),
        public_key=bridge.private_key.public_key(),
        issuer=ISSUER,
        homeserver=HOMESERVER,
        handler_seconds=0.05,
    )
    async with serving(bounded) as port:
        answer = await raw(port, "Policy", pb.PolicyRequest(), [("authorization", "Bearer token-of-helper")])
    assert answer == (grpc.StatusCode.UNAVAILABLE, "store_unavailable")


async def test_plaintext_goes_to_a_loopback_address_only(store: Store, bridge: Bridge, tmp_path: Path) -> None:
    token = bearer_file(tmp_path)
    for url in ("http://memory.example:7443", "http://10.0.0.7:7443", "ftp://127.0.0.1:1", "https://h", "http://[::1]"):
        with pytest.raises(ConfigurationError):
            RemoteStore.connect(url, token_file=token)
    with pytest.raises(ConfigurationError):
        RemoteStore.connect("https://memory.example:7443", token_file=token)  # no CA: no verify-full
    with pytest.raises(ValueError):
        server.build(plane(store, bridge), "0.0.0.0:0", tls=None)


# -- metering: a caller that skips Admit is held to the limits all the same ------------------------------------


HOURLY = "SELECT coalesce(sum(units), 0) FROM governed_memory.usage WHERE kind = 'hourly'"


def vectors(count: int) -> list[pb.Vector]:
    return [pb.Vector(values=embed(f"probe {index}")) for index in range(count)]


async def test_searches_and_writes_without_admit_are_spent_against_the_hourly_ceiling(
    store: Store, bridge: Bridge, port: int, sql: asyncpg.Connection
) -> None:
    key = scope_key()
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    metadata = [("authorization", "Bearer token-of-helper"), ("x-memory-scope", token_for(bridge, key, generation))]
    probe = pb.SearchRequest(embeddings=vectors(8), operation="prefetch")  # no Admit before any of them
    searches = [await raw(port, "Search", probe, metadata) for _ in range(8)]
    assert searches == [(grpc.StatusCode.OK, "")] * 7 + [(status(Reason.HOURLY_CEILING), "hourly_ceiling")]
    assert await sql.fetchval(HOURLY) == 56  # 60 an hour: seven searches of eight embeddings, the eighth refused
    fact = pb.Fact(text="planted", embedding=pb.Vector(values=embed("planted")))
    ok = (grpc.StatusCode.OK, "")
    assert await raw(port, "Write", pb.WriteRequest(facts=[fact] * 4, operation="autosave"), metadata) == ok
    planted = pb.WriteRequest(facts=[fact], operation="save")
    assert await raw(port, "Write", planted, metadata) == (status(Reason.HOURLY_CEILING), "hourly_ceiling")
    assert await sql.fetchval(HOURLY) == 60 and (await store.status(key)).entries == 1


async def test_admit_records_a_search_or_a_write_once_and_its_call_takes_it(
    store: Store, bridge: Bridge, client: RemoteStore, sql: asyncpg.Connection
) -> None:
    """Admit records what it admits, as the in-process runtime's admission does; the call it admitted takes it and
    spends nothing more; any other call is admitted and recorded where it is done."""
    key = scope_key()
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    with presenting(token_for(bridge, key, generation)):
        await client.admit(key, generation, "load", units=2, explicit=True)
        assert await sql.fetchval(HOURLY) == 2  # recorded when admitted, before the embedding
        await client.search_many(key, generation, [embed("a"), embed("b")])  # takes that admission
        assert await sql.fetchval(HOURLY) == 2
        await client.search_many(key, generation, [embed("a"), embed("b")])  # nothing left to take: spent here
        assert await sql.fetchval(HOURLY) == 4
        await client.admit(key, generation, "prefetch", units=8)
        await client.search_many(key, generation, [embed("a")])  # not the work admitted: spent again
        assert await sql.fetchval(HOURLY) == 13
        await client.admit(key, generation, "save", units=1, explicit=True)
        await client.write(key, generation, facts("the user drinks green tea"))
        assert await sql.fetchval(HOURLY) == 14
        await client.admit(key, generation, "summarize", units=1)  # the runtime's own model call
        assert await sql.fetchval(HOURLY) == 15
        assert await refusal(client.admit(key, generation, "prefetch", units=46)) is Reason.HOURLY_CEILING
        assert await sql.fetchval(HOURLY) == 15  # refused: nothing recorded, nothing to take


async def test_an_admission_awaiting_its_call_lapses_and_is_no_pass_through_the_fence(
    store: Store, bridge: Bridge, client: RemoteStore, sql: asyncpg.Connection
) -> None:
    """What ``Admit`` recorded for a search waits ``SPENT_SECONDS`` for it, then the search is admitted and spent
    again; and it is no pass: a withdrawal between the two still refuses the search (the store's fence)."""
    start = datetime.now(UTC).replace(microsecond=0)
    with freeze_time(start, real_asyncio=True) as frozen:
        key = scope_key()
        generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
        with presenting(token_for(bridge, key, generation)):
            await client.admit(key, generation, "prefetch", units=1)
        frozen.move_to(start + timedelta(seconds=server.SPENT_SECONDS + 1))
        with presenting(token_for(bridge, key, generation)):
            await client.search_many(key, generation, [embed("a")])  # the admission lapsed: spent here
            assert await sql.fetchval(HOURLY) == 2
            await client.admit(key, generation, "prefetch", units=1)
            await store.off(key)
            assert await refusal(client.search_many(key, generation, [embed("a")])) is Reason.CONSENT_DISABLED
        assert await sql.fetchval(HOURLY) == 3


async def test_an_explicit_search_is_rate_limited_per_sender_where_it_is_done(
    store: Store, bridge: Bridge, port: int
) -> None:
    key = scope_key()
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    metadata = [("authorization", "Bearer token-of-helper"), ("x-memory-scope", token_for(bridge, key, generation))]
    load = pb.SearchRequest(embeddings=vectors(1), operation="load")  # load is explicit whatever the flag says
    answers = [await raw(port, "Search", load, metadata) for _ in range(4)]
    assert answers == [(grpc.StatusCode.OK, "")] * 3 + [(status(Reason.RATE_LIMITED), "rate_limited")]  # burst 3


@pytest.mark.parametrize(
    ("method", "request_"),
    [
        ("Search", pb.SearchRequest(embeddings=vectors(1))),  # no operation: not admitted work
        ("Search", pb.SearchRequest(embeddings=vectors(1), operation="save")),
        ("Search", pb.SearchRequest(embeddings=vectors(1), operation="summarize")),
        ("Write", pb.WriteRequest(facts=[pb.Fact(text="x", embedding=pb.Vector(values=embed("x")))], operation="load")),
        ("Write", pb.WriteRequest(facts=[pb.Fact(text="x", embedding=pb.Vector(values=embed("x")))])),
    ],
    ids=["search-unnamed", "search-as-save", "search-as-summarize", "write-as-load", "write-unnamed"],
)
async def test_a_search_or_write_named_as_other_work_is_bad_input_and_spends_nothing(
    store: Store, bridge: Bridge, port: int, sql: asyncpg.Connection, method: str, request_: object
) -> None:
    key = scope_key()
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    metadata = [("authorization", "Bearer token-of-helper"), ("x-memory-scope", token_for(bridge, key, generation))]
    assert await raw(port, method, request_, metadata) == (status(Reason.BAD_INPUT), "bad_input")
    assert await sql.fetchval(HOURLY) == 0 and (await store.status(key)).entries == 0
