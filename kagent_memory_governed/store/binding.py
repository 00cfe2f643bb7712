"""The key store bound to its database (R45): a key store never "verifies" erasures of keys it never held.

Each side records the pair once: the database its own id (drawn by migration 0014) and the id of the key store
that holds its keys; the key store its own id and the database's (``KeyStore.bind``). ``migrate`` records both on
first use, before it seals anything, and compares them on every later run; readiness (start-up, ``sweep``,
``doctor``, the health probe) compares them and writes nothing. A key store of another database, a fresh one put
in place of the one that holds the keys, or a database restored next to another key store is refused with
``key_store_mismatch`` and a content-free cause: nothing is served, sealed or erased through it.
"""

from __future__ import annotations

import uuid

from sqlalchemy import select, update

from kagent_memory_governed import clock
from kagent_memory_governed.errors import Cause, GovernedMemoryError, Reason
from kagent_memory_governed.keys.keyring import Binding
from kagent_memory_governed.schema import binding
from kagent_memory_governed.store.database import Database


def mismatch(database: uuid.UUID, key_store: uuid.UUID | None, recorded: Binding | None) -> Cause | None:
    """Why the database (its id, and the key store id it recorded) and the key store's ``recorded`` binding do
    not belong together, as a content-free cause; ``None`` when they do."""
    if recorded is not None and recorded.database != database:
        return Cause.SERVES_ANOTHER_DATABASE
    if key_store is None:
        return Cause.UNBOUND  # never migrated since 0014: ``migrate`` binds them
    if recorded is None or recorded.key_store != key_store:
        return Cause.ANOTHER_KEY_STORE  # a fresh one, or another: it never held this database's keys
    return None


async def bind(db: Database) -> None:
    """Record the pair on both sides where it is missing (first writer wins on each), then compare. Refuses
    ``key_store_mismatch``."""
    database, key_store = await _recorded(db)
    recorded = await db.keys.store.bound() or await db.keys.store.bind(database)
    if key_store is None and recorded.database == database:
        async with db.transaction() as conn:
            await conn.execute(
                update(binding)
                .where(binding.c.key_store_id.is_(None))
                .values(key_store_id=recorded.key_store, bound_at=clock.now())
            )
        database, key_store = await _recorded(db)
    _refuse(mismatch(database, key_store, recorded))


async def check(db: Database) -> None:
    """Compare the pair; write nothing. Refuses ``key_store_mismatch``."""
    database, key_store = await _recorded(db)
    _refuse(mismatch(database, key_store, await db.keys.store.bound()))


async def _recorded(db: Database) -> tuple[uuid.UUID, uuid.UUID | None]:
    rows = await db.call(select(binding.c.database_id, binding.c.key_store_id))
    if not rows:  # migration 0014 writes the row; nothing deletes it
        raise GovernedMemoryError(Reason.SCHEMA_OUTDATED, cause=Cause.BINDING_MISSING)
    return rows[0].database_id, rows[0].key_store_id


def _refuse(cause: Cause | None) -> None:
    if cause is not None:
        raise GovernedMemoryError(Reason.KEY_STORE_MISMATCH, cause=cause)
