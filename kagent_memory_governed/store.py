"""The governed store: the only module that issues SQL or opens a transaction.

Guarantees, each enforced inside the transaction that does the work:
- data-plane reads and writes carry a consent generation and are fenced against the durable scope
  record (missing, disabled, expired and stale consent are refused);
- expiry is authorization: every read binds ``expires_at > now`` from the application clock;
- a scope never holds more live entries than its cap, whatever the concurrency (writers lock the
  scope row, which also quiesces them against a withdrawal);
- every erasure fences first (disable, advance the generation), then deletes, then verifies in a
  fresh transaction; a failure leaves the scope disabled with a content-free record (R9);
- cost admission (rate, burst, hourly units) is decided under the same scope lock, before model work,
  in state every replica shares; destructive control tokens are accepted once per ``jti``;
- every operation leaves a content-free ledger row.
Every refusal and failure is a ``GovernedMemoryError`` whose reason code is its only text.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from typing import NoReturn

import asyncpg
from sqlalchemy import Row, case, delete, func, insert, literal, select, text, true, tuple_, update
from sqlalchemy.dialects.postgresql import JSON
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_dbapi
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.schema import CreateSchema

from kagent_memory_governed import admission, clock, redaction
from kagent_memory_governed.consent import Erasure, ScopeState, admit_generation, admit_label, fence, grant_refusal
from kagent_memory_governed.errors import GovernedMemoryError, Operation, Reason, Result
from kagent_memory_governed.policy import Policy, admit_embedding, admit_fact, expiry_seconds
from kagent_memory_governed.schema import SCHEMA, buckets, entries, ledger, replays, scopes, turns, usage
from kagent_memory_governed.scope import Principal, ScopeKey

MIN_SERVER_VERSION = 150000  # PostgreSQL 15
MIN_PGVECTOR = (0, 7, 0)
MAX_PAGE = 50
_TURN_NAMESPACE = uuid.UUID("5b0c7e1e-3f2a-4c55-9d7e-6b6d67000001")
_MIGRATION_LOCK = 0x6B6D6700  # advisory lock id: concurrent `migrate` runs serialize
_DATABASE_ERRORS = (
    SQLAlchemyError,
    AsyncAdapt_asyncpg_dbapi.Error,  # raised unwrapped when a connection dies inside an event hook
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    OSError,
    asyncio.TimeoutError,
)


@dataclass(frozen=True, slots=True)
class NewFact:
    text: str
    embedding: Sequence[float]


@dataclass(frozen=True, slots=True)
class Grant:
    generation: int
    max_expiry_seconds: int
    entry_cap: int


@dataclass(frozen=True, slots=True)
class ErasureRecord:
    at: datetime
    result: Erasure


@dataclass(frozen=True, slots=True)
class Status:
    enabled: bool
    generation: int
    purpose: str | None
    policy_version: str | None
    max_expiry_seconds: int
    entry_cap: int
    entries: int
    last_erasure: ErasureRecord | None


@dataclass(frozen=True, slots=True)
class Hit:
    entry_id: uuid.UUID
    text: str
    score: float
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Entry:
    entry_id: uuid.UUID
    text: str
    source_scope: str
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Page:
    entries: list[Entry]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class Erased:
    generation: int
    erased: int


@dataclass(frozen=True, slots=True)
class Offboarded:
    scopes: int
    erased: int


@dataclass(frozen=True, slots=True)
class Turn:
    """A conversation turn admitted under a scope and generation; ``recalled`` if it recalled memory."""

    invocation_id: str
    recalled: bool


def turn_ref(identifier: str) -> uuid.UUID:
    """The content-free reference under which a session or invocation id is recorded."""
    return uuid.uuid5(_TURN_NAMESPACE, identifier)


class _Refused(Exception):
    """Raised inside a transaction: commit what was recorded (the ledger row), then refuse."""

    def __init__(self, reason: Reason) -> None:
        self.reason = reason


_STATE_COLUMNS = (
    scopes.c.enabled,
    scopes.c.generation,
    scopes.c.consent_expires_at,
    scopes.c.erasure,
    scopes.c.max_expiry_seconds,
    scopes.c.entry_cap,
)


def _state(row: Row | None) -> ScopeState | None:
    if row is None:
        return None
    erasure = Erasure(row.erasure) if row.erasure else None
    return ScopeState(
        row.enabled, row.generation, row.consent_expires_at, erasure, row.max_expiry_seconds, row.entry_cap
    )


def _encode_cursor(key: ScopeKey, created_at: datetime, entry_id: uuid.UUID) -> str:
    micros = int(created_at.timestamp() * 1_000_000)
    raw = key.scope_id.bytes[:8] + micros.to_bytes(8, "big", signed=True) + entry_id.bytes
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(key: ScopeKey, cursor: object) -> tuple[datetime, uuid.UUID]:
    """A cursor only moves within the scope it was issued for; anything else is ``bad_input``."""
    if not isinstance(cursor, str) or len(cursor) != 43:
        raise GovernedMemoryError(Reason.BAD_INPUT)
    try:
        raw = base64.urlsafe_b64decode(cursor + "=")
    except (binascii.Error, ValueError):
        raise GovernedMemoryError(Reason.BAD_INPUT) from None
    if len(raw) != 32 or raw[:8] != key.scope_id.bytes[:8]:
        raise GovernedMemoryError(Reason.BAD_INPUT)
    micros = int.from_bytes(raw[8:16], "big", signed=True)
    try:
        created_at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
    except OverflowError:
        raise GovernedMemoryError(Reason.BAD_INPUT) from None
    return created_at, uuid.UUID(bytes=raw[16:])


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3] if part.isdigit())


class Store:
    """Governed memory over one PostgreSQL database. Create with ``Store.connect``; ``close`` when done."""

    def __init__(self, engine: AsyncEngine, policy: Policy) -> None:
        self._engine = engine
        self.policy = policy

    @classmethod
    def connect(
        cls,
        url: str,
        policy: Policy,
        *,
        pool_size: int = 5,
        max_overflow: int = 10,
        pool_timeout: float = 10.0,
        statement_timeout_ms: int = 15000,
        lock_timeout_ms: int = 10000,
    ) -> Store:
        """A store over ``url`` (``postgresql+asyncpg://``). Connections are opened lazily. Statement
        parameters never appear in logs or exception text, nor do result rows (``redaction``). A pool
        that stays exhausted, a statement or lock wait past its timeout: ``store_unavailable``."""
        redaction.install_log_boundary()
        engine = create_async_engine(
            url,
            hide_parameters=True,
            pool_size=pool_size,
            max_overflow=max_overflow,
            pool_timeout=pool_timeout,
            pool_pre_ping=True,
            connect_args={
                "command_timeout": 30,
                "server_settings": {
                    "application_name": "kagent-memory-governed",
                    "statement_timeout": str(statement_timeout_ms),
                    "lock_timeout": str(lock_timeout_ms),
                    "idle_in_transaction_session_timeout": "60000",
                },
            },
        )
        return cls(engine, policy)

    async def close(self) -> None:
        await self._engine.dispose()

    # -- transactions ---------------------------------------------------------------------------

    @asynccontextmanager
    async def _transaction(self, *, durable: bool = True) -> AsyncIterator[AsyncConnection]:
        """One transaction. Database failures become ``store_unavailable`` with no database text;
        a ``_Refused`` commits the transaction (its ledger row) and is raised as its reason."""
        refusal: Reason | None = None
        try:
            async with self._engine.begin() as conn:
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
        except _DATABASE_ERRORS:
            raise GovernedMemoryError(Reason.STORE_UNAVAILABLE) from None
        if refusal is not None:
            raise GovernedMemoryError(refusal) from None

    @staticmethod
    async def _record(
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
    ) -> None:
        await conn.execute(
            insert(ledger).values(
                at=at or clock.now(),
                operation=operation,
                result=result,
                reason=reason.value if reason else None,
                scope_id=scope_id,
                generation=generation,
                count=count,
                entry_id=entry_id,
            )
        )

    @classmethod
    async def _refuse(
        cls,
        conn: AsyncConnection,
        operation: str,
        reason: Reason,
        *,
        scope_id: uuid.UUID | None = None,
        generation: int | None = None,
        at: datetime | None = None,
    ) -> NoReturn:
        """Refuse with a ledger row: record ``reason`` against ``operation``, then raise it. The
        transaction still commits, the row with it, before ``_transaction`` raises the reason."""
        await cls._record(
            conn, operation, Result.REFUSED, reason=reason, scope_id=scope_id, generation=generation, at=at
        )
        raise _Refused(reason)

    @asynccontextmanager
    async def _checking(self, operation: str, *, scope_id: uuid.UUID) -> AsyncIterator[None]:
        """Checks on input before any transaction: a ``GovernedMemoryError`` raised inside is refused
        with a ledger row of its own."""
        try:
            yield
        except GovernedMemoryError as refused:
            async with self._transaction() as conn:
                await self._refuse(conn, operation, refused.reason, scope_id=scope_id)

    @staticmethod
    async def _scope_state(conn: AsyncConnection, scope_id: uuid.UUID, *, lock: bool) -> ScopeState | None:
        query = select(*_STATE_COLUMNS).where(scopes.c.scope_id == scope_id)
        if lock:
            query = query.with_for_update()
        return _state((await conn.execute(query)).one_or_none())

    # -- schema -----------------------------------------------------------------------------------

    async def migrate(self) -> str:
        """Create or upgrade the schema to head under an advisory lock; returns the revision.
        Refuses (``unsupported_database``) PostgreSQL older than 15 or pgvector older than 0.7."""
        from alembic import command
        from alembic.config import Config

        def upgrade(sync_conn) -> None:  # alembic is synchronous; it runs on this connection
            config = Config()
            config.set_main_option("script_location", str(files("kagent_memory_governed") / "migrations"))
            config.attributes["connection"] = sync_conn
            command.upgrade(config, "head")

        async with self._transaction() as conn:
            await conn.execute(select(func.pg_advisory_xact_lock(_MIGRATION_LOCK)))
            await self._check_server(conn)
            await conn.execute(text("CREATE EXTENSION IF NOT EXISTS vector"))
            installed = await conn.scalar(text("SELECT extversion FROM pg_extension WHERE extname = 'vector'"))
            if _version_tuple(installed) < MIN_PGVECTOR:  # only then: updating needs the extension's owner
                await conn.execute(text("ALTER EXTENSION vector UPDATE"))
            await conn.execute(CreateSchema(SCHEMA, if_not_exists=True))
            await conn.run_sync(upgrade)
        return await self.revision()

    @staticmethod
    def head_revision() -> str:
        """The schema revision this package's migrations lead to."""
        from alembic.script import ScriptDirectory

        return ScriptDirectory(str(files("kagent_memory_governed") / "migrations")).get_current_head()

    async def revision(self) -> str | None:
        """The schema revision in the database, or ``None`` before the first migration."""
        from alembic.migration import MigrationContext

        def current(sync_conn) -> str | None:  # alembic is synchronous; it reads on this connection
            return MigrationContext.configure(sync_conn, opts={"version_table_schema": SCHEMA}).get_current_revision()

        async with self._transaction() as conn:
            return await conn.run_sync(current)

    async def check_ready(self) -> None:
        """Refuse to serve unless the server and pgvector are supported (``unsupported_database``) and the
        schema and installed pgvector are what this package migrates to (``schema_outdated``: run ``migrate``)."""
        async with self._transaction() as conn:
            await self._check_server(conn)
            installed = await conn.scalar(
                text("SELECT installed_version FROM pg_available_extensions WHERE name = 'vector'")
            )
        if installed is None or _version_tuple(installed) < MIN_PGVECTOR:
            raise GovernedMemoryError(Reason.SCHEMA_OUTDATED)
        if await self.revision() != self.head_revision():
            raise GovernedMemoryError(Reason.SCHEMA_OUTDATED)

    @staticmethod
    async def _check_server(conn: AsyncConnection) -> None:
        """PostgreSQL 15 or newer with pgvector 0.7 or newer available."""
        server = int(await conn.scalar(text("SHOW server_version_num")))
        vector = await conn.scalar(text("SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"))
        if server < MIN_SERVER_VERSION or vector is None or _version_tuple(vector) < MIN_PGVECTOR:
            raise GovernedMemoryError(Reason.UNSUPPORTED_DATABASE)

    # -- consent ----------------------------------------------------------------------------------

    async def grant(
        self, key: ScopeKey, *, purpose: str, policy_version: str, valid_until: datetime | None = None
    ) -> Grant:
        """Enable ``key`` for a purpose under a policy version and advance its generation (R6, R7).
        Refuses ``bad_input`` labels and, while an erasure is unfinished, ``erasure_pending``/``erasure_failed``."""
        sid = key.scope_id
        async with self._checking(Operation.GRANT, scope_id=sid):
            admit_label(purpose)
            admit_label(policy_version)
            if valid_until is not None and valid_until.tzinfo is None:
                raise GovernedMemoryError(Reason.BAD_INPUT)
        now = clock.now()
        async with self._transaction() as conn:
            await conn.execute(
                pg_insert(scopes)
                .values(
                    scope_id=sid,
                    principal=key.principal.mxid,
                    origin=key.principal.origin.value,
                    agent=str(key.agent),
                    scope_kind=key.room.kind.value,
                    room=key.room.room_id,
                    enabled=False,
                    generation=0,
                    max_expiry_seconds=self.policy.max_expiry_seconds,
                    entry_cap=self.policy.entry_cap,
                    resume=False,
                    updated_at=now,
                )
                .on_conflict_do_nothing(index_elements=[scopes.c.scope_id])
            )
            refusal = grant_refusal(await self._scope_state(conn, sid, lock=True))
            if refusal is not None:
                await self._refuse(conn, Operation.GRANT, refusal, scope_id=sid, at=now)
            generation = await conn.scalar(
                update(scopes)
                .where(scopes.c.scope_id == sid)
                .values(
                    enabled=True,
                    generation=scopes.c.generation + 1,
                    purpose=purpose,
                    policy_version=policy_version,
                    consented_at=now,
                    consent_expires_at=valid_until,
                    max_expiry_seconds=self.policy.max_expiry_seconds,
                    entry_cap=self.policy.entry_cap,
                    resume=False,
                    updated_at=now,
                )
                .returning(scopes.c.generation)
            )
            await self._record(conn, Operation.GRANT, Result.OK, scope_id=sid, generation=generation, at=now)
        return Grant(generation, self.policy.max_expiry_seconds, self.policy.entry_cap)

    async def status(self, key: ScopeKey) -> Status:
        """The scope's consent, effective limits, live entry count and last erasure (R10)."""
        sid = key.scope_id
        now = clock.now()
        live = (
            select(func.count())
            .select_from(entries)
            .where(entries.c.scope_id == sid, entries.c.expires_at > now)
            .scalar_subquery()
        )
        async with self._transaction(durable=False) as conn:
            row = (
                await conn.execute(
                    select(
                        scopes.c.enabled,
                        scopes.c.generation,
                        scopes.c.purpose,
                        scopes.c.policy_version,
                        scopes.c.max_expiry_seconds,
                        scopes.c.entry_cap,
                        scopes.c.erasure,
                        scopes.c.erasure_at,
                        live.label("live"),
                    ).where(scopes.c.scope_id == sid)
                )
            ).one_or_none()
            await self._record(conn, Operation.STATUS, Result.OK, scope_id=sid, at=now)
        if row is None:
            return Status(False, 0, None, None, self.policy.max_expiry_seconds, self.policy.entry_cap, 0, None)
        last = ErasureRecord(row.erasure_at, Erasure(row.erasure)) if row.erasure else None
        return Status(
            row.enabled,
            row.generation,
            row.purpose,
            row.policy_version,
            min(row.max_expiry_seconds, self.policy.max_expiry_seconds),
            min(row.entry_cap, self.policy.entry_cap),
            row.live,
            last,
        )

    # -- data plane (fenced by generation) --------------------------------------------------------

    async def admit(
        self, key: ScopeKey, generation: int, operation: str, *, units: int = 0, explicit: bool = False
    ) -> None:
        """Admit memory work before any model or embedding call (R21-R26), in one transaction shared by
        every replica: the consent fence, then (``explicit``) the sender/agent rate limit, then ``units``
        of the scope's hourly ceiling. Admitted work is recorded as used; refused work is not.
        Refuses ``consent_*``, ``rate_limited`` and ``hourly_ceiling``. ``write`` and ``search`` fence
        again in their own transaction: admission is a gate, not the fence."""
        sid = key.scope_id
        async with self._checking(operation, scope_id=sid):
            admit_generation(generation)
            if isinstance(units, bool) or not isinstance(units, int) or not 0 <= units <= self.policy.entry_cap:
                raise GovernedMemoryError(Reason.BAD_INPUT)
        now = clock.now()
        bucket_id = key.sender_agent_id
        async with self._transaction() as conn:
            # each count below is its own statement, so it sees what earlier lock holders committed
            refusal = fence(await self._scope_state(conn, sid, lock=True), generation, now)
            tokens = 0.0
            if refusal is None and explicit:
                tokens, recent = await self._bucket(conn, bucket_id, now)
                refusal = admission.explicit_refusal(tokens, recent, self.policy)
            if refusal is None and units:
                used = await conn.scalar(
                    select(func.coalesce(func.sum(usage.c.units), 0)).where(
                        usage.c.subject_id == sid, usage.c.kind == "hourly", usage.c.at > now - admission.HOUR
                    )
                )
                refusal = admission.hourly_refusal(used, units, self.policy)
            if refusal is not None:
                await self._refuse(conn, operation, refusal, scope_id=sid, generation=generation, at=now)
            if explicit:
                await conn.execute(
                    update(buckets).where(buckets.c.bucket_id == bucket_id).values(tokens=tokens - 1.0, updated_at=now)
                )
            spent = [{"subject_id": bucket_id, "kind": "explicit", "at": now, "units": 1}] if explicit else []
            spent += [{"subject_id": sid, "kind": "hourly", "at": now, "units": units}] if units else []
            if spent:
                await conn.execute(insert(usage), spent)

    async def _bucket(self, conn: AsyncConnection, bucket_id: uuid.UUID, now: datetime) -> tuple[float, int]:
        """The sender/agent bucket's tokens at ``now`` (its row locked) and its operations in the rolling minute."""
        row = (
            await conn.execute(
                pg_insert(buckets)
                .values(bucket_id=bucket_id, tokens=float(self.policy.explicit_burst), updated_at=now)
                .on_conflict_do_update(index_elements=[buckets.c.bucket_id], set_={"bucket_id": bucket_id})
                .returning(buckets.c.tokens, buckets.c.updated_at)
            )
        ).one()
        recent = await conn.scalar(
            select(func.count()).where(
                usage.c.subject_id == bucket_id, usage.c.kind == "explicit", usage.c.at > now - admission.MINUTE
            )
        )
        return admission.refill(admission.Bucket(row.tokens, row.updated_at), now, self.policy), recent

    async def write(
        self, key: ScopeKey, generation: int, facts: Sequence[NewFact], *, expires_in: int | None = None
    ) -> list[uuid.UUID]:
        """Store ``facts`` in ``key`` under consent ``generation``, all or none; returns their entry ids.
        A fact equal to a live entry of the scope (whitespace normalized) is not stored again: its id is
        the live entry's, whose expiry does not move. The ledger counts the entries actually added.

        Refuses ``bad_input``, ``fact_too_large``, a fenced-off generation (``consent_*``) and
        ``entry_cap_reached`` when the live entries plus these would pass the cap (never evicts).
        Expiry is ``min(expires_in, policy maximum, maximum consented to)`` from the application clock.
        """
        sid = key.scope_id
        async with self._checking(Operation.WRITE, scope_id=sid):
            admit_generation(generation)
            if not facts or len(facts) > self.policy.entry_cap:
                raise GovernedMemoryError(Reason.BAD_INPUT)
            admitted = [(admit_fact(f.text, self.policy), admit_embedding(f.embedding)) for f in facts]
        now = clock.now()
        texts = list(dict.fromkeys(fact for fact, _ in admitted))
        async with self._transaction() as conn:
            state = await self._scope_state(conn, sid, lock=True)
            refusal = fence(state, generation, now)
            if refusal is None:
                # counted after the lock; a fact equal to a live entry keeps that entry and its expiry (R36)
                live, known = (
                    await conn.execute(
                        select(
                            func.count(),
                            func.json_object_agg(entries.c.text, entries.c.entry_id, type_=JSON).filter(
                                entries.c.text.in_(texts)
                            ),
                        ).where(entries.c.scope_id == sid, entries.c.expires_at > now)
                    )
                ).one()
                known = {text: uuid.UUID(entry_id) for text, entry_id in (known or {}).items()}
                new: dict[str, list[float]] = {}
                for fact, vector in admitted:
                    if fact not in known:
                        new.setdefault(fact, vector)
                if new and live + len(new) > min(state.entry_cap, self.policy.entry_cap):
                    refusal = Reason.ENTRY_CAP_REACHED
            if refusal is not None:
                await self._refuse(conn, Operation.WRITE, refusal, scope_id=sid, generation=generation, at=now)
            lifetime = timedelta(seconds=expiry_seconds(expires_in, self.policy, state.max_expiry_seconds))
            known |= {fact: uuid.uuid4() for fact in new}
            if new:
                await conn.execute(
                    insert(entries),
                    [
                        {
                            "scope_id": sid,
                            "entry_id": known[fact],
                            "text": fact,
                            "embedding": vector,
                            "generation": generation,
                            "created_at": now,
                            "expires_at": now + lifetime,
                        }
                        for fact, vector in new.items()
                    ],
                )
            await self._record(
                conn, Operation.WRITE, Result.OK, scope_id=sid, generation=generation, count=len(new), at=now
            )
        return [known[fact] for fact, _ in admitted]

    async def search(
        self, key: ScopeKey, generation: int, embedding: Sequence[float], *, top_k: int = 5, min_score: float = 0.0
    ) -> list[Hit]:
        """The ``top_k`` live entries of ``key`` nearest to ``embedding`` by exact cosine similarity,
        each scoring at least ``min_score``. The fence and the entries are read in one statement,
        so one snapshot decides both. Refuses ``bad_input`` and a fenced-off generation."""
        sid = key.scope_id
        async with self._checking(Operation.SEARCH, scope_id=sid):
            admit_generation(generation)
            query = admit_embedding(embedding)
            if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= self.policy.entry_cap:
                raise GovernedMemoryError(Reason.BAD_INPUT)
            if not -1.0 <= float(min_score) <= 1.0:
                raise GovernedMemoryError(Reason.BAD_INPUT)
        now = clock.now()
        distance = entries.c.embedding.cosine_distance(query)
        hits = (
            select(
                entries.c.entry_id,
                entries.c.text,
                entries.c.created_at,
                entries.c.expires_at,
                distance.label("distance"),
            )
            .where(entries.c.scope_id == scopes.c.scope_id, entries.c.expires_at > now, distance <= 1.0 - min_score)
            .order_by(distance, entries.c.entry_id)
            .limit(top_k)
            .lateral("hits")
        )
        statement = (
            select(*_STATE_COLUMNS, hits)
            .select_from(scopes.outerjoin(hits, true()))
            .where(scopes.c.scope_id == sid)
            .order_by(hits.c.distance, hits.c.entry_id)
        )
        async with self._transaction(durable=False) as conn:
            rows = (await conn.execute(statement)).all()
            refusal = fence(_state(rows[0]) if rows else None, generation, now)
            if refusal is not None:
                await self._refuse(conn, Operation.SEARCH, refusal, scope_id=sid, generation=generation, at=now)
            found = [
                Hit(r.entry_id, r.text, 1.0 - r.distance, r.created_at, r.expires_at)
                for r in rows
                if r.entry_id is not None
            ]
            await self._record(
                conn, Operation.SEARCH, Result.OK, scope_id=sid, generation=generation, count=len(found), at=now
            )
        return found

    # -- conversation turns (auto-save input, R36) --------------------------------------------------

    async def record_turn(
        self, key: ScopeKey, generation: int, session_id: str, invocation_id: str, *, recalled: bool
    ) -> int:
        """Record that a turn of ``session_id`` ran admitted under consent ``generation`` (a no-op when the
        fence refuses it: such a turn is never collected); returns how many admitted turns of that session
        under that generation await auto-save. Only references derived from the ids are stored."""
        sid = key.scope_id
        admit_generation(generation)
        session = turn_ref(session_id)
        now = clock.now()
        async with self._transaction(durable=False) as conn:
            if fence(await self._scope_state(conn, sid, lock=False), generation, now) is not None:
                return 0
            await conn.execute(
                pg_insert(turns)
                .values(
                    scope_id=sid,
                    session_ref=session,
                    invocation_ref=turn_ref(invocation_id),
                    generation=generation,
                    recalled=recalled,
                    at=now,
                )
                .on_conflict_do_update(
                    index_elements=[turns.c.scope_id, turns.c.session_ref, turns.c.invocation_ref],
                    set_={"recalled": turns.c.recalled | recalled},
                )
            )
            return await conn.scalar(
                select(func.count()).where(
                    turns.c.scope_id == sid, turns.c.session_ref == session, turns.c.generation == generation
                )
            )

    async def collect_turns(
        self, key: ScopeKey, generation: int, session_id: str, candidates: Sequence[str]
    ) -> list[Turn]:
        """Take, once, the turns among ``candidates`` (invocation ids) of ``session_id`` that were admitted
        under ``generation``; turns of that session recorded under any other generation are discarded, so
        nothing said before an erasure or a withdrawal is ever collected. Fenced: refuses ``consent_*``."""
        sid = key.scope_id
        admit_generation(generation)
        refs = {turn_ref(invocation): invocation for invocation in candidates}
        now = clock.now()
        async with self._transaction() as conn:
            refusal = fence(await self._scope_state(conn, sid, lock=False), generation, now)
            if refusal is not None:
                await self._refuse(conn, Operation.COLLECT, refusal, scope_id=sid, generation=generation, at=now)
            this_session = [turns.c.scope_id == sid, turns.c.session_ref == turn_ref(session_id)]
            await conn.execute(delete(turns).where(*this_session, turns.c.generation != generation))
            taken = (
                await conn.execute(
                    delete(turns)
                    .where(*this_session, turns.c.invocation_ref.in_(list(refs)))
                    .returning(turns.c.invocation_ref, turns.c.recalled)
                )
            ).all()
            await self._record(
                conn, Operation.COLLECT, Result.OK, scope_id=sid, generation=generation, count=len(taken), at=now
            )
        return [Turn(refs[row.invocation_ref], row.recalled) for row in taken]

    # -- control plane (the subject's own requests; not fenced by generation) ---------------------

    async def inspect(self, key: ScopeKey, *, limit: int = MAX_PAGE, cursor: str | None = None) -> Page:
        """One page of the live entries of ``key``, oldest first, with a cursor for the next (R11).
        Refuses ``bad_input`` for a limit outside 1..50 and for a cursor not issued for this scope."""
        sid = key.scope_id
        async with self._checking(Operation.INSPECT, scope_id=sid):
            if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
                raise GovernedMemoryError(Reason.BAD_INPUT)
            after = _decode_cursor(key, cursor) if cursor is not None else None
        now = clock.now()
        query = (
            select(entries.c.entry_id, entries.c.text, entries.c.created_at, entries.c.expires_at)
            .where(entries.c.scope_id == sid, entries.c.expires_at > now)
            .order_by(entries.c.created_at, entries.c.entry_id)
            .limit(limit + 1)
        )
        if after is not None:
            query = query.where(tuple_(entries.c.created_at, entries.c.entry_id) > tuple_(*after))
        async with self._transaction(durable=False) as conn:
            rows = (await conn.execute(query)).all()
            await self._record(conn, Operation.INSPECT, Result.OK, scope_id=sid, count=min(len(rows), limit), at=now)
        page = [Entry(r.entry_id, r.text, str(key.room), r.created_at, r.expires_at) for r in rows[:limit]]
        more = len(rows) > limit
        return Page(page, _encode_cursor(key, page[-1].created_at, page[-1].entry_id) if more else None)

    async def forget(self, key: ScopeKey, entry_id: uuid.UUID) -> Erased:
        """Erase exactly one entry and verify it unreadable (R12). Fences like every erasure: the
        generation advances, so stale work cannot re-add what was forgotten. Refuses ``not_found``
        (no such entry in this scope) and, during an unfinished erasure, ``erasure_pending``/``erasure_failed``."""
        async with self._checking(Operation.FORGET, scope_id=key.scope_id):
            if not isinstance(entry_id, uuid.UUID):
                raise GovernedMemoryError(Reason.BAD_INPUT)
        return await self._erase(key.scope_id, Operation.FORGET, entry_id=entry_id, resume=True)

    async def forget_all(self, key: ScopeKey) -> Erased:
        """Erase every entry of ``key`` and verify none is left; consent stays as it was (R13).
        Also completes an unfinished erasure."""
        return await self._erase(key.scope_id, Operation.FORGET_ALL, entry_id=None, resume=True)

    async def off(self, key: ScopeKey) -> Erased:
        """Withdraw consent, first (disable and advance the generation in one statement), then erase
        and verify (R8, R13). The scope stays disabled until a new grant."""
        return await self._erase(key.scope_id, Operation.OFF, entry_id=None, resume=False)

    async def offboard(self, principal: Principal) -> Offboarded:
        """Disable every scope of ``principal`` (all agents, all rooms) in one statement, then erase and
        verify each (R29). Raises ``erasure_failed`` if any scope could not be verified; those stay disabled."""
        now = clock.now()
        async with self._transaction() as conn:
            fenced = (
                await conn.execute(
                    update(scopes)
                    .where(scopes.c.principal == principal.mxid, scopes.c.origin == principal.origin.value)
                    .values(self._fenced_values(now, resume=False))
                    .returning(scopes.c.scope_id, scopes.c.generation)
                )
            ).all()
            await self._record(conn, Operation.OFFBOARD_FENCE, Result.OK, count=len(fenced), at=now)
        erased, failed = 0, 0
        for sid, generation in sorted(fenced):
            try:
                erased += await self._clear(sid, generation, Operation.OFFBOARD, entry_id=None)
            except GovernedMemoryError:
                failed += 1
        if failed:
            with suppress(GovernedMemoryError):
                async with self._transaction() as conn:
                    await self._record(
                        conn, Operation.OFFBOARD, Result.FAILED, reason=Reason.ERASURE_FAILED, count=failed
                    )
            raise GovernedMemoryError(Reason.ERASURE_FAILED)
        async with self._transaction() as conn:
            await self._record(conn, Operation.OFFBOARD, Result.OK, count=len(fenced))
        return Offboarded(len(fenced), erased)

    async def sweep(self, *, batch: int = 5000) -> int:
        """Physically delete every expired entry (R19); returns how many. Also deletes, in batches, ledger
        records older than ``ledger_retention_days`` (a scope's last erasure stays on its scope row).
        Safe to run on every replica."""
        now = clock.now()
        total = 0
        while True:
            doomed = (
                select(entries.c.scope_id, entries.c.entry_id)
                .where(entries.c.expires_at <= now)
                .limit(batch)
                .with_for_update(skip_locked=True)
            )
            async with self._transaction() as conn:
                result = await conn.execute(
                    delete(entries).where(tuple_(entries.c.scope_id, entries.c.entry_id).in_(doomed))
                )
                total += result.rowcount
            if result.rowcount < batch:
                break
        retained = now - timedelta(days=self.policy.ledger_retention_days)
        while True:
            aged = (
                select(ledger.c.ledger_id).where(ledger.c.at < retained).limit(batch).with_for_update(skip_locked=True)
            )
            async with self._transaction() as conn:
                pruned = (await conn.execute(delete(ledger).where(ledger.c.ledger_id.in_(aged)))).rowcount
            if pruned < batch:
                break
        async with self._transaction() as conn:
            await conn.execute(delete(replays).where(replays.c.expires_at <= now))
            await conn.execute(delete(usage).where(usage.c.at <= now - admission.HOUR))
            # turns can only be collected under their scope's current generation, and not after the ceiling
            await conn.execute(
                delete(turns).where(
                    turns.c.scope_id == scopes.c.scope_id,
                    (turns.c.generation != scopes.c.generation)
                    | (turns.c.at <= now - timedelta(seconds=self.policy.max_expiry_seconds)),
                )
            )
            await self._record(conn, Operation.SWEEP, Result.OK, count=total, at=now)
        return total

    async def claim_once(self, jti: str, valid_until: datetime) -> None:
        """Accept a token id once, on every replica; a second claim is ``assertion_replayed``.
        The record is kept until ``valid_until`` (the token's expiry plus leeway), then swept."""
        async with self._transaction() as conn:
            claimed = await conn.scalar(
                pg_insert(replays)
                .values(jti=jti, expires_at=valid_until)
                .on_conflict_do_nothing(index_elements=[replays.c.jti])
                .returning(replays.c.jti)
            )
            if claimed is None:
                await self._refuse(conn, Operation.CLAIM, Reason.ASSERTION_REPLAYED)

    # -- erasure ----------------------------------------------------------------------------------

    @staticmethod
    def _fenced_values(now: datetime, *, resume: bool) -> dict:
        """Disable and advance the generation in one statement. ``resume`` re-enables after
        verification only if the scope was enabled (or was resuming from an unfinished erasure)."""
        interrupted = scopes.c.erasure.in_([Erasure.PENDING.value, Erasure.FAILED.value])
        return {
            "enabled": False,
            "generation": scopes.c.generation + 1,
            "erasure": Erasure.PENDING.value,
            "erasure_at": now,
            "resume": case((scopes.c.enabled, True), (interrupted, scopes.c.resume), else_=False)
            if resume
            else literal(False),
            "updated_at": now,
        }

    async def _erase(self, sid: uuid.UUID, operation: Operation, *, entry_id: uuid.UUID | None, resume: bool) -> Erased:
        now = clock.now()
        async with self._transaction() as conn:
            state = await self._scope_state(conn, sid, lock=True)
            if entry_id is not None:
                refusal = grant_refusal(state)  # an unfinished erasure first, as for a grant
                held = select(literal(True)).where(entries.c.scope_id == sid, entries.c.entry_id == entry_id)
                if refusal is None and (state is None or not await conn.scalar(held)):
                    refusal = Reason.NOT_FOUND
                if refusal is not None:
                    await self._refuse(conn, operation, refusal, scope_id=sid, at=now)
            if state is None:  # never consented: nothing to fence or erase
                await self._record(conn, operation, Result.OK, scope_id=sid, count=0, at=now)
                return Erased(0, 0)
            generation = await conn.scalar(
                update(scopes)
                .where(scopes.c.scope_id == sid)
                .values(self._fenced_values(now, resume=resume))
                .returning(scopes.c.generation)
            )
        return Erased(generation, await self._clear(sid, generation, operation, entry_id=entry_id))

    async def _clear(self, sid: uuid.UUID, generation: int, operation: Operation, *, entry_id: uuid.UUID | None) -> int:
        """Delete, verify in a fresh transaction, then settle the fenced scope. Any failure leaves it
        disabled with ``erasure = failed`` and raises ``erasure_failed`` (R9)."""
        target = [entries.c.scope_id == sid]
        if entry_id is not None:
            target.append(entries.c.entry_id == entry_id)
        try:
            async with self._transaction() as conn:
                erased = (await conn.execute(delete(entries).where(*target))).rowcount
            async with self._transaction() as conn:
                remaining = await conn.scalar(select(func.count()).select_from(entries).where(*target))
            if remaining:
                raise GovernedMemoryError(Reason.ERASURE_FAILED)
            now = clock.now()
            async with self._transaction() as conn:
                await conn.execute(
                    update(scopes)
                    .where(scopes.c.scope_id == sid, scopes.c.generation == generation)
                    .values(enabled=scopes.c.resume, erasure=Erasure.VERIFIED.value, erasure_at=now, updated_at=now)
                )
                await self._record(
                    conn,
                    operation,
                    Result.OK,
                    scope_id=sid,
                    generation=generation,
                    count=erased,
                    entry_id=entry_id,
                    at=now,
                )
            return erased
        except Exception:  # whatever failed, the scope stays disabled (R9)
            await self._mark_failed(sid, generation, operation, entry_id)
            raise GovernedMemoryError(Reason.ERASURE_FAILED) from None

    async def _mark_failed(
        self, sid: uuid.UUID, generation: int, operation: Operation, entry_id: uuid.UUID | None
    ) -> None:
        """Best effort: if the database is gone too, the scope stays ``pending``, which is just as disabled."""
        now = clock.now()
        with suppress(GovernedMemoryError):
            async with self._transaction() as conn:
                await conn.execute(
                    update(scopes)
                    .where(scopes.c.scope_id == sid, scopes.c.generation == generation)
                    .values(enabled=False, erasure=Erasure.FAILED.value, erasure_at=now, updated_at=now)
                )
                await self._record(
                    conn,
                    operation,
                    Result.FAILED,
                    reason=Reason.ERASURE_FAILED,
                    scope_id=sid,
                    generation=generation,
                    entry_id=entry_id,
                    at=now,
                )


__all__ = [
    "MAX_PAGE",
    "Entry",
    "Erased",
    "ErasureRecord",
    "Grant",
    "Hit",
    "NewFact",
    "Offboarded",
    "Page",
    "Status",
    "Store",
    "Turn",
]
