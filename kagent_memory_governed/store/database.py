"""The one way into the database: transactions, their errors as reason codes, and the ledger.

The hot path is ``Database.call``: one statement (a database function, ``store/sql/<name>.sql``) in its own
transaction, one round trip. Everything else runs inside ``Database.transaction``. A database failure
leaves either as ``store_unavailable`` (a constraint violation as ``bad_input``) with no database text.
A refusal decided inside a transaction is ``refuse``: its ledger row commits with the transaction, then
the reason is raised; a function returns its refusal, its ledger row committed with the call.

Nothing is left in a server session that a transaction pooler (PgBouncer, ``pool_mode = transaction``) could
not carry, so the store runs the same direct and behind one: no start-up parameter but ``application_name``
(which PgBouncer tracks), the bounds set ``LOCAL`` in each transaction's ``BEGIN`` and, for a lone statement,
kept by the driver (``connection.Bounds``), and no named prepared statement (``create_engine``).
"""

from __future__ import annotations

import asyncio
import re
import socket
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NoReturn

import asyncpg
from pgvector.asyncpg import register_vector
from sqlalchemy import Executable, Row, event, func, insert, select, text
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_dbapi
from sqlalchemy.exc import DisconnectionError, IntegrityError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from kagent_memory_governed import clock
from kagent_memory_governed.consent import Erasure
from kagent_memory_governed.errors import Cause, GovernedMemoryError, Operation, Reason, Result
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.schema import ledger, scopes
from kagent_memory_governed.store.connection import (
    COMMAND_TIMEOUT,
    LONE_STATEMENT,
    BoundedConnection,
    Bounds,
    DatabaseUrl,
    tls_cause,
)
from kagent_memory_governed.store.functions import SERVER
from kagent_memory_governed.store.keyrings import Keyrings

_DATABASE_ERRORS = (
    SQLAlchemyError,
    AsyncAdapt_asyncpg_dbapi.Error,  # raised unwrapped when a connection dies inside an event hook
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    # "cannot switch to state ...; another operation is in progress" when a backend dies mid-statement;
    # SQLAlchemy's adapter does not translate it (nor ProtocolError, its sibling)
    asyncpg.InternalClientError,
    OSError,
    asyncio.TimeoutError,
)

# What an operator can act on, by SQLSTATE (a code or its class), whoever answered it: the server, or a pooler
# in front of it; never by message text. PgBouncer answers its own refusals (a wrong password, an unknown
# database, a server it cannot log in to, its limits, an unsupported start-up parameter) as 08P01; since 1.20 it
# forwards a server's own login error with the server's code. The first match, in this order, wins.
_SQLSTATES: tuple[tuple[str, Cause], ...] = (
    ("28", Cause.AUTHENTICATION_FAILED),  # 28000 (pg_hba, certificates), 28P01 (password)
    ("3D000", Cause.DATABASE_MISSING),
    ("42501", Cause.PERMISSION_DENIED),
    ("08P01", Cause.CONNECTION_REJECTED),  # a pooler's refusal, or a protocol error
    ("08", Cause.CONNECTION_FAILURE),  # the connection could not be made or was lost
    ("53", Cause.INSUFFICIENT_RESOURCES),  # 53300 too many connections, 53100 disk full, 53200 out of memory
    ("57P01", Cause.SERVER_SHUTDOWN),  # administrator command: a shutdown, or the backend terminated
    ("57P02", Cause.SERVER_SHUTDOWN),  # crash of another backend
    ("57P03", Cause.SERVER_UNAVAILABLE),  # starting up, shutting down, in recovery
    ("57014", Cause.TIMEOUT),  # statement timeout, or the driver's cancel of a lone statement past its bound
    ("55P03", Cause.TIMEOUT),  # lock timeout
    ("25P03", Cause.TIMEOUT),  # idle in transaction past its timeout
    ("25006", Cause.READ_ONLY),  # a standby, or a primary that became one: writes refused until failover ends
)

# By the driver's or the OS's exception type, where there is no SQLSTATE.
_CAUSES: tuple[tuple[tuple[type[BaseException], ...], Cause], ...] = (
    ((asyncpg.TargetServerAttributeNotMatched,), Cause.NO_MATCHING_HOST),  # target_session_attrs
    ((socket.gaierror,), Cause.NAME_NOT_RESOLVED),
    ((ConnectionRefusedError, FileNotFoundError), Cause.CONNECTION_REFUSED),
    ((asyncio.TimeoutError, TimeoutError, PoolTimeout), Cause.TIMEOUT),
)


def _sqlstate_cause(error: BaseException) -> Cause | None:
    state = getattr(error, "sqlstate", None)
    if not isinstance(state, str):
        return None
    return next((cause for prefix, cause in _SQLSTATES if state.startswith(prefix)), None)


def cause_of(error: BaseException) -> Cause | None:
    """The operator-facing category of a database failure (content-free), or ``None`` if unknown: read through
    the exception chain, from the SQLSTATE when there is one (``_SQLSTATES``), else from the exception's type."""
    seen: list[BaseException] = []
    pending: list[BaseException | None] = [error]
    while pending and len(seen) < 16:
        current = pending.pop(0)
        if current is None or any(current is known for known in seen):
            continue
        seen.append(current)
        if tls := tls_cause(current):  # before the codes: a TLS refusal is also an OSError or an auth error
            return tls
        if cause := _sqlstate_cause(current):
            return cause
        for kinds, cause in _CAUSES:
            if isinstance(current, kinds):
                return cause
        pending += [getattr(current, "orig", None), current.__cause__, current.__context__]
    return None


def create_engine(database: DatabaseUrl, pool: dict[str, Any], bounds: Bounds) -> AsyncEngine:
    """The store's engine: parameters hidden from logs and exception text, autocommit (transactions say so; a
    lone statement is one round trip), the pool given, the server's waits within ``bounds``, connections
    prepared. It runs alike on a direct connection and behind a transaction pooler: its only start-up parameter
    is ``application_name``, and it prepares no named statement two clients of one server session could collide
    on (asyncpg's statement cache is off: each statement is unnamed and parsed again in its own round trip,
    ``Parse, Bind, Execute, Sync``, so it never meets a statement another client left in that session); what
    SQLAlchemy caches is the statement's description, on the client."""
    engine = create_async_engine(
        database.url,
        hide_parameters=True,
        isolation_level="AUTOCOMMIT",
        **pool,
        connect_args={
            **database.driver_args(),
            "connection_class": type("Connection", (BoundedConnection,), {"_bounds": bounds}),
            "statement_cache_size": 0,
            "command_timeout": COMMAND_TIMEOUT,
            "server_settings": {"application_name": "kagent-memory-governed"},
        },
    )
    prepare_connections(engine)
    return engine


def prepare_connections(engine: AsyncEngine) -> None:
    """Checkout without a round trip. A pooled connection whose server side has gone (a restart, a killed
    backend) is known at checkout, since asyncpg marks it closed when its socket ends, and the pool replaces
    it instead of failing the next operation: no pre-ping. Each connection learns pgvector's binary codec and the
    array types the store binds once, after the first migration has created the extension, in whichever schema it
    was created (``_register_codecs``): a codec is the client's (by type OID, the same in every session of the
    database), so it holds whichever server session a pooler lends the connection."""

    def check(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        if dbapi_connection.driver_connection.is_closed():
            raise DisconnectionError
        if not record.info.get("vector_codec"):
            with suppress(ValueError):  # "unknown type": the extension does not exist yet
                dbapi_connection.run_async(_register_codecs)
                record.info["vector_codec"] = True

    event.listen(engine.sync_engine, "checkout", check)


# The array types the store's statements bind: asyncpg learns them from the server on first use
_ARRAYS = "SELECT NULL::bytea[], NULL::int4[], NULL::int8[], NULL::uuid[], NULL::text[]"


async def _register_codecs(conn: asyncpg.Connection) -> None:
    """pgvector's binary codec on ``conn``, for the schema the extension is installed in (any: the database
    functions name it by schema too), and the array types the store binds, learnt in one transaction within the
    bound of a lone statement; ``ValueError`` while pgvector is not installed. One transaction, because asyncpg
    learns a type by asking the server with JIT turned off for the session and back: outside a transaction,
    behind a transaction pooler, it would turn it off in one server session and back in another."""
    bounds: Bounds | None = getattr(conn, "_bounds", None)
    async with asyncio.timeout(bounds.lone_statement_seconds if bounds else None), conn.transaction():
        schema = await conn.fetchval(
            "SELECT n.nspname FROM pg_catalog.pg_extension AS e JOIN pg_catalog.pg_namespace AS n"
            " ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
        )
        if schema is None:
            raise ValueError("unknown type: vector")
        await register_vector(conn, schema=schema)
        await conn.fetchrow(_ARRAYS)


class _Refused(Exception):
    """Raised inside a transaction: commit what was recorded (the ledger row), then refuse."""

    def __init__(self, reason: Reason) -> None:
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Database:
    """The engine and the policy every statement of the store runs under, and the keyrings that open what the
    statements return (the keys themselves are never in the database: ``store/entry_format.py``)."""

    engine: AsyncEngine  # autocommit: a statement outside ``transaction`` is a transaction of its own
    policy: Policy
    keys: Keyrings

    async def call(self, statement: Executable, parameters: dict[str, object] | None = None) -> list[Row[Any]]:
        """One statement in a transaction of its own: one round trip, within the bound of a lone statement
        (``Bounds``). Its rows; failures as in ``transaction``."""
        lone = LONE_STATEMENT.set(True)
        try:
            async with self.engine.connect() as conn:
                result = await conn.execute(statement, parameters)
                rows = list(result.all()) if result.returns_rows else []
        except IntegrityError:
            raise GovernedMemoryError(Reason.BAD_INPUT) from None
        except _DATABASE_ERRORS as error:
            raise self._unavailable(error) from None
        finally:
            LONE_STATEMENT.reset(lone)
        if rows and SERVER in rows[0]._fields:  # the hot path's: which server answered (``functions.SERVER``)
            self.keys.serving(rows[0][-1])
        return rows

    @asynccontextmanager
    async def transaction(self, *, durable: bool = True) -> AsyncIterator[AsyncConnection]:
        """One transaction. Database failures become ``store_unavailable`` with no database text;
        a ``refuse`` commits the transaction (its ledger row) and is raised as its reason."""
        refusal: Reason | None = None
        try:
            async with self.engine.execution_options(isolation_level="READ COMMITTED").begin() as conn:
                if not durable:  # read-path ledger rows: losing the last few on a crash is acceptable
                    await conn.execute(text("SET LOCAL synchronous_commit = off"))
                try:
                    yield conn
                except _Refused as refused:
                    refusal = refused.reason
        except GovernedMemoryError:
            raise
        except IntegrityError:
            raise GovernedMemoryError(Reason.BAD_INPUT) from None
        except _DATABASE_ERRORS as error:
            raise self._unavailable(error) from None
        if refusal is not None:
            raise GovernedMemoryError(refusal) from None

    def _unavailable(self, error: BaseException) -> GovernedMemoryError:
        """``store_unavailable`` with its cause. A lost server (a failover, a restore, a restart) drops every
        kept keyring: the database that answers next may be behind the erasures the key store has seen, and a
        keyring kept from before could open rows it brought back (docs/privacy.md)."""
        cause = cause_of(error)
        if cause in _SERVER_LOST:
            self.keys.clear()
        return GovernedMemoryError(Reason.STORE_UNAVAILABLE, cause=cause)

    @asynccontextmanager
    async def checking(self, operation: str, *, scope_id: uuid.UUID) -> AsyncIterator[None]:
        """Checks on input before any transaction: a ``GovernedMemoryError`` raised inside is refused
        with a ledger row of its own."""
        try:
            yield
        except GovernedMemoryError as refused:
            async with self.transaction() as conn:
                await refuse(conn, operation, refused.reason, scope_id=scope_id)


async def record(
    conn: AsyncConnection,
    operation: str,
    result: Result,
    *,
    reason: Reason | None = None,
    scope_id: uuid.UUID | None = None,
    generation: int | None = None,
    count: int | None = None,
    entry_id: uuid.UUID | None = None,
    at: datetime | None = None,
    cause: Cause | None = None,
) -> None:
    """The content-free ledger row of an operation: codes, counts, opaque ids and a failure's content-free
    ``cause`` (a ``GovernedMemoryError``'s), never content."""
    row = {
        "at": at or clock.now(),
        "operation": operation,
        "result": result,
        "reason": reason.value if reason else None,
        "scope_id": scope_id,
        "generation": generation,
        "count": count,
        "entry_id": entry_id,
    }
    if cause and _CAUSE.fullmatch(cause):  # named only when there is one: a database below 0014 has no column
        row["cause"] = cause
    await conn.execute(insert(ledger).values(row))


_SERVER_LOST = frozenset(
    map(Cause, "connection_failure connection_refused server_shutdown server_unavailable read_only".split())
)
KEYS_DESTROYED = "governed_memory.keys_destroyed"  # set for a transaction that deletes entries whose keys are gone

_CAUSE = re.compile(r"[a-z0-9_]{1,32}")  # the ledger's cause column takes codes only (``ledger_cause_code``)


_READS = (Operation.STATUS, Operation.INSPECT)
_READ_LOCK = 0x52454144  # the advisory-lock class of a scope's control reads ("READ")


async def admit_read(conn: AsyncConnection, scope_id: uuid.UUID, at: datetime, per_hour: int) -> None:
    """Admit a control read of ``scope_id`` (``status``, ``inspect``) while fewer than ``per_hour`` were
    recorded in the hour before ``at``, counted from the ledger rows reads leave (their audit record) under a
    lock on the scope's reads. Refuses ``rate_limited`` and writes nothing: reads cannot fill the ledger."""
    await conn.execute(select(func.pg_advisory_xact_lock(_READ_LOCK, func.hashtext(str(scope_id)))))
    recent = await conn.scalar(
        select(func.count())
        .select_from(ledger)
        .where(
            ledger.c.scope_id == scope_id,
            ledger.c.operation.in_(_READS),
            ledger.c.result == Result.OK,
            ledger.c.at > at - timedelta(hours=1),
        )
    )
    if (recent or 0) >= per_hour:
        raise GovernedMemoryError(Reason.RATE_LIMITED)


async def refuse(
    conn: AsyncConnection,
    operation: str,
    reason: Reason,
    *,
    scope_id: uuid.UUID | None = None,
    generation: int | None = None,
    at: datetime | None = None,
) -> NoReturn:
    """Refuse with a ledger row: record ``reason`` against ``operation``, then raise it. The
    transaction still commits, the row with it, before ``Database.transaction`` raises the reason."""
    await record(conn, operation, Result.REFUSED, reason=reason, scope_id=scope_id, generation=generation, at=at)
    raise _Refused(reason)


def raise_refusal(rows: Sequence[Row[Any]]) -> None:
    """A database function's refusal, its ledger row committed with the call, raised as the reason it names.
    Such a function answers a refusal as its only row, in a ``refusal`` column (NULL when admitted)."""
    if rows and rows[0].refusal is not None:
        raise GovernedMemoryError(Reason(rows[0].refusal))


async def erasure_state(conn: AsyncConnection, scope_id: uuid.UUID, *, lock: bool) -> tuple[bool, Erasure | None]:
    """Whether the scope has a record, and where its last erasure stands (``None``: it has none); ``lock`` holds
    the scope's row until the transaction ends. The consent fence is not decided here but in the database
    (``governed_memory.fence``)."""
    query = select(scopes.c.erasure).where(scopes.c.scope_id == scope_id)
    if lock:
        query = query.with_for_update()
    row = (await conn.execute(query)).one_or_none()
    if row is None:
        return False, None
    return True, Erasure(row.erasure) if row.erasure else None
