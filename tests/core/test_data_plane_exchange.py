"""``DataPlane.Exchange`` (#35, ADR 0001): the data-plane calls multiplexed over one long-lived stream, as the runtime's
client speaks them. Each message is verified on its own, whatever came before it on the stream; answers come as
calls are done, matched by id; a stream that fails fails what it had pending, and the next call opens another."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
from support import facts
from test_data_plane import IDENTITY, bearer_file, plane, presenting, scope_key, serving, token_for

from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.scope import AgentId
from kagent_memory_governed.service import data_plane_pb2 as pb
from kagent_memory_governed.service import data_plane_pb2_grpc as pb_grpc
from kagent_memory_governed.service import server, wire
from kagent_memory_governed.service.remote import RemoteStore
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import HOMESERVER, ISSUER, Bridge


class HeldIdentity:
    """The suite's table identity, but a call presenting ``Bearer held`` waits until ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.holding = 0
        self.more_held = asyncio.Event()

    async def holds(self, count: int) -> None:
        while self.holding < count:
            self.more_held.clear()
            await asyncio.wait_for(self.more_held.wait(), 5)

    async def agent(self, metadata: Mapping[str, str]) -> AgentId:
        if metadata.get("authorization") == "Bearer held":
            self.holding += 1
            self.more_held.set()
            await self.release.wait()
            return await IDENTITY.agent({"authorization": "Bearer token-of-helper"})
        return await IDENTITY.agent(metadata)


def held_plane(store: Store, bridge: Bridge, identity: HeldIdentity) -> server.DataPlane:
    public_key = bridge.private_key.public_key()
    return server.DataPlane(store, identity, public_key=public_key, issuer=ISSUER, homeserver=HOMESERVER)


async def answers(stream: Any, count: int) -> list[pb.Answer]:
    return [await asyncio.wait_for(stream.read(), 5) for _ in range(count)]


async def test_each_message_is_verified_on_its_own_whatever_came_before_it_on_the_stream(
    store: Store, bridge: Bridge
) -> None:
    key = scope_key()
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    token = token_for(bridge, key, generation)
    helper = "Bearer token-of-helper"
    calls = [
        pb.Call(id=1, authorization=helper, scope=token, admit=pb.AdmitRequest(operation="load", units=1)),
        pb.Call(id=2, authorization=helper, admit=pb.AdmitRequest(operation="load", units=1)),  # no scope token
        pb.Call(id=3, authorization="Bearer token-of-other", scope=token, admit=pb.AdmitRequest(operation="load")),
        pb.Call(id=4, scope=token, admit=pb.AdmitRequest(operation="load", units=1)),  # no identity
        pb.Call(id=5, authorization=helper, scope=token),  # no request
        pb.Call(id=6, authorization=helper, scope=token, admit=pb.AdmitRequest(operation="erase", units=1)),
        pb.Call(id=7, authorization=helper, policy=pb.PolicyRequest()),
        pb.Call(id=8, authorization=helper, scope=token, admit=pb.AdmitRequest(operation="load", units=1)),
    ]
    async with serving(plane(store, bridge)) as port, grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stream = pb_grpc.DataPlaneStub(channel).Exchange()
        for call in calls:
            await stream.write(call)
        got = {answer.id: answer for answer in await answers(stream, len(calls))}
        await stream.done_writing()
        assert await asyncio.wait_for(stream.read(), 5) is grpc.aio.EOF  # all asked is answered, then the end
    assert [got[n].WhichOneof("reply") for n in (1, 7, 8)] == ["admit", "policy", "admit"]
    refused = {n: got[n].refused.reason for n in (2, 3, 4, 5, 6)}
    assert refused == {2: "no_assertion", 3: "bad_assertion", 4: "bad_identity", 5: "bad_input", 6: "bad_input"}
    assert got[7].policy == pb.PolicyReply(**store.policy.model_dump())


async def test_answers_come_as_calls_are_done_and_each_finds_its_caller(
    store: Store, bridge: Bridge, tmp_path: Path
) -> None:
    identity = HeldIdentity()
    async with serving(held_plane(store, bridge, identity)) as port:
        held = RemoteStore.connect(f"http://127.0.0.1:{port}", token_file=bearer_file(tmp_path, "held"))
        slow = asyncio.create_task(held.refresh_policy())
        fast_channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stream = pb_grpc.DataPlaneStub(fast_channel).Exchange()
        await stream.write(pb.Call(id=1, authorization="Bearer held", policy=pb.PolicyRequest()))
        await stream.write(pb.Call(id=2, authorization="Bearer token-of-helper", policy=pb.PolicyRequest()))
        [first] = await answers(stream, 1)
        assert first.id == 2 and not slow.done()  # the later call, not held, is answered first
        identity.release.set()
        [second] = await answers(stream, 1)
        assert second.id == 1 and await slow == store.policy
        await fast_channel.close()
        await held.close()


async def test_a_stream_that_fails_fails_its_pending_calls_and_the_next_call_opens_another(
    store: Store, bridge: Bridge, tmp_path: Path
) -> None:
    identity = HeldIdentity()
    first, port = server.build(held_plane(store, bridge, identity), "127.0.0.1:0", tls=None)
    await first.start()
    url = f"http://127.0.0.1:{port}"
    held = RemoteStore.connect(url, token_file=bearer_file(tmp_path, "held"), deadline=5)
    pending = [asyncio.create_task(held.refresh_policy()) for _ in range(3)]
    await identity.holds(3)
    await first.stop(None)  # the replica goes with three calls pending on its stream
    failures = await asyncio.gather(*pending, return_exceptions=True)
    assert all(isinstance(f, GovernedMemoryError) and f.reason is Reason.SERVICE_UNAVAILABLE for f in failures)
    assert {f.cause for f in failures if isinstance(f, GovernedMemoryError)} <= {"unavailable", "cancelled"}
    second, _ = server.build(plane(store, bridge), f"127.0.0.1:{port}", tls=None)
    await second.start()
    try:
        client = RemoteStore.connect(url, token_file=bearer_file(tmp_path), deadline=5)
        assert await client.refresh_policy() == store.policy  # a new stream on a channel that reconnected
        key = scope_key()
        generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
        with presenting(token_for(bridge, key, generation)):
            await client.admit(key, generation, "save", units=1)
            [entry] = await client.write(key, generation, facts("likes green tea"))
        assert (await store.status(key)).entries == 1 and entry
        await client.close()
        await held.close()
    finally:
        await second.stop(None)


async def test_a_stream_is_not_read_past_its_pending_bound(
    store: Store, bridge: Bridge, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wire, "MAX_PENDING_CALLS", 2)
    identity = HeldIdentity()
    async with (
        serving(held_plane(store, bridge, identity)) as port,
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as c,
    ):
        stream = pb_grpc.DataPlaneStub(c).Exchange()
        for n, bearer in ((1, "held"), (2, "held"), (3, "token-of-helper")):
            await stream.write(pb.Call(id=n, authorization=f"Bearer {bearer}", policy=pb.PolicyRequest()))
        with pytest.raises(TimeoutError):  # two held: the third waits unread, however quick it would be
            await asyncio.wait_for(asyncio.shield(read := asyncio.ensure_future(stream.read())), 0.3)
        identity.release.set()
        got = [await asyncio.wait_for(read, 5), *await answers(stream, 2)]
        assert sorted(answer.id for answer in got) == [1, 2, 3]


async def test_a_call_past_its_deadline_leaves_the_stream_to_the_calls_after_it(
    store: Store, bridge: Bridge, tmp_path: Path
) -> None:
    identity = HeldIdentity()
    async with serving(held_plane(store, bridge, identity)) as port:
        held = RemoteStore.connect(f"http://127.0.0.1:{port}", token_file=bearer_file(tmp_path, "held"), deadline=0.2)
        with pytest.raises(GovernedMemoryError) as late:
            await held.refresh_policy()
        assert (late.value.reason, late.value.cause) == (Reason.SERVICE_UNAVAILABLE, "deadline_exceeded")
        stream = held._stream
        identity.release.set()  # the held call is answered into nothing
        held._token_file.write_text("token-of-helper\n")
        assert await held.refresh_policy() == store.policy
        assert held._stream is stream  # the same stream
        await held.close()


async def test_a_message_that_does_not_parse_ends_its_own_stream_only(store: Store, bridge: Bridge) -> None:
    async with serving(plane(store, bridge)) as port, grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        raw = channel.stream_stream("/governed_memory.v1.DataPlane/Exchange")()  # bytes in, bytes out
        other = pb_grpc.DataPlaneStub(channel).Exchange()
        await raw.write(b"\xff\xff\xff\xff")
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            while True:
                if await asyncio.wait_for(raw.read(), 5) is grpc.aio.EOF:
                    break
        assert ended.value.code() != grpc.StatusCode.OK and "zebra" not in str(ended.value.details())
        await other.write(pb.Call(id=1, authorization="Bearer token-of-helper", policy=pb.PolicyRequest()))
        [answer] = await answers(other, 1)  # another stream on the same connection goes on
        assert answer.WhichOneof("reply") == "policy"
