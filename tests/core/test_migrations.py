"""``migrate`` creates and upgrades the schema; the code's declaration and the migrations agree."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from support import make_key

from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.keys import LocalKeyStore
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.schema import SCHEMA, metadata
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import embed

_databases = itertools.count()


@pytest.fixture
async def fresh_database(database_url: str, sql: asyncpg.Connection) -> AsyncIterator[str]:
    name = f"fresh_{next(_databases)}"
    await sql.execute(f"DROP DATABASE IF EXISTS {name}")
    await sql.execute(f"CREATE DATABASE {name}")
    yield database_url.replace("/postgres?", f"/{name}?")
    await sql.execute(f"DROP DATABASE {name} WITH (FORCE)")


async def test_migrate_reaches_head_and_is_idempotent(store: Store) -> None:
    assert Store.head_revision() == "0014"
    assert await store.migrate() == "0014"
    assert await store.migrate() == "0014"
    await store.check_ready()


async def test_an_unmigrated_database_is_refused_until_migrated(fresh_database: str, tmp_path: Path) -> None:
    keys = tmp_path / "keys"  # a database of its own has a key store of its own (store/binding.py)
    first = Store.connect(fresh_database, Policy(), keys=LocalKeyStore(keys))
    second = Store.connect(fresh_database, Policy(), keys=LocalKeyStore(keys))
    try:
        with pytest.raises(GovernedMemoryError) as refused:
            await first.check_ready()
        assert refused.value.reason is Reason.SCHEMA_MISSING
        assert await first.revision() is None
        assert list(await asyncio.gather(first.migrate(), second.migrate())) == ["0014", "0014"]  # replicas race safely
        await first.check_ready()
    finally:
        await first.close()
        await second.close()


async def test_the_declared_schema_matches_the_migrations(store: Store, database_url: str) -> None:
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as conn:

            def differences(sync_conn: Connection) -> list[object]:
                context = MigrationContext.configure(
                    sync_conn,
                    opts={
                        "include_schemas": True,
                        "include_name": lambda name, kind, _: kind != "schema" or name == SCHEMA,
                        "include_object": lambda obj, name, kind, *_: name != "alembic_version",
                    },
                )
                found: list[object] = compare_metadata(context, metadata)
                return found

            assert await conn.run_sync(differences) == []
    finally:
        await engine.dispose()


async def test_entries_keep_vectors_inline_and_the_scope_leads_every_content_key(
    sql: asyncpg.Connection, store: Store
) -> None:
    storage = await sql.fetch(
        "SELECT attstorage::text FROM pg_attribute WHERE attrelid = 'governed_memory.entries'::regclass"
        " AND attname IN ('plain_embedding', 'sealed')"
    )
    assert [row[0] for row in storage] == ["p", "p"]  # inline, never compressed or moved to TOAST
    leading = await sql.fetchval(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
        " WHERE i.indrelid = 'governed_memory.entries'::regclass AND i.indisprimary"
    )
    assert leading == "scope_id"


async def test_the_database_refuses_orphan_entries_and_wrong_dimensions(sql: asyncpg.Connection, store: Store) -> None:
    insert = (
        "INSERT INTO governed_memory.entries (scope_id, entry_id, plain_text, plain_embedding, generation,"
        " created_at, expires_at) VALUES (gen_random_uuid(), gen_random_uuid(), 'x', $1, 1, now(),"
        " now() + interval '1 hour')"
    )
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await sql.execute(insert, str([1.0] * 768))
    with pytest.raises(asyncpg.DataError, match="768"):
        await sql.execute(insert, str([1.0] * 767))


async def test_migrate_seals_entries_an_earlier_version_stored_in_plain_text(
    fresh_database: str, tmp_path: Path
) -> None:
    """0011 keeps plain-text rows until ``migrate`` seals them (a key each in the key store); a server refuses to
    serve while one is left. Their earlier copies in WAL and backups are the operator's to age out (docs)."""
    keys = LocalKeyStore(tmp_path / "keys")
    store = Store.connect(fresh_database, Policy(), keys=keys)
    sql = await asyncpg.connect(fresh_database.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        assert await store.migrate("0010") == "0010"
        key = make_key("legacy")
        await store.grant(key, purpose="assist", policy_version="v1")
        vector = embed("likes green tea")
        await sql.execute(  # as 0010 stored it
            "INSERT INTO governed_memory.entries (scope_id, entry_id, text, embedding, generation, created_at,"
            " expires_at) VALUES ($1, gen_random_uuid(), 'likes green tea', $2, 1, now(), now() + interval '1 day')",
            key.scope_id,
            str(vector),
        )
        assert await store.migrate() == "0014"
        row = await sql.fetchrow("SELECT plain_text, plain_embedding, sealed FROM governed_memory.entries")
        assert (row["plain_text"], row["plain_embedding"]) == (None, None) and len(row["sealed"]) > 3000
        await store.check_ready()
        [hit] = await store.search(key, 1, vector, top_k=1)
        assert hit.text == "likes green tea"
        await sql.execute(  # as a migrate interrupted after 0011 and before sealing leaves one
            "INSERT INTO governed_memory.entries (scope_id, entry_id, plain_text, plain_embedding, generation,"
            " created_at, expires_at) VALUES ($1, gen_random_uuid(), 'left plain', $2, 1, now(), now() + interval"
            " '1 day')",
            key.scope_id,
            str(vector),
        )
        with pytest.raises(GovernedMemoryError) as refused:
            await store.check_ready()
        assert (refused.value.reason, refused.value.cause) == (Reason.SCHEMA_OUTDATED, "plain_entries")
        await store.migrate()
        await store.check_ready()
    finally:
        await sql.close()
        await store.close()


async def test_the_migration_session_lifts_the_drivers_last_resort_bound_and_nothing_else_does(
    database_url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A migration's rewrite (``VACUUM FULL`` of every entry) takes what the table needs: the driver's last resort
    for a statement (30 s; here 0.2 s) bounds every other statement, never one of the migration session."""
    from sqlalchemy import text

    from kagent_memory_governed.store import database, schema_admin

    monkeypatch.setattr(database, "COMMAND_TIMEOUT", 0.2)
    short = Store.connect(database_url, Policy(), keys=store.key_store)
    try:
        db = short._db
        async with schema_admin._migration_session(db) as conn:
            assert await conn.scalar(text("SELECT 1 FROM pg_sleep(0.5)")) == 1  # past the driver's bound: answered
            with pytest.raises(TimeoutError):  # meanwhile, on any other connection: the driver's bound
                async with db.engine.connect() as other:
                    await other.scalar(text("SELECT pg_sleep(0.5)"))
        with pytest.raises(TimeoutError):  # the driver's bound, outside the session
            async with db.engine.connect() as conn:
                await conn.scalar(text("SELECT pg_sleep(0.5)"))
    finally:
        await short.close()
