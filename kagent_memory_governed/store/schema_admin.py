"""Schema administration through alembic's own API: migrate to head, read the revision, check readiness."""

from __future__ import annotations

from importlib.resources import files

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.schema import CreateSchema

from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.schema import SCHEMA
from kagent_memory_governed.store.database import Database

MIN_SERVER_VERSION = 150000  # PostgreSQL 15
MIN_PGVECTOR = (0, 7, 0)
_MIGRATION_LOCK = 0x6B6D6700  # advisory lock id: concurrent `migrate` runs serialize


async def migrate(db: Database) -> str:
    from alembic import command
    from alembic.config import Config

    def upgrade(sync_conn) -> None:  # alembic is synchronous; it runs on this connection
        config = Config()
        config.set_main_option("script_location", str(files("kagent_memory_governed") / "migrations"))
        config.attributes["connection"] = sync_conn
        command.upgrade(config, "head")

    async with db.transaction() as conn:
        await conn.execute(select(func.pg_advisory_xact_lock(_MIGRATION_LOCK)))
        await _check_server(conn)
        await conn.execute(text("CREATE EXTENSION IF NOT EXISTS vector"))
        installed = await conn.scalar(text("SELECT extversion FROM pg_extension WHERE extname = 'vector'"))
        if _version_tuple(installed) < MIN_PGVECTOR:  # only then: updating needs the extension's owner
            await conn.execute(text("ALTER EXTENSION vector UPDATE"))
        await conn.execute(CreateSchema(SCHEMA, if_not_exists=True))
        await conn.run_sync(upgrade)
    return await revision(db)


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(files("kagent_memory_governed") / "migrations")).get_current_head()


async def revision(db: Database) -> str | None:
    from alembic.migration import MigrationContext

    def current(sync_conn) -> str | None:  # alembic is synchronous; it reads on this connection
        return MigrationContext.configure(sync_conn, opts={"version_table_schema": SCHEMA}).get_current_revision()

    async with db.transaction() as conn:
        return await conn.run_sync(current)


async def check_ready(db: Database) -> None:
    async with db.transaction() as conn:
        await _check_server(conn)
        installed = await conn.scalar(
            text("SELECT installed_version FROM pg_available_extensions WHERE name = 'vector'")
        )
    if installed is None or _version_tuple(installed) < MIN_PGVECTOR:
        raise GovernedMemoryError(Reason.SCHEMA_OUTDATED)
    if await revision(db) != head_revision():
        raise GovernedMemoryError(Reason.SCHEMA_OUTDATED)


async def _check_server(conn: AsyncConnection) -> None:
    """PostgreSQL 15 or newer with pgvector 0.7 or newer available."""
    server = int(await conn.scalar(text("SHOW server_version_num")))
    vector = await conn.scalar(text("SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"))
    if server < MIN_SERVER_VERSION or vector is None or _version_tuple(vector) < MIN_PGVECTOR:
        raise GovernedMemoryError(Reason.UNSUPPORTED_DATABASE)


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3] if part.isdigit())
