"""Database failures an operator can act on carry a content-free cause beside the reason code, and
migrations refuse what they cannot do safely: a newer schema, an unknown revision, a missing extension."""

from __future__ import annotations

import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from support import dropped, keys_of, refusal

from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.store import Store
from kagent_memory_governed.store.database import cause_of


def _with(url: str, *, user: str | None = None, database: str | None = None) -> str:
    head, query = url.split("?", 1)
    scheme, rest = head.split("://", 1)
    credentials, path = rest.split("@", 1)
    return f"{scheme}://{user or credentials}@/{database or path.strip('/')}?{query}"


@pytest.fixture
async def admin(database_url: str, store: Store) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    yield conn
    await conn.close()


SCRATCH = f"scratch_{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def scratch(admin: asyncpg.Connection, database_url: str) -> AsyncIterator[str]:
    """A database of its own (``SCRATCH``), dropped afterwards."""
    await admin.execute(f'CREATE DATABASE "{SCRATCH}"')
    yield _with(database_url, database=SCRATCH)
    await admin.execute(f'DROP DATABASE "{SCRATCH}" WITH (FORCE)')
    dropped(_with(database_url, database=SCRATCH))


async def _cause(url: str) -> tuple[Reason, str | None]:
    store = Store.connect(url, Policy(), keys=keys_of(url))
    try:
        with pytest.raises(GovernedMemoryError) as refused:
            await store.migrate()
    finally:
        await store.close()
    assert str(refused.value) == refused.value.reason.value  # the code stays the whole message
    return refused.value.reason, refused.value.cause


async def test_each_database_failure_names_its_cause(database_url: str, store: Store, tmp_path: Path) -> None:
    assert await _cause(_with(database_url, user="nobody")) == (Reason.STORE_UNAVAILABLE, "authentication_failed")
    assert await _cause(_with(database_url, database="no_such_db")) == (Reason.STORE_UNAVAILABLE, "database_missing")
    nowhere = f"postgresql+asyncpg://postgres@/postgres?host={tmp_path}"
    assert await _cause(nowhere) == (Reason.STORE_UNAVAILABLE, "connection_refused")


def test_causes_are_read_through_the_drivers_exception_chain() -> None:
    def chained(outer: Exception, inner: BaseException) -> Exception:
        outer.__cause__ = inner
        return outer

    assert cause_of(chained(OSError("x"), socket.gaierror(-2, "Name or service not known"))) == "name_not_resolved"
    assert cause_of(chained(RuntimeError("wrapped"), TimeoutError())) == "timeout"
    assert cause_of(RuntimeError("anything else")) is None


async def test_a_role_that_may_not_create_pgvector_is_told_what_a_dba_must_run(
    admin: asyncpg.Connection, scratch: str
) -> None:
    role = f"limited_{uuid.uuid4().hex[:8]}"
    await admin.execute(f'CREATE ROLE "{role}" LOGIN')
    await admin.execute(f'ALTER DATABASE "{SCRATCH}" OWNER TO "{role}"')
    try:
        assert await _cause(_with(scratch, user=role)) == (Reason.UNSUPPORTED_DATABASE, "extension_missing")
    finally:
        await admin.execute(f'ALTER DATABASE "{SCRATCH}" OWNER TO postgres')
        await admin.execute(f'DROP ROLE "{role}"')


async def test_a_database_newer_than_the_package_is_refused_naming_both_revisions(scratch: str) -> None:
    store = Store.connect(scratch, Policy(), keys=keys_of(scratch))
    try:
        head = await store.migrate()
        sql = await asyncpg.connect(scratch.replace("postgresql+asyncpg://", "postgresql://"))
        await sql.execute("UPDATE governed_memory.alembic_version SET version_num = '9999'")
        await sql.close()
        with pytest.raises(GovernedMemoryError) as refused:
            await store.migrate()
        assert refused.value.reason is Reason.SCHEMA_NEWER
        assert refused.value.detail == f"database at 9999, this package migrates to {head}"
        assert await refusal(store.check_ready()) is Reason.SCHEMA_NEWER
    finally:
        await store.close()


async def test_migrate_goes_down_to_a_named_revision_and_back(scratch: str) -> None:
    store = Store.connect(scratch, Policy(), keys=keys_of(scratch))
    try:
        head = await store.migrate()
        assert await store.migrate("0004") == "0004"
        sql = await asyncpg.connect(scratch.replace("postgresql+asyncpg://", "postgresql://"))
        index = await sql.fetchval("SELECT to_regclass('governed_memory.ledger_by_age')")
        await sql.close()
        assert index is None  # 0005's index is gone
        assert await refusal(store.check_ready()) is Reason.SCHEMA_OUTDATED
        assert await store.migrate() == head
        await store.check_ready()
        assert await refusal(store.migrate("not-a-revision")) is Reason.BAD_INPUT
    finally:
        await store.close()
