"""The data plane's cost (#35, ADR 0001): in-process ``Store`` against ``RemoteStore`` through the service's
``grpc.aio`` server on loopback with TLS (a CA made here), side by side in one run, over one PostgreSQL.

    python benchmarks/data_plane.py [--url postgresql+asyncpg://...] [--runs 300]

Per operation, the median of ``--runs`` calls after a warm-up: ``admit`` (one unit, a fresh scope each run), ``search``
(one 768-d embedding over a scope of 100 entries), ``write`` (one fact, a fresh scope each run). The bound is the
ADR's: through the service, the in-process median plus 1.5 ms. The service verifies the identity and the scope token
on every call. It runs in this process and on this event loop, so client and server share one core: a
conservative measure. Prints a table and writes benchmarks/results/data_plane.json. Unset --url: the embedded
PostgreSQL, with a throw-away key store.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kagent_memory_governed.embedded import start
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.keys import LocalKeyStore
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey
from kagent_memory_governed.service import remote, server
from kagent_memory_governed.service.remote import RemoteStore
from kagent_memory_governed.store import NewFact, Store
from kagent_memory_governed.testing import HOMESERVER, ISSUER, Bridge, embed

AGENT = AgentId.parse("kagent/bench")
BOUND_MS = 1.5


class BenchIdentity:
    """A BENCHMARK DOUBLE of the workload identity: one bearer string, one agent."""

    async def agent(self, metadata: Mapping[str, str]) -> AgentId:
        if metadata.get("authorization") != "Bearer bench-token":
            raise GovernedMemoryError(Reason.BAD_IDENTITY)
        return AGENT


def tls(directory: Path) -> server.ServerTLS:
    """A CA of this run (its certificate written to ``directory/ca.pem``) and a serving certificate for 127.0.0.1."""
    now = datetime.now(UTC)

    def certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, signer: ec.EllipticCurvePrivateKey):
        builder = x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        builder = builder.issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        builder = builder.public_key(key.public_key()).serial_number(x509.random_serial_number())
        builder = builder.not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(hours=2))
        if subject == issuer:
            builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        else:
            loopback = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
            builder = builder.add_extension(x509.SubjectAlternativeName([loopback]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    pem = serialization.Encoding.PEM
    (directory / "ca.pem").write_bytes(certificate("bench CA", ca_key, "bench CA", ca_key).public_bytes(pem))
    chain = certificate("governed-memory", leaf_key, "bench CA", ca_key).public_bytes(pem)
    private = leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return server.ServerTLS(chain, private)


def fresh_key() -> ScopeKey:
    return ScopeKey(
        Principal.parse(f"@u{uuid.uuid4().hex[:10]}:{HOMESERVER}", "native"),
        AGENT,
        ControlRoom.parse(f"!bench{uuid.uuid4().hex[:12]}:{HOMESERVER}"),
    )


def token(bridge: Bridge, key: ScopeKey, generation: int) -> str:
    return bridge.sign(time.time(), sub=key.principal.mxid, aud=str(key.agent), room=key.room.room_id, gen=generation)


async def measure(store: Store, client: RemoteStore, bridge: Bridge, runs: int) -> dict[str, dict[str, float]]:
    fact = "the user prefers green tea in the afternoon"
    vector = embed(fact)
    searched = fresh_key()
    searched_generation = (await store.grant(searched, purpose="bench", policy_version="v1")).generation
    await store.write(
        searched, searched_generation, [NewFact(f"fact number {n} {fact}", embed(f"{n} {fact}")) for n in range(100)]
    )
    searched_token = token(bridge, searched, searched_generation)
    samples: dict[str, dict[str, list[float]]] = {
        name: {"in_process": [], "service": []} for name in ("admit", "search", "write")
    }
    for _ in range(runs):
        for side, target in (("in_process", store), ("service", client)):
            for name in ("admit", "write"):
                key = fresh_key()  # a fresh scope: admission runs in full, and a write never meets the cap
                generation = (await store.grant(key, purpose="bench", policy_version="v1")).generation
                carried = remote.carry(token(bridge, key, generation))
                started = time.perf_counter()
                if name == "admit":
                    await target.admit(key, generation, "prefetch", units=1)
                else:
                    await target.write(key, generation, [NewFact(fact, vector)])
                samples[name][side].append(time.perf_counter() - started)
                remote._scope_token.reset(carried)
            carried = remote.carry(searched_token)
            started = time.perf_counter()
            await target.search(searched, searched_generation, vector, top_k=5, min_score=0.3)
            samples["search"][side].append(time.perf_counter() - started)
            remote._scope_token.reset(carried)
    result: dict[str, dict[str, float]] = {}
    for name, sides in samples.items():
        local, through = (statistics.median(sides[side]) * 1000 for side in ("in_process", "service"))
        result[name] = {
            "in_process_median_ms": local,
            "service_median_ms": through,
            "added_ms": through - local,
            "bound_ms": local + BOUND_MS,
            "met": float(through <= local + BOUND_MS),
        }
    return result


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url")
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="data-plane-bench-"))
    url = args.url or start(directory / "pg")
    store = Store.connect(url, Policy(), keys=LocalKeyStore(directory / "keys"))
    bridge = Bridge()
    plane = server.DataPlane(
        store, BenchIdentity(), public_key=bridge.private_key.public_key(), issuer=ISSUER, homeserver=HOMESERVER
    )
    grpc_server, port = server.build(plane, "127.0.0.1:0", tls=tls(directory))
    (directory / "token").write_text("bench-token")
    await grpc_server.start()
    client = RemoteStore.connect(
        f"https://127.0.0.1:{port}", token_file=directory / "token", ca_file=directory / "ca.pem"
    )
    try:
        await store.migrate()
        await measure(store, client, bridge, 20)  # warm the pools, the plans and the channel
        result = await measure(store, client, bridge, args.runs)
    finally:
        await client.close()
        await grpc_server.stop(None)
        await store.close()
    print(f"median ms of {args.runs} runs, loopback with TLS")  # noqa: T201
    print(f"{'operation':10} {'in-process':>12} {'service':>10} {'added':>8} {'bound':>8}  met")  # noqa: T201
    for name, row in result.items():
        print(  # noqa: T201
            f"{name:10} {row['in_process_median_ms']:12.3f} {row['service_median_ms']:10.3f}"
            f" {row['added_ms']:8.3f} {row['bound_ms']:8.3f}  {'yes' if row['met'] else 'NO'}"
        )
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "data_plane.json").write_text(json.dumps({"runs": args.runs, "tls": True, **result}, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
