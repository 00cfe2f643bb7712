"""The governed store: the only package that issues SQL or opens a transaction.

Guarantees, each enforced inside the transaction that does the work:
- data-plane reads and writes carry a consent generation and are fenced against the durable scope
  record (missing, disabled, expired and stale consent are refused);
- expiry is authorization: every read binds ``expires_at > now`` from the application clock;
- a scope never holds more live entries than its cap, whatever the concurrency (writers lock the
  scope row, which also quiesces them against a withdrawal);
- every erasure fences first (disable, advance the generation), then deletes, then verifies in a
  fresh transaction; a failure leaves the scope disabled with a content-free record (R9), and an
  interrupted erasure is completed by ``sweep`` and by the scope's next operation, never assumed;
- cost admission (rate, burst, hourly units) is decided under the same scope lock, before model work,
  in state every replica shares; destructive control tokens are accepted once per ``jti``;
- every operation leaves a content-free ledger row;
- entries are stored only sealed, each under a key of its own held in a key store outside the database
  (``kagent_memory_governed.keys``); every erasure destroys the keys it covers, and verifies them gone, before
  it deletes, so no copy of the database can be read back once it is verified (R42).
Every refusal and failure is a ``GovernedMemoryError`` whose reason code is its only text.

The hot path (admit, write, search, the conversation turns) is one statement each, in one round trip: a
database function (``store/sql``) that fences, does the work and records it in its own transaction.
An erasure is three: the scope's generation against the key store's record, the fence's statement, then (after
the key store has destroyed the erased keys) one call of a procedure that deletes, verifies and settles.

``Store`` is the facade; behind it, one module a concern:

    connection     the database URL and libpq's TLS parameters, checked once
    database       one-statement calls, transactions, error mapping, the ledger row, refusing with one
    functions      the hot path's database function calls, built once
    schema_admin   migrate, revision, readiness (alembic)
    grants         grant, status: a scope's consent as the store keeps it
    admission      cost admission, single-use control tokens
    data           write, search, inspect
    entry_format   an entry sealed under its own key and opened (the stored format, its version)
    ranking        the exact rank of opened entries, in the process
    keyrings       the keyrings kept per consent generation
    turns          conversation turns for auto-save
    plane          the data plane over the store: admit, embed, then search or write, one call an operation
    erasure        forget, forget_all, off, offboard: fence, destroy keys, delete, verify, settle; completing
                   interrupted ones
    maintenance    sweep
    binding        the key store bound to its database
    reconcile      a database behind the key store's last erasure (a failover, a restore), brought forward
    replication    what the primary's replication means for erasures
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from kagent_memory_governed import redaction
from kagent_memory_governed.consent import Erasure
from kagent_memory_governed.embedding import Embedder
from kagent_memory_governed.errors import Reason
from kagent_memory_governed.keys import KeyStore
from kagent_memory_governed.policy import Policy, admit_int
from kagent_memory_governed.scope import Principal, ScopeKey
from kagent_memory_governed.service.values import Embedding, Fact
from kagent_memory_governed.store import admission, connection, data, erasure, grants, maintenance, schema_admin, turns
from kagent_memory_governed.store.database import Database, create_engine
from kagent_memory_governed.store.erasure import caught_up
from kagent_memory_governed.store.keyrings import Keyrings
from kagent_memory_governed.store.plane import LocalPlane
from kagent_memory_governed.store.replication import replication as read_replication
from kagent_memory_governed.store.values import (
    MAX_PAGE,
    Entry,
    Erased,
    ErasureRecord,
    Grant,
    Hit,
    NewFact,
    Offboarded,
    Page,
    Status,
    Turn,
    turn_ref,
)


class Store:
    """Governed memory over one PostgreSQL database. Create with ``Store.connect``; ``close`` when done."""

    def __init__(self, engine: AsyncEngine, policy: Policy, keys: KeyStore) -> None:
        self._db = Database(engine, policy, Keyrings(keys))

    @property
    def key_store(self) -> KeyStore:
        """Where this store's entry keys live (``kagent_memory_governed.keys``)."""
        return self._db.keys.store

    @property
    def policy(self) -> Policy:
        return self._db.policy

    @property
    def _engine(self) -> AsyncEngine:  # tests and benchmarks inject faults through it; package code never does
        return self._db.engine

    @classmethod
    def connect(
        cls,
        url: str,
        policy: Policy,
        *,
        keys: KeyStore,
        pool_size: int = 5,
        max_overflow: int = 10,
        pool_timeout: float = 10.0,
        statement_timeout_ms: int = 15000,
        lock_timeout_ms: int = 10000,
    ) -> Store:
        """A store over ``url`` (``postgresql+asyncpg://``; libpq's TLS, ``connect_timeout``, multi-host and
        ``target_session_attrs`` parameters with libpq's meaning: ``connection``; a bad one is a ``ConfigurationError``
        naming it), alike direct and behind a transaction pooler (docs/operator.md). Opened lazily. Parameters and
        result rows never appear in logs or exception text (``redaction``). An exhausted pool, a connection attempt
        past ``connect_timeout``, a statement or lock wait past its timeout (``connection.Bounds``):
        ``store_unavailable (timeout)``. No pre-ping: a connection known closed is replaced at checkout.

        Entries are sealed under keys held in ``keys``, a key store outside the database (built by the caller from
        its configuration: ``embedded.key_store`` for the settings, ``keys.from_url``)."""
        database = connection.parse(url)
        bounds = connection.Bounds(statement_timeout_ms, lock_timeout_ms)  # ValueError unless whole ms, >= 1
        redaction.install_log_boundary()
        pool = {"pool_size": pool_size, "max_overflow": max_overflow, "pool_timeout": pool_timeout}
        return cls(create_engine(database, pool, bounds), policy, keys)

    async def close(self) -> None:
        await self._db.engine.dispose()
        await self._db.keys.store.close()

    def plane(self, embedder: Embedder | None = None) -> LocalPlane:
        """The data plane over this store in this process (``service.plane.DataPlane``), embedding with ``embedder``
        (or, once set, the Agent's ``memory.embedding``)."""
        return LocalPlane(self, embedder)

    def drop_kept_keyrings(self) -> None:
        """Keep no keyring: after the database was changed behind the store (restored in place, emptied by a test)."""
        self._db.keys.clear()

    def limit_expiry(self, seconds: int) -> None:
        """Lower the expiry ceiling of every later grant, write and status (an Agent's ``memory.ttlDays``):
        the stricter of this and the policy wins; it never raises the ceiling."""
        ceiling = min(self._db.policy.max_expiry_seconds, admit_int(seconds, low=1, high=2**63 - 1))
        self._db = replace(self._db, policy=self._db.policy.model_copy(update={"max_expiry_seconds": ceiling}))

    # -- schema -------------------------------------------------------------------------------------

    async def migrate(self, to: str = "head") -> str:
        """Create or upgrade the schema to ``to`` (default head; an older revision downgrades) under an
        advisory lock, then seal every entry an earlier version stored in plain text (its key in the key store);
        returns the revision. Refuses (``unsupported_database``) PostgreSQL older than 15 or
        pgvector older than 0.7 (``extension_missing`` when this role may not create it), a database newer
        than this package (``schema_newer``) and an unknown revision (``bad_input``)."""
        return await schema_admin.migrate(self._db, to)

    async def revision(self) -> str | None:
        """The schema revision in the database, or ``None`` before the first migration."""
        return await schema_admin.revision(self._db)

    @staticmethod
    def head_revision() -> str:
        """The schema revision this package's migrations lead to."""
        return schema_admin.head_revision()

    async def check_ready(self) -> None:
        """Refuse to serve unless the server and pgvector are supported (``unsupported_database``) and the
        schema and installed pgvector are what this package migrates to (``schema_missing``, ``schema_newer``,
        ``schema_outdated``: run ``migrate``)."""
        await schema_admin.check_ready(self._db)

    async def replication(self) -> tuple[str, str]:
        """The primary's replication, its kind and one content-free line on erasures (``store/replication``)."""
        found = await read_replication(self._db)
        return found.kind.value, found.line

    async def unfinished_erasures(self) -> dict[Erasure, int]:
        """How many scopes of the database have an erasure ``pending`` or ``failed``: counts, for the health
        gauges. Refuses ``store_unavailable``."""
        return await schema_admin.unfinished_erasures(self._db)

    # -- consent ------------------------------------------------------------------------------------

    async def grant(
        self, key: ScopeKey, *, purpose: str, policy_version: str, valid_until: datetime | None = None
    ) -> Grant:
        """Enable ``key`` for a purpose under a policy version and advance its generation (R6, R7).
        An unfinished erasure of the scope is completed first; if it still cannot be, refuses
        ``erasure_pending``/``erasure_failed``. Refuses ``bad_input`` labels."""
        granting = grants.grant(self._db, key, purpose=purpose, policy_version=policy_version, valid_until=valid_until)
        return await erasure.finished_first(self._db, key.scope_id, granting)

    async def status(self, key: ScopeKey) -> Status:
        """The scope's consent, effective limits, live entries (those whose keys the key store holds: never one that
        cannot be shown) and last erasure (R10). A scope behind the key store is brought forward and an unfinished
        erasure completed first; if it still cannot be, the answer says so (disabled, ``pending``/``failed``)."""
        return await erasure.finished_first(self._db, key.scope_id, grants.status(self._db, key))

    # -- admission (before any model or embedding call) ---------------------------------------------

    async def admit(
        self,
        key: ScopeKey,
        generation: int,
        operation: str,
        *,
        units: int = 0,
        explicit: bool = False,
    ) -> None:
        """Admit memory work before any model or embedding call (R21-R26), in one transaction shared by
        every replica: the consent fence, then (``explicit``) the sender/agent rate limit, then ``units``
        of the scope's hourly ceiling. Admitted work is recorded as used; refused work is
        not.
        Refuses ``consent_*``, ``rate_limited`` and ``hourly_ceiling``, and ``store_regressed`` when the key store
        saw a later erasure of the scope than the database has (``reconcile``). ``write`` and ``search`` fence
        again in their own transaction: admission is a gate, not the fence."""
        await admission.admit_work(self._db, key, generation, operation, units=units, explicit=explicit)

    async def claim_once(self, jti: str, valid_until: datetime) -> None:
        """Accept a token id once, on every replica; a second claim is ``assertion_replayed``. Decided on the
        database's clock, which replicas share: the record is kept until that clock passes ``valid_until`` (the
        token's expiry plus leeway), then swept, and a token that clock has seen expire is ``bad_assertion``."""
        await admission.claim_once(self._db, jti, valid_until)

    # -- data plane (fenced by generation) ----------------------------------------------------------

    async def write(
        self, key: ScopeKey, generation: int, facts: Sequence[Fact], *, expires_in: int | None = None
    ) -> list[uuid.UUID]:
        """Store ``facts`` in ``key`` under consent ``generation``, all or none; returns their entry ids.
        A fact equal to a live entry of the scope (whitespace normalized) is not stored again: its id is
        the live entry's, whose expiry does not move. The ledger counts the entries actually added.

        Refuses ``bad_input``, ``fact_too_large``, a fenced-off generation (``consent_*``) and
        ``entry_cap_reached`` when the live entries plus these would pass the cap (never evicts).
        Expiry is ``min(expires_in, policy maximum, maximum consented to)`` from the application clock.
        """
        return await erasure.finishing(
            self._db, key.scope_id, data.write(self._db, key, generation, facts, expires_in=expires_in)
        )

    async def search(
        self, key: ScopeKey, generation: int, embedding: Sequence[float], *, top_k: int = 5, min_score: float = 0.0
    ) -> list[Hit]:
        """The ``top_k`` live entries of ``key`` nearest to ``embedding`` by exact cosine similarity,
        each scoring at least ``min_score``. The fence and the entries are read in one statement,
        so one snapshot decides both. Refuses ``bad_input`` and a fenced-off generation."""
        [hits] = await self.search_many(key, generation, [embedding], top_k=top_k, min_score=min_score)
        return hits

    async def search_many(
        self,
        key: ScopeKey,
        generation: int,
        embeddings: Sequence[Embedding],
        *,
        top_k: int = 5,
        min_score: float = 0.0,
    ) -> list[list[Hit]]:
        """``search`` for each of ``embeddings`` (at most ``prefetch_max_subqueries``) in one statement: one
        fence, one snapshot, one ledger row counting every hit. The hits of each embedding, in order."""
        return await erasure.finishing(
            self._db,
            key.scope_id,
            data.search(self._db, key, generation, embeddings, top_k=top_k, min_score=min_score),
        )

    # -- conversation turns (auto-save input, R36) --------------------------------------------------

    async def record_turn(
        self, key: ScopeKey, generation: int, session_id: str, invocation_id: str, *, recalled: bool
    ) -> int:
        """Record that a turn of ``session_id`` ran admitted under consent ``generation`` (a no-op when the
        fence refuses it: such a turn is never collected); returns how many admitted turns of that session
        under that generation await auto-save. Only references derived from the ids are stored."""
        refusal, waiting = await turns.record_turn(
            self._db, key, generation, session_id, invocation_id, recalled=recalled
        )
        if refusal is Reason.CONSENT_DISABLED:  # the scope may be disabled by an unfinished erasure
            await caught_up(self._db, key.scope_id)
        return waiting

    async def collect_turns(
        self, key: ScopeKey, generation: int, session_id: str, candidates: Sequence[str]
    ) -> list[Turn]:
        """Take, once, the turns among ``candidates`` (invocation ids) of ``session_id`` that were admitted
        under ``generation``; turns of that session recorded under any other generation are discarded, so
        nothing said before an erasure or a withdrawal is ever collected. Fenced: refuses ``consent_*``."""
        return await erasure.finishing(
            self._db, key.scope_id, turns.collect_turns(self._db, key, generation, session_id, candidates)
        )

    # -- control plane (the subject's own requests; not fenced by generation) -----------------------

    async def inspect(self, key: ScopeKey, *, limit: int = MAX_PAGE, cursor: str | None = None) -> Page:
        """One page of the live entries of ``key``, oldest first, with a cursor for the next (R11).
        Refuses ``bad_input`` for a limit outside 1..50 and for a cursor not issued for this scope. An
        unfinished erasure is completed first; if it still cannot be, refuses ``erasure_pending``/
        ``erasure_failed``: entries being erased are never shown, only the scope's state is (``status``)."""
        page = data.inspect(self._db, key, limit=limit, cursor=cursor)
        return await erasure.finished_first(self._db, key.scope_id, page)

    async def forget(self, key: ScopeKey, entry_id: uuid.UUID) -> Erased:
        """Erase exactly one entry and verify it unreadable (R12). Fences like every erasure: the
        generation advances, so stale work cannot re-add what was forgotten. Refuses ``not_found``
        (no such entry in this scope) and, during an unfinished erasure that cannot be completed first,
        ``erasure_pending``/``erasure_failed``."""
        return await erasure.finished_first(self._db, key.scope_id, erasure.forget(self._db, key, entry_id))

    async def forget_all(self, key: ScopeKey) -> Erased:
        """Erase every entry of ``key`` and verify none is left; consent stays as it was (R13).
        Also completes an unfinished erasure (a new fence over everything)."""
        return await erasure.forget_all(self._db, key)

    async def off(self, key: ScopeKey) -> Erased:
        """Withdraw consent, first (disable and advance the generation in one statement), then erase
        and verify (R8, R13). The scope stays disabled until a new grant."""
        return await erasure.off(self._db, key)

    async def offboard(self, principal: Principal) -> Offboarded:
        """Disable every scope of ``principal`` (all agents, all rooms) in one statement, then erase and
        verify each (R29). Raises ``erasure_failed`` if any scope could not be verified; those stay disabled."""
        return await erasure.offboard(self._db, principal)

    # -- maintenance --------------------------------------------------------------------------------

    async def sweep(self, *, batch: int = 5000) -> int:
        """Complete every unfinished erasure (R9), then physically delete every expired entry (R19); returns
        how many expired entries. Also deletes, in batches, ledger records older than ``ledger_retention_days``
        (a scope's last erasure stays on its scope row). Safe to run on every replica. Raises ``erasure_failed``
        after all of that if an erasure still could not be verified (its scope stays disabled until a later
        run completes it)."""
        return await maintenance.sweep(self._db, batch=batch)


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
    "turn_ref",
]
