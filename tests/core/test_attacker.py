"""An attacker holding everything an agent pod holds (#35, R43): the pod's whole environment and every file it is
given, as the rendered overlay (deploy/overlays/declarative-0.10.4) mounts them, plus the network to the memory
service and to the database, reaches:

- no database connection: nothing the pod holds is the database's password (PgBouncer with SCRAM in front of the
  suite's PostgreSQL, the way a cluster's database is reached: over TCP, with a password only the service holds);
- without a bridge-signed scope token, nothing of memory: every data-plane call is refused with a reason code;
- with one user's token, that user's scope only, the data-plane operations only (no inspect, no erasure, no
  consent), and only until the token's expiry plus the leeway;
- nothing at all with a token for this agent presented by another agent's identity.

Real parts: ``serve`` as a process over PgBouncer 1.18 and the suite's PostgreSQL and key store, the API server's
keys (``cluster.py``) signing the pod's projected token, the bridge's real signing."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import httpx
import pytest
from cluster import AUDIENCE, Cluster, Key, claims, token
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from manifests import rendered
from pgbouncer import DEBIAN_12, PASSWORD, PgBouncer, server_of
from service import HELPER, OTHER, Service, projected, running
from support import key_store_of

from kagent_memory_governed.bridge import AsyncControlClient, ScopeSigner, Subject
from kagent_memory_governed.errors import Reason
from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey
from kagent_memory_governed.service import data_plane_pb2 as pb
from kagent_memory_governed.service import data_plane_pb2_grpc as pb_grpc
from kagent_memory_governed.service import remote
from kagent_memory_governed.service.remote import RemoteStore
from kagent_memory_governed.service.wire import status
from kagent_memory_governed.store import NewFact, Store
from kagent_memory_governed.testing import Bridge, embed
from kagent_memory_governed.testing.bridge import HOMESERVER
from kagent_memory_governed.testing.bridge import ISSUER as BRIDGE_ISSUER

OVERLAY = "declarative-0.10.4"
OK = (grpc.StatusCode.OK, "")


@dataclass
class Pod:
    """What the agent pod holds: its environment, and every file mounted into it (path in the pod -> content),
    written under ``root`` as well."""

    env: dict[str, str]
    files: dict[str, bytes]
    root: Path

    def path(self, inside: str) -> Path:
        return self.root / inside.lstrip("/")

    def strings(self) -> set[str]:
        """Every value and file of the pod, and each word of them: what an attacker would try."""
        held = set(self.env.values()) | {content.decode(errors="replace") for content in self.files.values()}
        words = {word for value in held for word in value.replace("@", " ").replace(":", " ").split()}
        return {value.strip() for value in held | words if value.strip()}


def _agent(overlay: str) -> dict[str, Any]:
    [agent] = [doc for doc in rendered(overlay) if doc["kind"] == "Agent"]
    return agent


@pytest.fixture(scope="module")
def pod(
    tmp_path_factory: pytest.TempPathFactory, kube: tuple[Cluster, Key], governed_private_key: Ed25519PrivateKey
) -> Pod:
    """The rendered Agent's pod: its env as given (a Secret reference would be resolved; there is none), and its
    volumes as the kubelet fills them: the projected token a real one of the cluster's keys, the CA and the
    bridge's key the Secrets' content; and the default service-account token kubelets mount unless told not to."""
    deployment = _agent(OVERLAY)["spec"]["declarative"]["deployment"]
    assert all("value" in variable for variable in deployment["env"]), "the agent's env refers to a Secret"
    env = {variable["name"]: variable["value"] for variable in deployment["env"]}
    volumes = {volume["name"]: volume for volume in deployment["volumes"]}
    ca_key = ec.generate_private_key(ec.SECP256R1())
    from certificates import certificate

    service_ca = certificate("service CA", ca_key, "service CA", ca_key, ca=True).public_bytes(
        serialization.Encoding.PEM
    )
    bridge_pem = Bridge(private_key=governed_private_key).public_pem.encode()
    directory = tmp_path_factory.mktemp("pod")
    files: dict[str, bytes] = {}
    for mount in deployment["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "projected" in volume:
            [source] = volume["projected"]["sources"]
            request = source["serviceAccountToken"]
            assert request["audience"] == AUDIENCE and request["expirationSeconds"] == 600
            files[f"{mount['mountPath']}/{request['path']}"] = projected(directory, kube[1], HELPER).read_bytes()
        else:
            secret = {"governed-memory-service-ca": service_ca, "governed-memory-bridge-key": bridge_pem}
            [item] = volume["secret"]["items"]
            files[f"{mount['mountPath']}/{item['path']}"] = secret[volume["secret"]["secretName"]]
    now = int(time.time())
    default = claims("kagent", "helper", aud=["https://kubernetes.default.svc.cluster.local"], iat=now, exp=now + 3600)
    files["/var/run/secrets/kubernetes.io/serviceaccount/token"] = token(kube[1], default).encode()
    for inside, content in files.items():
        (directory / inside.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (directory / inside.lstrip("/")).write_bytes(content)
    return Pod(env, files, directory)


@pytest.fixture(scope="module")
def database(database_url: str, store: Store) -> Iterator[PgBouncer]:
    """The database as a cluster reaches it: over TCP, SCRAM, the password only the service's Secret holds."""
    DEBIAN_12.require()
    with PgBouncer({"memory": f"{server_of(database_url)} dbname=postgres"}, binary=DEBIAN_12) as bouncer:
        yield bouncer


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory,
    database: PgBouncer,
    database_url: str,
    governed_private_key: Ed25519PrivateKey,
    kube: tuple[Cluster, Key],
) -> Iterator[Service]:
    keys = f"file://{key_store_of(database_url)}"  # the suite's key store: bound to that database
    bridge = Bridge(private_key=governed_private_key)
    directory = tmp_path_factory.mktemp("service")
    with running(directory, bridge, database.url("memory"), kube[0], KAGENT_GOVERNED_MEMORY_KEY_STORE=keys) as served:
        yield served


@pytest.fixture
def signer(governed_private_key: Ed25519PrivateKey) -> ScopeSigner:
    return ScopeSigner(governed_private_key, BRIDGE_ISSUER, HELPER)


def _subject(user: str) -> Subject:
    return Subject(f"@{user}:{HOMESERVER}", f"!room{uuid.uuid4().hex[:12]}:{HOMESERVER}")


def _key(subject: Subject, agent: str = HELPER) -> ScopeKey:
    return ScopeKey(Principal.parse(subject.mxid, "native"), AgentId.parse(agent), ControlRoom.parse(subject.room))


async def call(service: Service, method: str, request: object, metadata: list[tuple[str, str]]) -> tuple[object, str]:
    """A data-plane call as the attacker makes it, by hand: (status code, details)."""
    async with grpc.aio.insecure_channel(service.data.removeprefix("http://")) as channel:
        stub = pb_grpc.DataPlaneStub(channel)
        try:
            await getattr(stub, method)(request, metadata=metadata, timeout=10)
        except grpc.aio.AioRpcError as error:
            return error.code(), error.details() or ""
    return OK


def _bearer(pod: Pod) -> str:
    return pod.files[pod.env["KAGENT_GOVERNED_MEMORY_SERVICE_TOKEN"]].decode().strip()


def _calls() -> list[tuple[str, object]]:
    vector = pb.Vector(values=embed("anything"))
    return [
        ("Admit", pb.AdmitRequest(operation="load", units=1)),
        ("Search", pb.SearchRequest(embeddings=[vector], operation="prefetch")),
        ("Write", pb.WriteRequest(facts=[pb.Fact(text="planted", embedding=vector)], operation="save")),
        ("RecordTurn", pb.RecordTurnRequest(session_id="s", invocation_id="i")),
        ("CollectTurns", pb.CollectTurnsRequest(session_id="s", candidates=["i"])),
    ]


Consented = dict[str, tuple[Subject, int, str]]  # each user's subject, consent generation and scope token


@pytest.fixture
async def consented(service: Service, signer: ScopeSigner) -> AsyncIterator[Consented]:
    """Alice and Bob consented through the bridge, each with one fact written as the runtime writes it."""
    made: Consented = {}
    async with httpx.AsyncClient(base_url=service.control) as http:
        for user in ("alice", "bob"):
            subject = _subject(user)
            generation = (await AsyncControlClient(http, signer, subject).consent("assist", "v1")).generation
            made[user] = (subject, generation, signer.scope(subject, generation))
    yield made


async def _write_as_runtime(
    service: Service, pod: Pod, subject: Subject, generation: int, scope: str, fact: str
) -> None:
    """As the runtime writes: admitted, then written, with the pod's identity and the request's token."""
    client = RemoteStore.connect(service.data, token_file=pod.path(pod.env["KAGENT_GOVERNED_MEMORY_SERVICE_TOKEN"]))
    carried = remote.carry(scope)
    try:
        await client.admit(_key(subject), generation, "save", units=1)
        await client.write(_key(subject), generation, [NewFact(fact, embed(fact))])
    finally:
        remote._scope_token.reset(carried)
        await client.close()


# -- the database -----------------------------------------------------------------------------------------------


@pytest.mark.long
async def test_nothing_an_agent_pod_holds_opens_the_database(pod: Pod, database: PgBouncer, service: Service) -> None:
    held = pod.strings()
    assert not [name for name in pod.env if "DATABASE" in name or "KEY_STORE" in name]
    assert not any(PASSWORD in value for value in held)  # the service's Secret, never the pod's
    tried = 0
    for user in sorted({database.user, "governed", "governed_memory", "kagent"}):
        for candidate in sorted(held):
            with pytest.raises(asyncpg.PostgresError) as refused:
                await asyncpg.connect(
                    host="127.0.0.1", port=database.port, user=user, password=candidate, database="memory", timeout=5
                )
            assert "authentication failed" in str(refused.value), type(refused.value).__name__  # SCRAM said no
            tried += 1
    assert tried > 20
    # the door is real: the service's own password opens it
    conn = await asyncpg.connect(
        host="127.0.0.1", port=database.port, user=database.user, password=PASSWORD, database="memory"
    )
    await conn.close()


# -- the service, without and with a bridge-signed token ---------------------------------------------------------


async def test_without_a_bridge_signed_scope_token_the_service_answers_nothing_of_memory(
    pod: Pod, service: Service, consented: Consented
) -> None:
    bearer = [("authorization", f"Bearer {_bearer(pod)}")]
    alice = consented["alice"][2]
    header, claimed, _ = alice.split(".")
    forged = (
        f"{header}.{claimed}.{base64.urlsafe_b64encode(Ed25519PrivateKey.generate().sign(b'x')).decode().rstrip('=')}"
    )
    own_key = Bridge()  # a key of the attacker's own, with the bridge's issuer and every right claim
    claims_ = json.loads(base64.urlsafe_b64decode(claimed + "=" * (-len(claimed) % 4)))
    self_signed = own_key.sign(time.time(), **{k: v for k, v in claims_.items() if k not in ("iat", "exp", "jti")})
    for method, request in _calls():
        assert await call(service, method, request, bearer) == (status(Reason.NO_ASSERTION), "no_assertion")
        for scope in (_bearer(pod), forged, self_signed):  # the pod's own tokens, a forgery, a token of its own key
            answer = await call(service, method, request, [*bearer, ("x-memory-scope", scope)])
            assert answer == (status(Reason.BAD_ASSERTION), "bad_assertion"), (method, answer)
        # the default service-account token is no identity here: its audience is the API server's
        default = pod.files["/var/run/secrets/kubernetes.io/serviceaccount/token"].decode()
        answer = await call(
            service, method, request, [("authorization", f"Bearer {default}"), ("x-memory-scope", alice)]
        )
        assert answer == (status(Reason.BAD_IDENTITY), "bad_identity")
    async with httpx.AsyncClient(base_url=service.control) as http:  # the control API takes no pod token either
        for path in ("/memory/v1/status", "/memory/v1/entries"):
            response = await http.get(path, headers={"Authorization": f"Bearer {_bearer(pod)}"})
            assert (response.status_code, response.json()) == (401, {"error": "bad_assertion"})


async def test_one_users_token_reaches_that_scope_only_for_data_plane_work_until_it_expires(
    pod: Pod, service: Service, consented: Consented, governed_private_key: Ed25519PrivateKey
) -> None:
    (alice, alice_generation, alice_token), (bob, bob_generation, bob_token) = consented["alice"], consented["bob"]
    await _write_as_runtime(service, pod, alice, alice_generation, alice_token, "alice keeps bees")
    await _write_as_runtime(service, pod, bob, bob_generation, bob_token, "bob collects stamps")
    as_alice = [("authorization", f"Bearer {_bearer(pod)}"), ("x-memory-scope", alice_token)]
    # alice's scope, and only hers, whatever is searched for
    async with grpc.aio.insecure_channel(service.data.removeprefix("http://")) as channel:
        stub = pb_grpc.DataPlaneStub(channel)
        probes = [pb.Vector(values=embed(text)) for text in ("bob collects stamps", "stamps", "alice keeps bees")]
        reply = await stub.Search(pb.SearchRequest(embeddings=probes, operation="prefetch"), metadata=as_alice)
        found = {hit.text for result in reply.results for hit in result.hits}
        assert found == {"alice keeps bees"}
        # no call of the data plane lists, erases or changes consent: there is no such method to call
        for method in ("Inspect", "Forget", "ForgetAll", "Off", "Offboard", "Consent"):
            unknown = channel.unary_unary(f"/governed_memory.v1.DataPlane/{method}")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await unknown(b"", metadata=as_alice, timeout=10)
            assert refused.value.code() is grpc.StatusCode.UNIMPLEMENTED
    # nor does the control API take a scope token: inspect, forget, forget-all, off all refuse it
    async with httpx.AsyncClient(base_url=service.control) as http:
        headers = {"Authorization": f"Bearer {alice_token}"}
        for method, path, body in [
            ("GET", "/memory/v1/entries", None),
            ("GET", "/memory/v1/status", None),
            ("POST", "/memory/v1/forget-all", {"confirm": True}),
            ("POST", "/memory/v1/off", {"confirm": True}),
            ("POST", "/memory/v1/consent", {"purpose": "x", "policy_version": "1"}),
        ]:
            response = await http.request(method, path, headers=headers, json=body)
            assert (response.status_code, response.json()) == (401, {"error": "bad_assertion"}), path
        alice_memory = AsyncControlClient(http, ScopeSigner(governed_private_key, BRIDGE_ISSUER, HELPER), alice)
        assert (await alice_memory.status()).entries == 1  # the bridge's own token still works: nothing was erased
    # until its expiry plus the 30 s leeway only: a 300 s token that expired 25 s ago works; 35 s ago it does not
    bridge = Bridge(private_key=governed_private_key, room=alice.room)
    now = time.time()
    for expired, expected in ((25, OK), (35, (status(Reason.BAD_ASSERTION), "bad_assertion"))):
        signed = int(now) - 300 - expired
        late = bridge.sign(now, sub=alice.mxid, gen=alice_generation, iat=signed, exp=signed + 300)
        request = pb.SearchRequest(embeddings=[pb.Vector(values=embed("bees"))], operation="prefetch")
        answer = await call(service, "Search", request, [as_alice[0], ("x-memory-scope", late)])
        assert answer == expected, expired


async def test_this_agents_token_presented_by_another_agents_identity_is_refused(
    pod: Pod, service: Service, consented: Consented, kube: tuple[Cluster, Key], tmp_path: Path
) -> None:
    alice_token = consented["alice"][2]
    other = projected(tmp_path, kube[1], OTHER).read_text().strip()
    for method, request in _calls():
        answer = await call(
            service, method, request, [("authorization", f"Bearer {other}"), ("x-memory-scope", alice_token)]
        )
        assert answer == (status(Reason.BAD_ASSERTION), "bad_assertion"), method
