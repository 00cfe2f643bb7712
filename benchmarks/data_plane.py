"""The data plane's cost (#35, #47, ADR 0001): the runtime's memory operations in-process (``LocalPlane`` over a
``Store``) and through the memory service (``RemoteStore`` to a real ``kagent-memory-governed serve`` process over
TLS on loopback), side by side in one run, over one PostgreSQL, one key store and one embedding provider.

    python benchmarks/data_plane.py [--url postgresql+asyncpg://... --key-store file:///path] [--runs 300]
                                    [--breakdown-runs 100] [--no-same-loop] [--json out.json]

**Operations**, each as ``GovernedMemoryService`` (``adk/service.py``) runs it, one call of the data plane each (the
plane admits, embeds, then searches or writes):

- ``search``: ``load_memory``'s path: ``recall`` of one query (admitted as ``load``, one unit, explicit) over a scope
  of 100 entries (top 5, score at least 0.3);
- ``save``: ``save_memory``'s path: ``remember`` of one fact (``save``, one unit, explicit) into a scope of 99;
- ``prefetch``: the first message's prefetch: ``recall`` of 8 queries (``prefetch``, 8 units) over 100 entries.

**The embedding provider** is the same for every arm: an OpenAI-compatible ``/v1/embeddings`` server in a process of
its own on loopback (``testing.EmbeddingServer``), answering precomputed 768-d vectors near the scopes' entries, so
that every search finds its five hits. In process the runtime's ``OpenAIEmbedder`` calls it; through the service,
the service's (``KAGENT_GOVERNED_MEMORY_EMBEDDINGS``).

**Arms**: ``in-process``: a ``Store`` in this process; ``service``: ``RemoteStore`` to ``serve`` run as a process of
its own (the deployed shape: its own interpreter and event loop; TLS with a CA made here; each call carries a
projected service-account token that the service verifies against a fake API server's JWKS over TLS, the test
suite's ``tests/cluster.py``, and the bridge-signed scope token, verified on every call); ``service unary``: the same
serve reached by unary calls instead of ``Exchange``; ``same loop`` (unless ``--no-same-loop``): ``server.DataPlane``
with ``server.build`` and TLS inside this process, client and server on one event loop and so one core: a
pessimistic figure, shown for comparison only. Every arm has a ``Store`` of its own (the keyrings it keeps are its
own); the scopes are written beforehand by yet another, so every timed operation meets a scope no arm has read (its
keyring cold), as a turn's first memory call does.

**Limits met honestly**: an explicit load or save spends the sender's bucket (burst 3) and every unit the scope's
hourly ceiling (60), through the service too; so each run has a fresh sender and scope, granted and filled before
the timed part, and every scope token is signed (120 s lifetime) just before its run, outside the timing.

**Fairness**: median of ``--runs`` runs after a warm-up of 20; arms take turns in batches of 10 runs of each
operation, the first arm of a batch rotating, so machine load falls on every arm alike. The bound is #47's: through
the service, the in-process median plus 1.5 ms.

**Where the added time goes** (``--breakdown-runs``, then): the same operations, against a second ``serve`` process
whose handlers are timed from inside (this script run with ``--timed-serve``: wrappers around ``DataPlane._do`` and
``_answer``, the workload identity, the scope token's verification, the store's calls and the embedder), beside the
in-process plane's steps (the admission, the embedding, the work); and, in this process, the costs that make them
up: the scope token's Ed25519 verification, the workload identity (a cached token and a fresh one), protobuf for 1
and 8 queries and their hits, the identity token's file read; and the floor of a call, unary and as a message on an
open stream, to a bare echo server.

Prints tables and writes ``benchmarks/results/data_plane.json`` (or ``--json``). Unset ``--url``: an embedded
PostgreSQL and a throw-away key store. The helpers of ``tests/`` (the fake API server, projected tokens, test
certificates) are imported from the checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

SCRIPT = Path(__file__).resolve()
ROOT = SCRIPT.parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # cluster.py, certificates.py, service.py: the suite's own doubles

OPS = ("search", "save", "prefetch")
BOUND_MS = 1.5
BATCH = 10
WARMUP = 20
ENTRIES = 100
SUBQUERIES = 8
AGENT = "kagent/helper"
DIMENSIONS = 768


# -- the timed serve process (``--timed-serve OUT``) ------------------------------------------------------------


def timed_serve(out: Path) -> int:
    """``kagent-memory-governed serve`` with its handlers timed from inside; the samples go to ``out`` on exit."""
    from kagent_memory_governed.cli import main
    from kagent_memory_governed.embedding import OpenAIEmbedder
    from kagent_memory_governed.service import identity, server
    from kagent_memory_governed.store import Store

    samples: dict[str, list[float]] = defaultdict(list)

    def timing(owner: Any, name: str, label: Callable[..., str]) -> None:
        original = getattr(owner, name)

        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                samples[label(*args, **kwargs)].append(time.perf_counter() - started)

        setattr(owner, name, timed)

    timing(server.DataPlane, "_do", lambda self, method, *_, **__: f"handler {method}")
    # the servicer's own time: from the parsed message to its answer, before it is encoded (Admit, Search, ...)
    timing(server.DataPlane, "_answer", lambda self, call: f"servicer {_method(call.WhichOneof('request') or '')}")
    timing(identity.WorkloadIdentity, "agent", lambda *_: "workload identity")
    timing(Store, "admit", lambda *_, **__: "store admit")
    timing(Store, "search_many", lambda self, key, generation, embeddings, **_: f"store search_many x{len(embeddings)}")
    timing(Store, "write", lambda *_, **__: "store write")
    timing(OpenAIEmbedder, "__call__", lambda self, texts: f"embed x{len(texts)}")
    verified = server.DataPlane._verified

    def timed_verified(self: Any, metadata: Any, agent: Any) -> Any:
        started = time.perf_counter()
        try:
            return verified(self, metadata, agent)
        finally:
            samples["scope token"].append(time.perf_counter() - started)

    server.DataPlane._verified = timed_verified  # type: ignore[method-assign]

    try:
        return main(["serve"])
    finally:
        out.write_text(json.dumps(samples))


def _method(field: str) -> str:
    """The rpc a ``Call``'s request field names: ``record_turn`` -> ``RecordTurn``."""
    return "".join(part.capitalize() for part in field.split("_"))


def echo_serve(port_file: Path, certificate: Path, private_key: Path) -> int:
    """The floor of a call: a ``grpc.aio`` server over TLS with a unary method answering 512 bytes, whatever it is
    sent, and a bidirectional stream answering each message so, no servicer code; its port goes to ``port_file``.
    Runs until SIGTERM."""
    import signal

    import grpc

    chain, key = certificate.read_bytes(), private_key.read_bytes()

    async def serving() -> None:
        async def echo(request: bytes, context: Any) -> bytes:
            return b"x" * 512

        async def stream(requests: Any, context: Any) -> Any:
            async for _ in requests:
                yield b"x" * 512

        handler = grpc.method_handlers_generic_handler(
            "bench.Echo",
            {
                "Echo": grpc.unary_unary_rpc_method_handler(echo),
                "Stream": grpc.stream_stream_rpc_method_handler(stream),
            },
        )
        options = [("grpc.max_receive_message_length", 1 << 20), ("grpc.max_send_message_length", 1 << 20)]
        echo_server = grpc.aio.server(options=options)
        echo_server.add_generic_rpc_handlers((handler,))
        credentials = grpc.ssl_server_credentials([(key, chain)])
        port = echo_server.add_secure_port("127.0.0.1:0", credentials)
        await echo_server.start()
        await asyncio.to_thread(port_file.write_text, str(port))
        stopped = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
        await stopped.wait()
        await echo_server.stop(None)

    asyncio.run(serving())
    return 0


def start_mode(mode: str, answer: Path, *arguments: str) -> tuple[subprocess.Popen[bytes], str]:
    """This script's ``mode`` (``--echo-serve``, ``--embeddings-serve``) in a process of its own, once it has written
    ``answer`` (it listens then): the process and what it wrote (its port, its URL)."""
    answer.unlink(missing_ok=True)
    process = subprocess.Popen([sys.executable, str(SCRIPT), mode, str(answer), *arguments])
    deadline = time.monotonic() + 30
    while not (answer.exists() and answer.read_text()):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"{mode} did not start")
        time.sleep(0.05)
    return process, answer.read_text()


async def grpc_floor(
    ca: Path, certificate: Path, private_key: Path, metadata: list[tuple[str, str]], runs: int
) -> dict[str, float]:
    """Median ms of a unary call to ``echo_serve`` in another process, over TLS with the data plane's metadata, and of
    a message on an open stream carrying the same credentials in itself: a request of one embedding's size (3 KB) and
    of eight (24 KB)."""
    import grpc

    echo = (certificate.parent / "echo.port", str(certificate), str(private_key))
    process, listening = start_mode("--echo-serve", *echo)
    port = int(listening)
    try:
        credentials = grpc.ssl_channel_credentials(root_certificates=await asyncio.to_thread(ca.read_bytes))
        options = [("grpc.max_receive_message_length", 1 << 20), ("grpc.max_send_message_length", 1 << 20)]
        result: dict[str, float] = {}
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options) as channel:
            echo = channel.unary_unary("/bench.Echo/Echo")
            for label, size in (("3 KB", 3086), ("24 KB", 24632)):
                payload, seconds = b"\x01" * size, []
                for n in range(runs + 20):
                    started = time.perf_counter()
                    await echo(payload, metadata=metadata, timeout=5)
                    if n >= 20:
                        seconds.append(time.perf_counter() - started)
                result[f"gRPC floor, TLS, request {label}, reply 512 B"] = median_ms(seconds)
            streamed = channel.stream_stream("/bench.Echo/Stream")()
            credentials_bytes = sum(len(value) for _, value in metadata)  # a Call carries them in the message
            for label, size in (("3 KB", 3086), ("24 KB", 24632)):
                payload, seconds = b"\x01" * (size + credentials_bytes), []
                for n in range(runs + 20):
                    started = time.perf_counter()
                    await streamed.write(payload)
                    await streamed.read()
                    if n >= 20:
                        seconds.append(time.perf_counter() - started)
                result[f"gRPC floor, TLS, a message on an open stream {label}, reply 512 B"] = median_ms(seconds)
            # the same after both processes slept 5 ms, as the service does between a turn's calls when nothing
            # else keeps it busy: what waking a sleeping process costs on this machine
            payload, seconds = b"\x01" * (3086 + credentials_bytes), []
            for n in range(runs + 20):
                await asyncio.sleep(0.005)
                started = time.perf_counter()
                await streamed.write(payload)
                await streamed.read()
                if n >= 20:
                    seconds.append(time.perf_counter() - started)
            result["gRPC floor, TLS, a message on an open stream 3 KB, 5 ms idle, reply 512 B"] = median_ms(seconds)
            streamed.cancel()
        return result
    finally:
        process.terminate()
        process.wait(timeout=30)


# -- data, scopes, certificates ----------------------------------------------------------------------------------


class Data:
    """100 entries around 10 topics (768-d unit vectors, seed 7) and the queries of each operation, near entries so
    that every search finds its five hits above the runtime's 0.3."""

    def __init__(self, seed: int = 7) -> None:
        import numpy as np

        rng = np.random.default_rng(seed)

        def unit(rows: Any) -> Any:
            return rows / np.linalg.norm(rows, axis=-1, keepdims=True)

        centroids = unit(rng.normal(size=(10, DIMENSIONS)))
        noise = unit(rng.normal(size=(ENTRIES, DIMENSIONS))) * 0.3
        vectors = unit(centroids[np.arange(ENTRIES) % 10] + noise)
        self.entries = [
            (f"fact {n}: the user's preference number {n} about tea", vectors[n].tolist()) for n in range(ENTRIES)
        ]
        asked = unit(vectors[:SUBQUERIES] + unit(rng.normal(size=(SUBQUERIES, DIMENSIONS))) * 0.2)
        self.queries = [f"what does the user like, question {n}?" for n in range(SUBQUERIES)]
        self.fact = "the user prefers green tea in the afternoon"
        fact_vector = unit(vectors[0] + unit(rng.normal(size=DIMENSIONS)) * 0.2)
        self.vectors = {text: asked[n].tolist() for n, text in enumerate(self.queries)} | {
            self.fact: fact_vector.tolist()
        }

    def vector(self, text: str) -> list[float]:
        """What the embedding provider answers: the precomputed vector of a query or the fact."""
        return self.vectors[text]


def embeddings_serve(port_file: Path, vectors: str = "data") -> int:
    """The embedding provider of every arm: an OpenAI-compatible server answering ``Data``'s vectors (``vectors``
    ``data``) or the deterministic embedder's (``hashed``), in a process of its own (its threads take no time from the
    arms' event loops); its base URL goes to ``port_file``. Runs until SIGTERM."""
    import signal

    from kagent_memory_governed.testing import EmbeddingServer, embed

    server = EmbeddingServer(Data().vector if vectors == "data" else embed)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    port_file.write_text(server.url)
    server.serve_forever()
    return 0


def start_embeddings(directory: Path, vectors: str = "data") -> tuple[subprocess.Popen[bytes], str]:
    """``embeddings_serve`` in a process of its own, once it listens: the process and its base URL."""
    return start_mode("--embeddings-serve", directory / "embeddings.url", vectors)


@dataclass(frozen=True)
class Prepared:
    key: Any  # ScopeKey
    generation: int


def fresh_key() -> Any:
    from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey
    from kagent_memory_governed.testing import HOMESERVER

    return ScopeKey(
        Principal.parse(f"@u{uuid.uuid4().hex[:12]}:{HOMESERVER}", "native"),
        AgentId.parse(AGENT),
        ControlRoom.parse(f"!bench{uuid.uuid4().hex[:12]}:{HOMESERVER}"),
    )


async def prepare(store: Any, data: Data, count: int, entries: int) -> list[Prepared]:
    """``count`` fresh scopes (a sender each), consented, holding ``entries`` of the data's entries."""
    from kagent_memory_governed.store import NewFact

    facts = [NewFact(text, vector) for text, vector in data.entries[:entries]]
    gate = asyncio.Semaphore(4)

    async def one() -> Prepared:
        async with gate:
            key = fresh_key()
            generation = (await store.grant(key, purpose="bench", policy_version="v1")).generation
            if facts:
                await store.write(key, generation, facts)
            return Prepared(key, generation)

    return list(await asyncio.gather(*(one() for _ in range(count))))


def certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA of this run and the service's certificate for 127.0.0.1: (ca.pem, tls.crt, tls.key)."""
    from certificates import certificate
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    loopback = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
    pem = serialization.Encoding.PEM
    ca = certificate("bench CA", ca_key, "bench CA", ca_key, ca=True)
    leaf = certificate("governed-memory", leaf_key, "bench CA", ca_key, ca=False, names=[loopback], server=True)
    paths = directory / "ca.pem", directory / "tls.crt", directory / "tls.key"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(leaf.public_bytes(pem))
    paths[2].write_bytes(leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


# -- the service as a process ------------------------------------------------------------------------------------


@dataclass
class Serving:
    process: subprocess.Popen[bytes]
    url: str  # the data plane's, https://
    log: Path


def start_serve(command: list[str], env: dict[str, str], log: Path, ca: Path) -> Serving:
    """``command`` (``serve``) with ``env``, once its control API answers ready over HTTPS."""
    import httpx
    from service import PREFIX

    with log.open("w") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
    control = f"https://{env[PREFIX + 'CONTROL_ADDRESS']}"
    verify = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + 90
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"serve exited {process.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{control}/memory/ready", timeout=1, verify=verify).status_code == 200:
                break
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"serve not ready: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    return Serving(process, f"https://{env[PREFIX + 'DATA_PLANE_ADDRESS']}", log)


def stop_serve(serving: Serving) -> None:
    serving.process.terminate()
    try:
        serving.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        serving.process.kill()
        serving.process.wait()


# -- one run of one operation ------------------------------------------------------------------------------------


def unary_store(remote_store: Any) -> Any:
    """``RemoteStore`` making each call a unary call, as its client did before ``Exchange``, to the same ``serve``:
    the ``service unary`` arm, for comparison (refusals are not read: the benchmark meets none)."""
    import grpc

    from kagent_memory_governed.service import data_plane_pb2_grpc as pb_grpc
    from kagent_memory_governed.service import wire

    class UnaryStore(remote_store):  # type: ignore[misc,valid-type]
        async def _call(
            self, kind: str, request: Any, scope_token: str | None, *, deadline: float | None = None
        ) -> Any:
            loop = asyncio.get_running_loop()
            if self._channel is None or self._loop is not loop:
                self._channel, self._loop = self._open(), loop
                self._stub = pb_grpc.DataPlaneStub(self._channel)
            metadata = [(wire.AUTHORIZATION, f"Bearer {self._bearer()}")]
            if scope_token is not None:
                metadata.append((wire.SCOPE, scope_token))
            rpc = getattr(self._stub, _method(kind))
            try:
                return await rpc(request, metadata=metadata, timeout=deadline or self._deadline)
            except grpc.aio.AioRpcError as error:
                raise RuntimeError(f"unary {kind}: {error.code()}") from None

    return UnaryStore


@dataclass
class Arm:
    name: str
    service: Any  # GovernedMemoryService over the arm's plane


def scope_token(bridge: Any, prepared: Prepared) -> str:
    key = prepared.key
    return bridge.sign(
        time.time(), sub=key.principal.mxid, aud=str(key.agent), room=key.room.room_id, gen=prepared.generation
    )


def request_scope(bridge: Any, prepared: Prepared) -> Any:
    """The request's scope as the runtime holds it: the key and generation, and the token the bridge signed."""
    from kagent_memory_governed.service.plane import RequestScope

    return RequestScope(prepared.key, prepared.generation, token=scope_token(bridge, prepared))


async def operation(arm: Arm, op: str, prepared: Prepared, bridge: Any, data: Data) -> float:
    """Seconds of one ``op`` as the runtime runs it (``GovernedMemoryService``), the scope token signed before."""
    from kagent_memory_governed.errors import Operation

    scope = request_scope(bridge, prepared)
    started = time.perf_counter()
    if op == "search":
        await arm.service.search(scope, data.queries[:1], Operation.LOAD)
    elif op == "save":
        await arm.service.save(scope, [data.fact], Operation.SAVE)
    else:
        await arm.service.search(scope, data.queries, Operation.PREFETCH)
    return time.perf_counter() - started


def median_ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1000


def p95_ms(seconds: list[float]) -> float:
    return statistics.quantiles(seconds, n=20)[-1] * 1000 if len(seconds) > 1 else seconds[0] * 1000


def held(entries: int) -> dict[str, int]:
    """The entries each operation's scope holds: ``entries``, one fewer for a save (which adds one)."""
    return {"search": entries, "save": entries - 1, "prefetch": entries}


async def side_by_side(
    arms: list[Arm], prep: Any, bridge: Any, data: Data, runs: int, warmup: int = WARMUP, entries: int = ENTRIES
) -> dict[str, Any]:
    """Every operation on every arm, ``runs`` timed runs after ``warmup``, in rotating batches, on scopes holding
    ``entries`` entries."""
    holding = held(entries)
    scopes: dict[tuple[str, str], list[Prepared]] = {}
    started = time.perf_counter()
    for op in OPS:
        for arm in arms:
            scopes[op, arm.name] = await prepare(prep, data, warmup + runs, holding[op])
    prepared_s = time.perf_counter() - started
    samples: dict[str, dict[str, list[float]]] = {op: {arm.name: [] for arm in arms} for op in OPS}
    load_before = os.getloadavg()
    for phase, total in (("warm-up", warmup), ("timed", runs)):
        for batch in range(0, total, BATCH):
            for op in OPS:
                rotation = (batch // BATCH) % len(arms)
                for arm in arms[rotation:] + arms[:rotation]:
                    for _ in range(min(BATCH, total - batch)):
                        seconds = await operation(arm, op, scopes[op, arm.name].pop(), bridge, data)
                        if phase == "timed":
                            samples[op][arm.name].append(seconds)
    load_after = os.getloadavg()
    rows: dict[str, Any] = {}
    for op in OPS:
        local = median_ms(samples[op]["in-process"])
        row = {
            name: {"median_ms": median_ms(s), "p95_ms": p95_ms(s), "runs": len(s)} for name, s in samples[op].items()
        }
        for name in row:
            if name != "in-process":
                row[name]["added_ms"] = row[name]["median_ms"] - local
                row[name]["met"] = row[name]["median_ms"] <= local + BOUND_MS
        row["bound_ms"] = local + BOUND_MS
        row["met"] = row["service"]["median_ms"] <= local + BOUND_MS
        rows[op] = row
    return {"prepared_s": prepared_s, "load_average": {"before": load_before, "after": load_after}, "operations": rows}


# -- where the added time goes -----------------------------------------------------------------------------------


async def call_by_call(
    store: Any,
    embedder: Any,
    client: Any,
    prep: Any,
    bridge: Any,
    data: Data,
    runs: int,
    warm: int,
    entries: int = ENTRIES,
) -> dict[str, Any]:
    """Each operation timed on a fresh scope, the two sides taking turns: in process, step by step as the plane
    does them (the admission, the embedding, the work), and through the timed service, its one call (the client's
    view; the service's own view is in its samples). ``runs`` after ``warm`` of warm-up."""
    from kagent_memory_governed.errors import Operation
    from kagent_memory_governed.store import NewFact

    admitted = {
        "search": (Operation.LOAD, True, 1),
        "save": (Operation.SAVE, True, 1),
        "prefetch": (Operation.PREFETCH, False, 8),
    }
    holding = held(entries)
    samples: dict[str, list[float]] = defaultdict(list)

    async def timed(label: str, work: Awaitable[Any], keep: bool) -> Any:
        started = time.perf_counter()
        done = await work
        if keep:
            samples[label].append(time.perf_counter() - started)
        return done

    for op in OPS:
        operation_, explicit, units = admitted[op]
        texts = [data.fact] if op == "save" else data.queries if op == "prefetch" else data.queries[:1]
        scopes = {side: await prepare(prep, data, warm + runs, holding[op]) for side in ("in-process", "service")}
        for n in range(warm + runs):
            keep = n >= warm
            prepared = scopes["in-process"][n]
            key, generation = prepared.key, prepared.generation
            admit = store.admit(key, generation, operation_, units=units, explicit=explicit)
            await timed(f"{op} in-process: admit", admit, keep)
            vectors = await timed(f"{op} in-process: embed", embedder(texts), keep)
            if op == "save":
                work = store.write(key, generation, [NewFact(data.fact, vectors[0])])
            else:
                work = store.search_many(key, generation, vectors, top_k=5, min_score=0.3)
            await timed(f"{op} in-process: {'write' if op == 'save' else 'search_many'}", work, keep)
            scope = request_scope(bridge, scopes["service"][n])
            if op == "save":
                call = client.remember(scope, texts, operation_)
            else:
                call = client.recall(scope, texts, operation_)
            await timed(f"{op} service: {'Remember' if op == 'save' else 'Recall'}", call, keep)
    for n in range(warm + runs):
        await timed("service Policy", client.refresh_policy(), n >= warm)
    return {label: median_ms(seconds) for label, seconds in samples.items()}


def costs(bridge: Any, token_file: Path, runs: int = 2000) -> dict[str, float]:
    """In this process: what one call's verification and encoding cost, median µs of ``runs``."""
    from kagent_memory_governed import clock
    from kagent_memory_governed.assertion import Trust, verify
    from kagent_memory_governed.scope import AgentId
    from kagent_memory_governed.service import data_plane_pb2 as pb
    from kagent_memory_governed.service import messages, remote, wire
    from kagent_memory_governed.store import Hit
    from kagent_memory_governed.testing import HOMESERVER, ISSUER

    data = Data()
    prepared = Prepared(fresh_key(), 1)
    token = scope_token(bridge, prepared)
    trust = Trust(bridge.private_key.public_key(), ISSUER, AgentId.parse(AGENT), HOMESERVER)
    result: dict[str, float] = {}

    def micro(label: str, work: Callable[[], Any]) -> None:
        seconds = []
        for _ in range(runs):
            started = time.perf_counter()
            work()
            seconds.append(time.perf_counter() - started)
        result[label] = statistics.median(seconds) * 1e6

    micro(
        "scope token: assertion.verify (Ed25519)",
        lambda: verify(
            token, trust, now=clock.now(), purpose="scope", user_id=(wire.claims_unverified(token) or {}).get("sub")
        ),
    )
    micro("scope token: claims read unverified (client)", lambda: remote._matching(token, prepared.key, 1))
    now = datetime.now(UTC)
    hits = [Hit(uuid.uuid4(), data.entries[n][0], 0.9, now, now) for n in range(5)]
    for count in (1, SUBQUERIES):
        queries = data.queries[:count]
        raw = pb.RecallRequest(queries=queries, operation="load").SerializeToString()
        micro(
            f"RecallRequest x{count}: build + serialize (client)",
            lambda queries=queries: pb.RecallRequest(queries=queries, operation="load").SerializeToString(),
        )
        micro(
            f"RecallRequest x{count}: parse + queries (service)",
            lambda raw=raw: list(pb.RecallRequest.FromString(raw).queries),
        )
        reply = pb.SearchReply(results=[pb.Hits(hits=[messages.hit(h) for h in hits]) for _ in range(count)])
        answer = reply.SerializeToString()
        micro(
            f"SearchReply x{count} of 5 hits: build + serialize (service)",
            lambda count=count: pb.SearchReply(
                results=[pb.Hits(hits=[messages.hit(h) for h in hits]) for _ in range(count)]
            ).SerializeToString(),
        )
        micro(
            f"SearchReply x{count} of 5 hits: parse + hits (client)",
            lambda answer=answer: [
                [remote._hit(h) for h in result.hits] for result in pb.SearchReply.FromString(answer).results
            ],
        )
        result[f"RecallRequest x{count} bytes"] = float(len(raw))
    micro("identity token: file read (client, each call)", lambda: token_file.read_text(encoding="ascii").strip())
    return result


async def identity_costs(kube: Any, key: Any, directory: Path, runs: int = 300) -> dict[str, float]:
    """``WorkloadIdentity.agent`` for a token it verified before (kept by digest) and for a fresh one (RS256 and the
    claims), median µs, against the fake API server's JWKS."""
    from cluster import AUDIENCE, ISSUER
    from service import HELPER, write_projected

    from kagent_memory_governed.service.identity import WorkloadIdentity

    own = directory / "identity-own-token"
    own.write_text("bench-own-token\n")
    identity = WorkloadIdentity(
        issuer=ISSUER, audience=AUDIENCE, api_server=kube.url, ca_file=kube.ca, token_file=own, agents={HELPER: HELPER}
    )
    path = directory / "identity-token"
    try:
        kept, fresh = [], []
        for n in range(runs + 1):
            write_projected(path, key, HELPER)
            metadata = {"authorization": f"Bearer {path.read_text().strip()}"}
            started = time.perf_counter()
            await identity.agent(metadata)
            if n:  # the first fetched the keys
                fresh.append(time.perf_counter() - started)
            started = time.perf_counter()
            await identity.agent(metadata)
            kept.append(time.perf_counter() - started)
    finally:
        await identity.aclose()
    return {
        "workload identity: a kept token (digest lookup)": statistics.median(kept) * 1e6,
        "workload identity: a fresh token (RS256 + claims)": statistics.median(fresh) * 1e6,
    }


def decomposition(calls: dict[str, float], served: dict[str, list[float]], runs: int, warm: int) -> dict[str, Any]:
    """Each operation's added time, term by term (ms): the client's view of each call (``calls``) against the
    service's own (``served``, in the order ``call_by_call`` made them: per operation ``warm`` calls of warm-up, then
    ``runs``). The terms add up to the added time by construction; ``rest`` is what the timers inside do not name."""

    def chunk(label: str, ops: tuple[str, ...], op: str) -> float:
        seconds = served.get(label, [])
        index = ops.index(op)
        part = seconds[index * (warm + runs) + warm : (index + 1) * (warm + runs)]
        return median_ms(part) if part else float("nan")

    def tail(label: str) -> float:
        seconds = served.get(label, [])[-runs:]
        return median_ms(seconds) if seconds else float("nan")

    identity, token = median_ms(served["workload identity"]), median_ms(served["scope token"])
    policy = tail("handler policy")
    result: dict[str, Any] = {
        "service": {label: median_ms(seconds) for label, seconds in sorted(served.items())},  # every call, warm-up too
        "identity_ms": identity,
        "scope_token_ms": token,
        "policy": {
            "client_ms": calls["service Policy"],
            "handler_ms": policy,
            "transport_ms": calls["service Policy"] - policy,
        },
    }
    for op in OPS:
        work = "write" if op == "save" else "search_many"
        call = "Remember" if op == "save" else "Recall"
        count = 1 if op in ("search", "save") else SUBQUERIES
        local = {step: calls[f"{op} in-process: {step}"] for step in ("admit", "embed", work)}
        client = calls[f"{op} service: {call}"]
        calling = ("save",) if op == "save" else ("search", "prefetch")  # the operations each call served, in order
        handler = chunk(f"handler {call.lower()}", calling, op)
        servicer = chunk(f"servicer {call}", calling, op) if f"servicer {call}" in served else handler
        admission, embedding = chunk("store admit", OPS, op), tail(f"embed x{count}")
        served_work = tail("store write" if op == "save" else f"store search_many x{count}")
        terms = {
            "transport, 1 call": client - servicer,
            "servicer outside the handler": servicer - handler,
            "identity + scope token": identity + token,
            "admission, service - in-process": admission - local["admit"],
            "embedding, service - in-process": embedding - local["embed"],
            f"{work}, service - in-process": served_work - local[work],
            "rest of the handler": handler - identity - token - admission - embedding - served_work,
        }
        result[op] = {
            "in_process": local,
            "client": {call: client},
            "handlers": {call: handler, "admission": admission, "embedding": embedding, work: served_work},
            "added_ms": client - sum(local.values()),
            "terms_ms": terms,
        }
    return result


# -- the run -----------------------------------------------------------------------------------------------------


async def run(
    url: str | None,
    *,
    key_store: Path | None = None,
    runs: int = 300,
    breakdown_runs: int = 100,
    same_loop: bool = True,
    warmup: int = WARMUP,
    entries: int = ENTRIES,
    micro_runs: int = 2000,
    serve_trees: dict[str, Path] | None = None,
    work: Path | None = None,
) -> dict[str, Any]:
    """The whole benchmark; returns what ``main`` prints and writes. ``key_store``: the directory of the local key
    store bound to ``url``'s database (default: a fresh one, for a database never migrated or the embedded one).
    ``entries``: what each operation's scope holds (at most ``ENTRIES``); ``micro_runs``: the runs of each cost
    measured in this process (verification, encoding; at most 300 of the workload identity's).
    ``serve_trees``: more service arms, ``service NAME``, each a serve process importing the package from its tree
    (``PYTHONPATH``), such as this tree with a patch applied: side by side with the rest, in the same batches."""
    import grpc  # noqa: F401  (loaded before the clock starts)
    from cluster import rsa_key, serving
    from service import environment, rotated

    from kagent_memory_governed.adk.service import GovernedMemoryService
    from kagent_memory_governed.embedded import start
    from kagent_memory_governed.embedding import Embedders, EmbeddingModel, OpenAIEmbedder
    from kagent_memory_governed.keys import LocalKeyStore
    from kagent_memory_governed.policy import Policy
    from kagent_memory_governed.service import server
    from kagent_memory_governed.service.identity import WorkloadIdentity
    from kagent_memory_governed.service.remote import RemoteStore
    from kagent_memory_governed.store import Store
    from kagent_memory_governed.testing import HOMESERVER, ISSUER, Bridge

    directory = work or Path(tempfile.mkdtemp(prefix="data-plane-bench-"))
    directory.mkdir(parents=True, exist_ok=True)
    url = url or start(directory / "pg")
    key_store = key_store or directory / "keys"
    data, bridge = Data(), Bridge()
    (directory / "tls").mkdir(exist_ok=True)
    (directory / "cluster").mkdir(exist_ok=True)
    ca, cert, tls_key = certificates(directory / "tls")
    stores: list[Any] = []
    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "package": str(Path(sys.modules["kagent_memory_governed"].__file__ or "").parent),
        "runs": runs,
        "warmup": warmup,
        "breakdown_runs": breakdown_runs,
        "entries": entries,
        "tls": True,
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),  # before this run's own work: the machine's other load
    }

    def connect() -> Any:
        store = Store.connect(url, Policy(), keys=LocalKeyStore(key_store))
        stores.append(store)
        return store

    prep = connect()  # the bridge's side: grants and fills the scopes; its keyrings are no arm's
    await prep.migrate()
    with contextlib.ExitStack() as stack:
        kube = stack.enter_context(serving(directory / "cluster"))
        kube_key = rsa_key()
        kube.keys = [kube_key]
        pod_token = stack.enter_context(rotated(directory / "pod-token", kube_key, AGENT))
        provider, provider_url = start_embeddings(directory)
        stack.callback(provider.wait, 30)
        stack.callback(provider.terminate)
        model = EmbeddingModel(url=provider_url, model="bench-768")  # every arm's, the same provider
        (directory / "bench-embeddings.json").write_text(json.dumps({"*": model.model_dump(mode="json")}))
        embedder = OpenAIEmbedder(model)  # the in-process arm's, the runtime's own
        extra = {
            "KAGENT_GOVERNED_MEMORY_KEY_STORE": f"file://{key_store}",
            "KAGENT_GOVERNED_MEMORY_TLS_CERT": str(cert),
            "KAGENT_GOVERNED_MEMORY_TLS_KEY": str(tls_key),
            "KAGENT_GOVERNED_MEMORY_EMBEDDINGS": str(directory / "bench-embeddings.json"),
        }
        planes: list[Any] = []
        clients: list[Any] = [embedder]
        try:
            env = environment(directory, bridge, url, kube, **extra)
            command = [str(Path(sys.executable).parent / "kagent-memory-governed"), "serve"]
            serve = start_serve(command, env, directory / "serve.log", ca)
            others: dict[str, Serving] = {}
            try:
                for name, tree in (serve_trees or {}).items():
                    tree_env = environment(directory, bridge, url, kube, **extra, PYTHONPATH=str(tree))
                    others[name] = start_serve(command, tree_env, directory / f"serve-{name}.log", ca)
                client = RemoteStore.connect(serve.url, token_file=pod_token, ca_file=ca)
                clients.append(client)
                await client.refresh_policy()
                local = connect()
                arms = [
                    Arm("in-process", GovernedMemoryService(local.plane(embedder))),
                    Arm("service", GovernedMemoryService(client)),
                ]
                if same_loop:
                    from cluster import AUDIENCE
                    from cluster import ISSUER as KUBE_ISSUER
                    from service import HELPER

                    own = directory / "same-loop-own-token"
                    own.write_text("bench-own-token\n")
                    identity = WorkloadIdentity(
                        issuer=KUBE_ISSUER,
                        audience=AUDIENCE,
                        api_server=kube.url,
                        ca_file=kube.ca,
                        token_file=own,
                        agents={HELPER: HELPER},
                    )
                    plane = server.DataPlane(
                        connect(),
                        identity,
                        public_key=bridge.private_key.public_key(),
                        issuer=ISSUER,
                        homeserver=HOMESERVER,
                        embedders=Embedders({"*": model}),
                    )
                    grpc_server, port = server.build(
                        plane, "127.0.0.1:0", tls=server.ServerTLS(cert.read_bytes(), tls_key.read_bytes())
                    )
                    await grpc_server.start()
                    planes.append((grpc_server, identity))
                    near = RemoteStore.connect(f"https://127.0.0.1:{port}", token_file=pod_token, ca_file=ca)
                    clients.append(near)
                    arms.append(Arm("same loop", GovernedMemoryService(near)))
                unary = unary_store(RemoteStore).connect(serve.url, token_file=pod_token, ca_file=ca)
                clients.append(unary)
                arms.append(Arm("service unary", GovernedMemoryService(unary)))
                for name, other in others.items():
                    patched = RemoteStore.connect(other.url, token_file=pod_token, ca_file=ca)
                    clients.append(patched)
                    arms.append(Arm(f"service {name}", GovernedMemoryService(patched)))
                result["serve_trees"] = {name: str(tree) for name, tree in (serve_trees or {}).items()}
                result["side_by_side"] = await side_by_side(arms, prep, bridge, data, runs, warmup, entries)
            finally:
                stop_serve(serve)
                for other in others.values():
                    stop_serve(other)
            if breakdown_runs:
                samples = directory / "served.json"
                command = [sys.executable, str(SCRIPT), "--timed-serve", str(samples)]
                timed = start_serve(command, env, directory / "timed-serve.log", ca)
                try:
                    client = RemoteStore.connect(timed.url, token_file=pod_token, ca_file=ca)
                    clients.append(client)
                    load_before = os.getloadavg()
                    calls = await call_by_call(
                        connect(), embedder, client, prep, bridge, data, breakdown_runs, min(warmup, 10), entries
                    )
                    load_after = os.getloadavg()
                finally:
                    stop_serve(timed)
                served = json.loads(samples.read_text())
                breakdown = decomposition(calls, served, breakdown_runs, min(warmup, 10))
                breakdown["calls"] = calls
                breakdown["load_average"] = {"before": load_before, "after": load_after}
                breakdown["costs_us"] = costs(bridge, pod_token, micro_runs) | await identity_costs(
                    kube, kube_key, directory, min(micro_runs, 300)
                )
                metadata = [
                    ("authorization", f"Bearer {pod_token.read_text().strip()}"),
                    ("x-memory-scope", scope_token(bridge, Prepared(fresh_key(), 1))),
                ]
                breakdown["floor_ms"] = await grpc_floor(ca, cert, tls_key, metadata, max(breakdown_runs, 100))
                result["breakdown"] = breakdown
        finally:
            for client in clients:
                await (client.aclose() if client is embedder else client.close())
            for grpc_server, identity in planes:
                await grpc_server.stop(None)
                await identity.aclose()
            for store in stores:
                await store.close()
    if work is None:
        shutil.rmtree(directory, ignore_errors=True)
    return result


def table(result: dict[str, Any]) -> list[str]:
    side = result["side_by_side"]
    rows = side["operations"]
    arms = [name for name in rows[OPS[0]] if isinstance(rows[OPS[0]][name], dict) and name != "in-process"]
    extra = [name for name in arms if name.startswith("service ")]
    arms = ["in-process", *[name for name in arms if name not in extra]]
    before, after = side["load_average"]["before"], side["load_average"]["after"]
    lines = [
        f"median ms of {result['runs']} runs each (after {result['warmup']} of warm-up), scopes of"
        f" {result['entries']} entries, TLS on loopback,"
        f" {result['cpus']} CPUs; load average {result['load_average_at_start'][0]:.2f} at the start of the run,"
        f" {before[0]:.2f} before the timed runs, {after[0]:.2f} after;"
        f" {side['prepared_s']:.0f} s to prepare the scopes",
        f"{'operation':10} {'in-process':>11} {'service':>9} {'added':>7} {'bound':>7}  {'met':4}"
        + ("".join(f" {name + ' ms':>13} {'added':>7}" for name in arms[2:]))
        + f"  {'p95 in-process':>14} {'p95 service':>11}",
    ]
    for op in OPS:
        row = rows[op]
        line = (
            f"{op:10} {row['in-process']['median_ms']:11.3f} {row['service']['median_ms']:9.3f}"
            f" {row['service']['added_ms']:7.3f} {row['bound_ms']:7.3f}  {'yes' if row['met'] else 'NO':4}"
        )
        for name in arms[2:]:
            line += f" {row[name]['median_ms']:13.3f} {row[name]['added_ms']:7.3f}"
        lines.append(line + f"  {row['in-process']['p95_ms']:14.3f} {row['service']['p95_ms']:11.3f}")
    if extra:
        lines.append("more service arms, in the same batches (median ms, added, met):")
        lines.append(f"  {'arm':34}" + "".join(f" {op:>22}" for op in OPS))
        for name in ["service", *extra]:
            cells = ""
            for op in OPS:
                cell = rows[op][name]
                cells += f" {cell['median_ms']:8.3f} {cell['added_ms']:+7.3f} {'yes' if cell['met'] else 'NO':>5}"
            lines.append(f"  {name:34}{cells}")
    breakdown = result.get("breakdown")
    if not breakdown:
        return lines
    load = breakdown["load_average"]
    lines.append(
        f"call by call (median ms of {result['breakdown_runs']} each; a second serve process, its handlers timed from"
        f" inside; load average {load['before'][0]:.2f} before, {load['after'][0]:.2f} after):"
    )
    policy = breakdown["policy"]
    lines.append(
        f"  Policy (workload identity only): client {policy['client_ms']:.3f} = handler {policy['handler_ms']:.3f}"
        f" + transport {policy['transport_ms']:.3f}; per call: workload identity {breakdown['identity_ms']:.3f},"
        f" scope token {breakdown['scope_token_ms']:.3f}"
    )
    for op in OPS:
        b = breakdown[op]
        local = " + ".join(f"{name} {value:.3f}" for name, value in b["in_process"].items())
        client = " + ".join(f"{name} {value:.3f}" for name, value in b["client"].items())
        handlers = ", ".join(f"{name} {value:.3f}" for name, value in b["handlers"].items())
        lines.append(f"  {op}: in-process {local}; service {client}; added {b['added_ms']:.3f}")
        lines.append(f"    inside the service: {handlers}")
        lines.append("    added = " + " + ".join(f"{name} {value:.3f}" for name, value in b["terms_ms"].items()))
    for label, value in breakdown.get("floor_ms", {}).items():
        lines.append(f"  {label}: {value:.3f} ms (another process; the data plane's metadata)")
    lines.append("  in this process (median µs):")
    for label, value in breakdown["costs_us"].items():
        lines.append(f"    {label:58} {value:10.1f}")
    return lines


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="postgresql+asyncpg://...; unset: an embedded PostgreSQL")
    parser.add_argument("--key-store", help="file:///path of the local key store bound to --url's database")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=WARMUP, help="runs of each operation on each arm, untimed, first")
    parser.add_argument("--breakdown-runs", type=int, default=100, help="0: no breakdown")
    parser.add_argument("--no-same-loop", action="store_true", help="leave out the same-loop arm")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "data_plane.json")
    parser.add_argument("--work", type=Path, help="keep the run's directory (logs, the timed samples) here")
    parser.add_argument(
        "--serve-tree",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="one more service arm, a serve process importing the package from PATH (a patched tree); repeatable",
    )
    args = parser.parse_args()
    key_store = Path(urlsplit(args.key_store).path) if args.key_store else None
    result = await run(
        args.url,
        key_store=key_store,
        runs=args.runs,
        breakdown_runs=args.breakdown_runs,
        same_loop=not args.no_same_loop,
        warmup=args.warmup,
        serve_trees={name: Path(path) for name, _, path in (tree.partition("=") for tree in args.serve_tree)},
        work=args.work,
    )
    for line in table(result):
        print(line)  # noqa: T201
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--timed-serve":
        sys.exit(timed_serve(Path(sys.argv[2])))
    if len(sys.argv) == 4 and sys.argv[1] == "--embeddings-serve":
        sys.exit(embeddings_serve(Path(sys.argv[2]), sys.argv[3]))
    if len(sys.argv) == 5 and sys.argv[1] == "--echo-serve":
        sys.exit(echo_serve(*(Path(argument) for argument in sys.argv[2:])))
    asyncio.run(main())
