"""What memory costs a turn (#35): upstream's real ``KAgentApp`` under 12 concurrent users, a memory-enabled turn
against a memory-free one at the median, with the store in-process and through the memory service, in one run.

    python benchmarks/turns.py [--url postgresql+asyncpg://... --key-store file:///path] [--users 12]
                               [--turns 25] [--rounds 4] [--session-turns 5] [--json out.json]

**The agent** is what the runtime tests build (``tests/runtime/test_runtime.py``): ``testing.build_app`` with a
``ScriptedModel`` (it answers at once: no provider, no tool call; a summary answers one fact) and the local
embedder (hashed words) behind an OpenAI-compatible server in a process of its own, the same provider for both arms
(in process the runtime calls it, through the service the service does), governed memory installed by
``install()``, A2A ``message/send`` requests sent as the bridge sends them (``testing.A2AClient`` over
``httpx.ASGITransport``, so the HTTP server is left out). The model answering at once makes every figure here the
worst case for memory's share of a turn: with a real model a turn takes seconds, and what memory adds is the same
milliseconds.

**Turns**: each of ``--users`` users (a sender and a control room of their own) sends ``--turns`` turns one after
another, all users at once, in sessions of ``--session-turns`` turns. A *memory-free* turn carries no
``X-Memory-Scope``. A *memory-enabled* turn carries a valid one (signed by a bridge double just before it is sent)
for a consented scope holding 100 entries: every turn verifies it and records the turn (``RecordTurn``); the first
turn of a session prefetches (its two sentences, two subqueries over the 100 entries, found facts added to the
instruction); the fifth admitted turn of a session starts an auto-save in the background (collect the turns, admit
the summary, the model's summary, then admit, embed and write its one fact in one call, which is already stored:
deduplicated), which
competes with the other users' turns as it would in a pod. Phases of free and enabled turns alternate (``--rounds``
of each, in the order free-enabled, enabled-free, ...); the auto-saves of a phase are drained before the next
starts. Each round has fresh scopes, so neither the sender's rate nor the scope's hourly ceiling is met.

**Arms**: ``install()`` is once per process, so each arm is a process of its own (this script, ``--arm``):
``in-process`` (the runtime holds the ``Store``) and ``service`` (the runtime reaches ``kagent-memory-governed serve``,
a process of its own, through ``RemoteStore`` over TLS on loopback, named by a projected service-account token that
the service verifies against a fake API server's JWKS, as ``benchmarks/data_plane.py`` runs it). Both over one
PostgreSQL and one key store; on one machine, so the service's process and the database share its cores with the
runtime.

Prints, per arm, the memory-free and memory-enabled medians, their ratio against the bound (1.1x), and the first
turns of sessions (prefetch) and the auto-saving turns apart; writes ``benchmarks/results/turns.json``. Each arm
also counts the memory work it did (prefetches and their hits, turns recorded, auto-saves written, refusals), so a
run in which memory silently did nothing shows as such.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

BENCHMARKS = Path(__file__).resolve().parent
ROOT = BENCHMARKS.parent
sys.path[:0] = [str(BENCHMARKS), str(ROOT / "tests")]  # data_plane's serve process; the suite's cluster doubles

BOUND = 1.1
ENTRIES = 100
MESSAGE = "Which green tea do I like in the afternoon? Please suggest one for today."
FACTS = [f"the user likes green tea number {n} in the afternoon" for n in range(ENTRIES)]
SUMMARY = json.dumps([FACTS[0]])  # auto-save's one fact, already stored: written as a duplicate, not again


# -- one arm: this script with ``--arm CONFIG`` ------------------------------------------------------------------


async def arm(config: dict[str, Any]) -> dict[str, Any]:
    """The turns of one arm, in this process: governed memory installed over the arm's store."""
    os.environ.setdefault("KAGENT_URL", "http://controller.invalid")
    os.environ.setdefault("KAGENT_NAMESPACE", "kagent")
    os.environ.setdefault("KAGENT_NAME", "helper")
    import httpx
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from kagent_memory_governed import install
    from kagent_memory_governed.embedding import EmbeddingModel, OpenAIEmbedder
    from kagent_memory_governed.errors import GovernedMemoryError, Operation
    from kagent_memory_governed.settings import Settings
    from kagent_memory_governed.testing import HOMESERVER, ISSUER, A2AClient, Bridge, ScriptedModel, build_app

    private_key = load_pem_private_key(await asyncio.to_thread(Path(config["bridge_key"]).read_bytes), password=None)
    bridge = Bridge(private_key=private_key)  # type: ignore[arg-type]
    trust = {"bridge_public_key": bridge.public_pem, "bridge_issuer": ISSUER, "homeserver": HOMESERVER}
    if config["arm"] == "service":
        settings = Settings(
            **trust,
            service_url=config["service_url"],
            service_ca=Path(config["service_ca"]),
            service_token=Path(config["service_token"]),
            key_store=None,
        )
        runtime = install(settings=settings)  # the service embeds, with the same provider
        assert runtime.remote
    else:
        from kagent_memory_governed.keys import LocalKeyStore
        from kagent_memory_governed.policy import Policy
        from kagent_memory_governed.store import Store

        store = Store.connect(config["url"], Policy(), keys=LocalKeyStore(Path(config["key_store"])))
        model = EmbeddingModel(url=config["embedding_url"], model="local-hash-768")
        runtime = install(settings=Settings(**trust), store=store, embedder=OpenAIEmbedder(model))
        assert not runtime.remote
    counts: Counter[str] = Counter()
    service = runtime.service
    search, save, record = service.search, service.save, service.plane.record

    async def counted_search(scope: Any, queries: list[str], operation: Operation) -> Any:
        try:
            found = await search(scope, queries, operation)
        except GovernedMemoryError as refused:
            counts[f"{operation.value} refused: {refused.reason.value}"] += 1
            raise
        counts[f"{operation.value}"] += 1
        counts[f"{operation.value} hits"] += len(found)
        return found

    async def counted_save(scope: Any, texts: Any, operation: Operation) -> None:
        try:
            await save(scope, texts, operation)
        except GovernedMemoryError as refused:
            counts[f"{operation.value} refused: {refused.reason.value}"] += 1
            raise
        counts[f"{operation.value}"] += 1

    async def counted_record(*args: Any, **kwargs: Any) -> int:
        waiting = await record(*args, **kwargs)
        counts["turn recorded"] += 1
        return waiting

    service.search, service.save = counted_search, counted_save  # type: ignore[method-assign]
    service.plane.record = counted_record  # type: ignore[method-assign]
    model = ScriptedModel().script(summary=SUMMARY)
    if config.get("model_ms"):  # a provider's latency: the model waits (it does not compute) before each answer
        delay, answer = config["model_ms"] / 1000, model.generate_content_async

        async def waiting(llm_request: Any, stream: bool = False) -> Any:
            await asyncio.sleep(delay)
            async for response in answer(llm_request, stream=stream):
                yield response

        object.__setattr__(model, "generate_content_async", waiting)
    app = build_app(model)
    samples: dict[str, list[float]] = {"free": [], "enabled": [], "enabled first": [], "enabled auto-save": []}
    session_turns = config["session_turns"]

    async def user(client: Any, mxid: str, scope: dict[str, Any] | None, turns: int, keep: bool) -> None:
        context = ""
        for turn in range(turns):
            if turn % session_turns == 0:
                context = uuid.uuid4().hex
            header = None
            if scope is not None:
                header = bridge.sign(time.time(), sub=mxid, room=scope["room"], gen=scope["generation"])
            started = time.perf_counter()
            answer = await client.send(MESSAGE, context_id=context, user=mxid, scope=header)
            seconds = time.perf_counter() - started
            assert answer["result"]["status"]["state"] == "completed", answer
            if not keep:
                continue
            samples["free" if scope is None else "enabled"].append(seconds)
            if scope is not None and turn % session_turns == 0:
                samples["enabled first"].append(seconds)
            if scope is not None and turn % session_turns == session_turns - 1:
                samples["enabled auto-save"].append(seconds)

    profiles: dict[bool, Any] = {}
    if config.get("profile"):
        import cProfile

        profiles = {False: cProfile.Profile(), True: cProfile.Profile()}

    async def phase(client: Any, enabled: bool, scopes: list[dict[str, Any]], turns: int, keep: bool) -> float:
        profile = profiles.get(enabled) if keep else None
        if profile is not None:
            profile.enable()
        try:
            return await timed_phase(client, enabled, scopes, turns, keep)
        finally:
            if profile is not None:
                profile.disable()

    async def timed_phase(client: Any, enabled: bool, scopes: list[dict[str, Any]], turns: int, keep: bool) -> float:
        started = time.perf_counter()
        await asyncio.gather(
            *(
                user(
                    client,
                    scope["mxid"] if enabled else f"@free{n}x{uuid.uuid4().hex[:8]}:{HOMESERVER}",
                    scope if enabled else None,
                    turns,
                    keep,
                )
                for n, scope in enumerate(scopes)
            )
        )
        await service.drain()  # this phase's auto-saves, before the next phase starts
        return time.perf_counter() - started

    phases: list[dict[str, Any]] = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
        client = A2AClient(http)
        await phase(client, False, config["warm"], session_turns, False)
        await phase(client, True, config["warm"], session_turns, False)
        counts.clear()
        warm_summaries = len(model.summaries)
        for number, scopes in enumerate(config["rounds"]):
            order = (False, True) if number % 2 == 0 else (True, False)
            for enabled in order:
                load = os.getloadavg()[0]
                seconds = await phase(client, enabled, scopes, config["turns"], True)
                phases.append({"enabled": enabled, "seconds": seconds, "load_average": load})
    for enabled, profile in profiles.items():  # cProfile of this arm's timed phases: free, enabled
        profile.dump_stats(Path(config["profile"]) / f"{config['arm']}-{'enabled' if enabled else 'free'}.pstats")
    if config["arm"] != "service":
        await runtime.store.close()
    counts["summaries"] = len(model.summaries) - warm_summaries
    return {"samples": samples, "counts": dict(counts), "phases": phases}


# -- the run -----------------------------------------------------------------------------------------------------


def run_arm(name: str, config: dict[str, Any], directory: Path) -> dict[str, Any]:
    """``--arm`` in a process of its own (``install()`` is once per process); its answer, its log beside it."""
    path = directory / f"arm-{name}.json"
    path.write_text(json.dumps({**config, "arm": name}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAGENT_GOVERNED_MEMORY")}  # no .pth activation
    log = directory / f"arm-{name}.log"
    with log.open("w") as errors:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--arm", str(path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            timeout=3600,
        )
    if done.returncode != 0:
        raise RuntimeError(f"arm {name} exited {done.returncode}: {log.read_text()[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


async def scopes(store: Any, users: int) -> list[dict[str, Any]]:
    """``users`` fresh users, each with a consented scope of 100 entries (the local embedder's vectors)."""
    from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey
    from kagent_memory_governed.store import NewFact
    from kagent_memory_governed.testing import AGENT, HOMESERVER, embed

    facts = [NewFact(text, embed(text)) for text in FACTS]
    made = []
    for _ in range(users):
        mxid, room = f"@u{uuid.uuid4().hex[:12]}:{HOMESERVER}", f"!turns{uuid.uuid4().hex[:12]}:{HOMESERVER}"
        key = ScopeKey(Principal.parse(mxid, "native"), AgentId.parse(AGENT), ControlRoom.parse(room))
        generation = (await store.grant(key, purpose="bench", policy_version="v1")).generation
        await store.write(key, generation, facts)
        made.append({"mxid": mxid, "room": room, "generation": generation})
    return made


def summary(result: dict[str, Any]) -> dict[str, Any]:
    samples = result["samples"]
    row: dict[str, Any] = {
        name: {"median_ms": statistics.median(s) * 1000, "runs": len(s)} for name, s in samples.items() if s
    }
    free = row["free"]["median_ms"]
    for name in row:
        row[name]["ratio"] = row[name]["median_ms"] / free
    row["met"] = row["enabled"]["ratio"] <= BOUND
    row["counts"], row["phases"] = result["counts"], result["phases"]
    return row


async def run(
    url: str | None,
    *,
    key_store: Path | None = None,
    users: int = 12,
    turns: int = 25,
    rounds: int = 4,
    session_turns: int = 5,
    arms: tuple[str, ...] = ("in-process", "service"),
    model_ms: float = 0.0,
    profile: Path | None = None,
    work: Path | None = None,
) -> dict[str, Any]:
    from cluster import rsa_key, serving
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from data_plane import certificates, start_embeddings, start_serve, stop_serve
    from service import environment, rotated

    from kagent_memory_governed.embedded import start
    from kagent_memory_governed.keys import LocalKeyStore
    from kagent_memory_governed.policy import Policy
    from kagent_memory_governed.store import Store
    from kagent_memory_governed.testing import AGENT, Bridge

    directory = work or Path(tempfile.mkdtemp(prefix="turns-bench-"))
    directory.mkdir(parents=True, exist_ok=True)
    url = url or start(directory / "pg")
    key_store = key_store or directory / "keys"
    private_key = Ed25519PrivateKey.generate()
    pem = private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (directory / "bridge.key").write_bytes(pem)
    (directory / "bridge.key").chmod(0o600)
    prep = Store.connect(url, Policy(), keys=LocalKeyStore(key_store))  # the bridge's side: consent and entries
    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "package": str(Path(sys.modules["kagent_memory_governed"].__file__ or "").parent),
        "users": users,
        "turns": turns,
        "rounds": rounds,
        "session_turns": session_turns,
        "model_ms": model_ms,
        "bound": BOUND,
        "cpus": os.cpu_count(),
        "arms": {},
    }
    provider, provider_url = start_embeddings(directory, "hashed")  # every arm's embedding provider, one process
    table = {"*": {"url": provider_url, "model": "local-hash-768"}}
    (directory / "embeddings.json").write_text(json.dumps(table))
    try:
        await prep.migrate()
        base = {"url": url, "key_store": str(key_store), "bridge_key": str(directory / "bridge.key")}
        base |= {"embedding_url": provider_url}
        base |= {"turns": turns, "session_turns": session_turns, "model_ms": model_ms}
        base |= {"profile": str(profile) if profile else None}
        for name in arms:
            config = base | {
                "warm": await scopes(prep, users),
                "rounds": [await scopes(prep, users) for _ in range(rounds)],
            }
            started = time.perf_counter()
            load = os.getloadavg()[0]
            if name == "service":
                with contextlib.ExitStack() as stack:
                    for sub in ("tls", "cluster"):
                        (directory / sub).mkdir(exist_ok=True)
                    ca, cert, tls_key = certificates(directory / "tls")
                    kube = stack.enter_context(serving(directory / "cluster"))
                    kube.keys = [kube_key := rsa_key()]
                    token = stack.enter_context(rotated(directory / "pod-token", kube_key, AGENT))
                    extra = {
                        "KAGENT_GOVERNED_MEMORY_KEY_STORE": f"file://{key_store}",
                        "KAGENT_GOVERNED_MEMORY_TLS_CERT": str(cert),
                        "KAGENT_GOVERNED_MEMORY_TLS_KEY": str(tls_key),
                        "KAGENT_GOVERNED_MEMORY_EMBEDDINGS": str(directory / "embeddings.json"),
                    }
                    env = environment(directory, Bridge(private_key=private_key), url, kube, **extra)
                    command = [str(Path(sys.executable).parent / "kagent-memory-governed"), "serve"]
                    serve = start_serve(command, env, directory / "serve.log", ca)
                    try:
                        config |= {"service_url": serve.url, "service_ca": str(ca), "service_token": str(token)}
                        answer = run_arm(name, config, directory)
                    finally:
                        stop_serve(serve)
            else:
                answer = run_arm(name, config, directory)
            row = summary(answer)
            row["seconds"], row["load_average_at_start"] = time.perf_counter() - started, load
            result["arms"][name] = row
    finally:
        await prep.close()
        provider.terminate()
        provider.wait(30)
    if work is None:
        shutil.rmtree(directory, ignore_errors=True)
    return result


def table(result: dict[str, Any]) -> list[str]:
    lines = [
        f"{result['users']} concurrent users x {result['turns']} turns a phase, {result['rounds']} rounds of a"
        f" memory-free and a memory-enabled phase, sessions of {result['session_turns']} turns; {result['cpus']} CPUs;"
        + (
            f" scripted model waiting {result['model_ms']:g} ms before each answer"
            if result["model_ms"]
            else " scripted model answering at once (the worst case for memory's share)"
        ),
        f"{'arm':11} {'free ms':>8} {'enabled ms':>10} {'ratio':>6} {'bound':>6}  {'met':4} "
        f"{'first (prefetch) ms':>19} {'ratio':>6} {'auto-save turn ms':>17} {'ratio':>6}  load  memory work",
    ]
    for name, row in result["arms"].items():
        counts = row["counts"]
        work = ", ".join(f"{key} {value}" for key, value in sorted(counts.items()))
        loads = [phase["load_average"] for phase in row["phases"]]
        lines.append(
            f"{name:11} {row['free']['median_ms']:8.2f} {row['enabled']['median_ms']:10.2f}"
            f" {row['enabled']['ratio']:6.3f} {result['bound']:6.2f}  {'yes' if row['met'] else 'NO':4}"
            f" {row['enabled first']['median_ms']:19.2f} {row['enabled first']['ratio']:6.3f}"
            f" {row['enabled auto-save']['median_ms']:17.2f} {row['enabled auto-save']['ratio']:6.3f}"
            f"  {min(loads):.1f}-{max(loads):.1f}  {work}"
        )
    return lines


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="postgresql+asyncpg://...; unset: an embedded PostgreSQL")
    parser.add_argument("--key-store", help="file:///path of the local key store bound to --url's database")
    parser.add_argument("--users", type=int, default=12)
    parser.add_argument("--turns", type=int, default=25, help="turns of each user in each phase")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--session-turns", type=int, default=5)
    parser.add_argument("--arms", default="in-process,service")
    parser.add_argument(
        "--model-ms",
        type=float,
        default=0.0,
        help="the model waits this long before each answer (a provider's latency)",
    )
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "turns.json")
    parser.add_argument("--work", type=Path, help="keep the run's directory (the arms' logs) here")
    parser.add_argument("--profile", type=Path, help="cProfile each arm's timed phases into this directory (slower)")
    args = parser.parse_args()
    result = await run(
        args.url,
        key_store=Path(urlsplit(args.key_store).path) if args.key_store else None,
        users=args.users,
        turns=args.turns,
        rounds=args.rounds,
        session_turns=args.session_turns,
        arms=tuple(args.arms.split(",")),
        model_ms=args.model_ms,
        profile=args.profile,
        work=args.work,
    )
    for line in table(result):
        print(line)  # noqa: T201
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--arm":
        answer = asyncio.run(arm(json.loads(Path(sys.argv[2]).read_text())))
        print(json.dumps(answer))  # noqa: T201
    else:
        asyncio.run(main())
