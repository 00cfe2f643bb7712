"""Schema administration through alembic's own API: migrate to head, read the revision, check readiness;
and the content-free counts the health gauges report."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.resources import files

import numpy
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import ColumnElement, Text, column, exists, func, select, table, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.schema import CreateSchema

from kagent_memory_governed.consent import Erasure
from kagent_memory_governed.errors import Cause, GovernedMemoryError, Reason, Result
from kagent_memory_governed.keys import EntryKey
from kagent_memory_governed.schema import SCHEMA, entries, ledger, scopes
from kagent_memory_governed.store import binding
from kagent_memory_governed.store.database import _DATABASE_ERRORS, Database, cause_of, record

MIN_SERVER_VERSION = 150000  # PostgreSQL 15
MIN_PGVECTOR = (0, 7, 0)
_MIGRATION_LOCK = 0x6B6D6700  # advisory lock id: concurrent `migrate` runs serialize


def _scripts() -> ScriptDirectory:

    return ScriptDirectory(str(files("kagent_memory_governed") / "migrations"))


async def migrate(db: Database, to: str = "head") -> str:
    """Upgrade to ``to`` (``head`` or a revision id), or downgrade to it when it is older than the database.
    Refuses a database migrated past anything this package knows (``schema_newer``, naming both revisions),
    ``base`` (it would drop every entry and the ledger without an erasure's verification) and any other
    target (``bad_input``); a role that may not create pgvector gets ``extension_missing``; a pooler between it and
    the server gets ``unsupported_database (pooled)``, before anything changes (``_refuse_a_pooler``)."""
    from alembic import command
    from alembic.config import Config

    scripts = _scripts()
    target = _target(scripts, to)
    await _refuse_a_pooler(db)
    await _create_extension(db)

    def move(sync_conn: Connection) -> None:  # alembic is synchronous; it runs on this connection
        current = MigrationContext.configure(sync_conn, opts={"version_table_schema": SCHEMA}).get_current_revision()
        known = {script.revision for script in scripts.walk_revisions()}
        if current is not None and current not in known:
            detail = f"database at {current[:32]}, this package migrates to {scripts.get_current_head()}"
            raise GovernedMemoryError(Reason.SCHEMA_NEWER, detail=detail)
        config = Config()
        config.set_main_option("script_location", str(files("kagent_memory_governed") / "migrations"))
        config.attributes["connection"] = sync_conn
        older = current is not None and target != current and target in _ancestors(scripts, current)
        (command.downgrade if older else command.upgrade)(config, target)

    async with db.transaction() as conn:
        await conn.execute(select(func.pg_advisory_xact_lock(_MIGRATION_LOCK)))
        await _check_server(conn)
        installed = await conn.scalar(text("SELECT extversion FROM pg_extension WHERE extname = 'vector'"))
        if _version_tuple(installed) < MIN_PGVECTOR:  # only then: updating needs the extension's owner
            await conn.execute(text("ALTER EXTENSION vector UPDATE"))
        await conn.execute(CreateSchema(SCHEMA, if_not_exists=True))
        await conn.run_sync(move)
    migrated = await revision(db)
    if migrated is None:  # alembic records every revision it reaches
        raise GovernedMemoryError(Reason.SCHEMA_MISSING)
    if migrated == _head(scripts):  # the schema this package's statements name; an older one is an older release's
        await binding.bind(db)  # before any key is stored: never into a key store of another database
        await seal_plain_entries(db)
    return migrated


async def seal_plain_entries(db: Database, *, batch: int = 500) -> int:
    """Seal every entry an earlier version stored in plain text (migration 0011), ``batch`` at a time: a key for
    each, stored in the key store first, then the row's text and embedding replaced by their ciphertext (the
    one change the immutability trigger allows), the batch recorded in the ledger (``seal_entries``, a count).

    Then, while a sealing is recorded after the last rewrite (this run's, or one a crash stopped before its
    rewrite), the entries table is rewritten (``VACUUM FULL``: heap, TOAST and indexes into new files, the old
    ones emptied) and checkpointed if the role may (superuser or ``pg_checkpoint``), so that no row version from
    before the sealing is left in the live data files; recorded as ``rewrite_entries``. Refuses
    ``schema_outdated`` (``rewrite_blocked``) when the rewrite had to keep row versions a transaction still open
    from before the sealing may see: run ``migrate`` again once it has ended. All of it under the migration
    lock: replicas migrating at once take turns. Idempotent; a database with nothing to seal rewrites nothing.
    Returns how many were sealed. What those rows were stays in the WAL written up to the rewrite, and in every
    archive, replica's WAL and backup taken from it (docs/privacy.md)."""
    async with _migration_session(db) as session:
        total = await _seal(db, batch)
        if await _rewrite_due(session):
            await _rewrite(session)
        return total


_SEALED = "seal_entries"  # the ledger's record of a sealing batch: a rewrite is due after it
_REWRITTEN = "rewrite_entries"  # the ledger's record of a rewrite that kept no row version from before it


async def _seal(db: Database, batch: int) -> int:
    from kagent_memory_governed.store import entry_format

    total = 0
    while True:
        async with db.transaction() as conn:
            rows = (
                await conn.execute(
                    select(entries.c.scope_id, entries.c.entry_id, entries.c.plain_text, entries.c.plain_embedding)
                    .add_columns(entries.c.generation)
                    .where(entries.c.sealed.is_(None))
                    .order_by(entries.c.scope_id, entries.c.entry_id)
                    .limit(batch)
                    .with_for_update(skip_locked=True)
                )
            ).all()
            by_scope: dict[uuid.UUID, dict[uuid.UUID, tuple[EntryKey, bytes]]] = {}
            for row in rows:
                key = entry_format.new_key(row.plain_text, row.scope_id, row.generation)
                sealed = entry_format.seal(
                    key, row.scope_id, row.entry_id, row.plain_text, numpy.asarray(row.plain_embedding)
                )
                by_scope.setdefault(row.scope_id, {})[row.entry_id] = (key, sealed)
            for scope, sealed_entries in by_scope.items():
                await db.keys.store.store(scope, {entry: key for entry, (key, _) in sealed_entries.items()})
            for scope, sealed_entries in by_scope.items():
                for entry, (_, sealed) in sealed_entries.items():
                    await conn.execute(
                        update(entries)
                        .where(entries.c.scope_id == scope, entries.c.entry_id == entry)
                        .values(sealed=sealed, plain_text=None, plain_embedding=None)
                    )
            if rows:  # committed with the batch: a crash before the rewrite leaves it due
                await record(conn, _SEALED, Result.OK, count=len(rows))
        total += len(rows)
        if len(rows) < batch:
            return total


async def _refuse_a_pooler(db: Database) -> None:
    """Refuse ``unsupported_database (pooled)`` unless each of two client connections runs its transaction in the
    server process that answered its start-up, and the two in two processes. A migration keeps its lock and its
    settings in a session (``_migration_session``: a session advisory lock across ``VACUUM FULL``, which no
    transaction block can hold); a transaction pooler lends a server session to another client between
    transactions, so the lock would stay in a session no migration holds and the rewrite would run unlocked.

    Why a direct connection always passes: PostgreSQL announces each client its backend's process id at start-up
    (the cancel key, BackendKeyData) and runs every statement of that connection in that process, so the id
    announced is ``pg_backend_pid()``, and two connections are two processes; a proxy that only relays bytes (TLS,
    a port-forward, a TCP load balancer) changes neither. Why a pooler does not: it answers the start-up before it
    picks a server session (a transaction pooler picks one per transaction) and must answer cancel requests
    itself, so it announces a key of its own (PgBouncer, in every pool mode: a random id); and it lends the second
    client the idle session the first has just left (PgBouncer's default, LIFO; always, with a pool of one), so
    the two meet one process. To pass, a pooler would have to give the two clients two sessions and announce to
    each, by chance, the id of the one that runs it: for PgBouncer's random ids, about once in 2**62. Not read
    instead, since each passes a transaction pooler: whether a session ``SET`` or advisory lock carries from one
    transaction to the next (it does whenever the pool lends the same idle session again, as PgBouncer does), or
    whether ``pg_backend_pid()`` changes between them (not with one idle session). PgBouncer answers ``SHOW`` on
    its admin database only. The two transactions run one after the other: a pool of one session answers too."""
    try:
        async with db.engine.connect() as first, db.engine.connect() as second:
            served = [await _served(first), await _served(second)]
    except _DATABASE_ERRORS as error:
        raise GovernedMemoryError(Reason.STORE_UNAVAILABLE, cause=cause_of(error)) from None
    announced = [pid for pid, _ in served]
    running = [pid for _, pid in served]
    if announced != running or running[0] == running[1]:
        raise GovernedMemoryError(Reason.UNSUPPORTED_DATABASE, cause=Cause.POOLED)


async def _served(conn: AsyncConnection) -> tuple[int, int]:
    """The process id ``conn``'s start-up announced, and the one that runs a transaction on it."""
    await conn.execution_options(isolation_level="READ COMMITTED")  # a transaction: its BEGIN carries the bounds
    async with conn.begin():
        running = (await conn.execute(select(func.pg_backend_pid()))).scalar_one()
    driver = (await conn.get_raw_connection()).driver_connection
    if driver is None:  # a checked-out connection always has its driver's
        raise GovernedMemoryError(Reason.STORE_UNAVAILABLE, cause=Cause.CONNECTION_FAILURE)
    return int(driver.get_server_pid()), int(running)


@asynccontextmanager
async def _migration_session(db: Database) -> AsyncIterator[AsyncConnection]:
    """A connection of its own holding the migration lock for its session: autocommit (``VACUUM`` runs in no
    transaction block), with no statement or lock timeout (a rewrite takes what the table needs; another
    replica's is waited for) and the driver's bound lifted to ``MIGRATION_TIMEOUT``. Discarded afterwards, so
    neither the lock nor the settings outlive it."""
    try:
        async with db.engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            driver = (await conn.get_raw_connection()).driver_connection
            if driver is None:  # a checked-out connection always has its driver's
                raise GovernedMemoryError(Reason.STORE_UNAVAILABLE, cause=Cause.CONNECTION_FAILURE)
            driver.migration = True  # its statements within MIGRATION_TIMEOUT, not the driver's 30 s
            try:
                await conn.execute(text("SET statement_timeout = 0"))
                await conn.execute(text("SET lock_timeout = 0"))
                await conn.execute(select(func.pg_advisory_lock(_MIGRATION_LOCK)))
                yield conn
            finally:
                await conn.invalidate()  # the session ends: its lock is released
    except GovernedMemoryError:
        raise
    except _DATABASE_ERRORS as error:
        raise GovernedMemoryError(Reason.STORE_UNAVAILABLE, cause=cause_of(error)) from None


async def _rewrite_due(conn: AsyncConnection) -> bool:
    """Whether a sealing is recorded after the last rewrite. Both records have no scope: read through the
    ledger's scope index among the few such rows (sweeps), not the whole ledger."""

    def last(operation: str) -> ColumnElement[int]:
        return func.coalesce(func.max(ledger.c.ledger_id).filter(ledger.c.operation == operation), 0)

    due = select(last(_SEALED) > last(_REWRITTEN)).where(
        ledger.c.scope_id.is_(None), ledger.c.operation.in_((_SEALED, _REWRITTEN))
    )
    return bool(await conn.scalar(due))


async def _rewrite(conn: AsyncConnection, *, attempts: int = 2) -> None:
    """``VACUUM FULL`` of the entries table until it kept no row version that is not a row (a second attempt
    absorbs entries erased meanwhile), then a checkpoint if the role may; recorded. A rewrite copies every row
    version an open snapshot may still see, and a plain ``VACUUM`` after it counts those it cannot remove."""
    for _ in range(attempts):
        before = await conn.scalar(text("SELECT pg_relation_filenode('governed_memory.entries')"))
        await conn.execute(text("VACUUM FULL governed_memory.entries"))
        after = await conn.scalar(text("SELECT pg_relation_filenode('governed_memory.entries')"))
        if after == before:  # PostgreSQL skips, with a warning only, a table this role may not vacuum
            raise GovernedMemoryError(Reason.STORE_UNAVAILABLE, cause=Cause.PERMISSION_DENIED)
        await conn.execute(text("VACUUM governed_memory.entries"))  # sets the dead-tuple count (track_counts on)
        if not await conn.scalar(text("SELECT pg_stat_get_dead_tuples('governed_memory.entries'::regclass)")):
            break
    else:
        raise GovernedMemoryError(Reason.SCHEMA_OUTDATED, cause=Cause.REWRITE_BLOCKED)
    if await conn.scalar(text("SELECT pg_has_role('pg_checkpoint', 'USAGE')")):  # superusers too
        await conn.execute(text("CHECKPOINT"))  # the rewritten files on disk, the emptied ones unlinked
    await record(conn, _REWRITTEN, Result.OK)


def _target(scripts: ScriptDirectory, to: str) -> str:
    """The revision ``to`` names: ``head`` or one of this package's revision ids, nothing relative."""
    if to == "head":
        return _head(scripts)
    if to == "base":
        raise GovernedMemoryError(Reason.BAD_INPUT, detail="no downgrade to base: drop schema governed_memory instead")
    if to not in {script.revision for script in scripts.walk_revisions()}:
        raise GovernedMemoryError(Reason.BAD_INPUT, detail="no such revision")
    return to


def _ancestors(scripts: ScriptDirectory, revision: str) -> set[str]:
    return {script.revision for script in scripts.iterate_revisions(revision, "base")} - {revision}


def _head(scripts: ScriptDirectory) -> str:
    head = scripts.get_current_head()
    if head is None:  # this package always has migrations
        raise RuntimeError("no migrations")
    return head


async def _create_extension(db: Database) -> None:
    """pgvector in this database, created if this role may; otherwise ``extension_missing``: a database
    owner or superuser must run ``CREATE EXTENSION vector`` once."""
    try:
        async with db.transaction() as conn:  # under the migration lock: replicas migrating at once
            await conn.execute(select(func.pg_advisory_xact_lock(_MIGRATION_LOCK)))
            await _check_server(conn)
            if not await conn.scalar(text("SELECT extversion FROM pg_extension WHERE extname = 'vector'")):
                await conn.execute(text("CREATE EXTENSION IF NOT EXISTS vector"))
    except GovernedMemoryError as failed:
        if failed.cause is Cause.PERMISSION_DENIED:
            raise GovernedMemoryError(Reason.UNSUPPORTED_DATABASE, cause=Cause.EXTENSION_MISSING) from None
        raise


def head_revision() -> str:
    return _head(_scripts())


async def _read_revision(conn: AsyncConnection) -> str | None:
    """The revision alembic recorded, read as a plain query: alembic's own reader logs two INFO lines a call,
    and readiness runs every few seconds. ``None`` before the first migration."""
    recorded = text(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_tables WHERE schemaname = :schema AND tablename = 'alembic_version')"
    )
    if not await conn.scalar(recorded.bindparams(schema=SCHEMA)):
        return None
    found = await conn.scalar(select(column("version_num", Text)).select_from(table("alembic_version", schema=SCHEMA)))
    return None if found is None else str(found)


async def revision(db: Database) -> str | None:
    async with db.transaction() as conn:
        return await _read_revision(conn)


async def check_ready(db: Database) -> None:
    """Serve only at this package's head: ``unsupported_database`` (server or pgvector too old),
    ``schema_missing`` (never migrated), ``schema_newer`` (migrated past this package, naming both revisions),
    ``schema_outdated`` (an older revision, pgvector installed below 0.7, or entries an earlier version stored in
    plain text that ``migrate`` has not sealed yet), ``key_unavailable`` (the key store cannot serve),
    ``key_store_mismatch`` (the key store is not the one bound to this database: ``store/binding.py``),
    ``store_unavailable (read_only)`` (a standby: no write could land). Logs nothing."""
    async with db.transaction() as conn:
        await _check_server(conn)
        installed = await conn.scalar(
            text("SELECT installed_version FROM pg_available_extensions WHERE name = 'vector'")
        )
        found = await _read_revision(conn)
        read_only = await conn.scalar(select(func.pg_is_in_recovery()))
    scripts = _scripts()
    if read_only:  # a standby (libpq's multi-host form reached it, or the primary was demoted): no write can land
        raise GovernedMemoryError(Reason.STORE_UNAVAILABLE, cause=Cause.READ_ONLY)
    if found is None:
        raise GovernedMemoryError(Reason.SCHEMA_MISSING)
    if found not in {script.revision for script in scripts.walk_revisions()}:
        detail = f"database at {found[:32]}, this package migrates to {scripts.get_current_head()}"
        raise GovernedMemoryError(Reason.SCHEMA_NEWER, detail=detail)
    if found != scripts.get_current_head() or installed is None or _version_tuple(installed) < MIN_PGVECTOR:
        raise GovernedMemoryError(Reason.SCHEMA_OUTDATED)
    async with db.transaction() as conn:
        if await conn.scalar(select(exists().where(entries.c.sealed.is_(None)))):
            raise GovernedMemoryError(Reason.SCHEMA_OUTDATED, cause=Cause.PLAIN_ENTRIES)  # run migrate: it seals them
    await db.keys.store.check()
    await binding.check(db)


async def _check_server(conn: AsyncConnection) -> None:
    """PostgreSQL 15 or newer with pgvector 0.7 or newer available."""
    server = int(await conn.scalar(text("SHOW server_version_num")))
    vector = await conn.scalar(text("SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"))
    if server < MIN_SERVER_VERSION or vector is None or _version_tuple(vector) < MIN_PGVECTOR:
        raise GovernedMemoryError(Reason.UNSUPPORTED_DATABASE)


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3] if part.isdigit())


async def unfinished_erasures(db: Database) -> dict[Erasure, int]:
    """How many scopes in the whole database have an erasure ``pending`` or ``failed`` (R9): counts only.
    Served by the partial index over unfinished erasures."""
    unfinished = (Erasure.PENDING, Erasure.FAILED)
    query = select(scopes.c.erasure, func.count()).where(scopes.c.erasure.in_(unfinished)).group_by(scopes.c.erasure)
    async with db.transaction() as conn:
        found = {Erasure(state): count for state, count in (await conn.execute(query)).all()}
    return {state: found.get(state, 0) for state in unfinished}
