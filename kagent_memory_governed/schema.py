"""The one declaration of the store's tables (SQLAlchemy Core). Queries are built from these objects
in ``store``; the DDL that creates them lives in ``migrations/`` and a test proves the two agree.

Everything lives in its own PostgreSQL schema, ``governed_memory``: never in kagent's ``memory`` table,
whose controller extends expiry on access. Content (text, vectors) is only in ``entries``, and only sealed.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from pgvector.sqlalchemy import VECTOR
from sqlalchemy import (
    CTE,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    ColumnElement,
    DateTime,
    Float,
    ForeignKey,
    FromClause,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import UUID

from kagent_memory_governed.policy import EMBEDDING_DIMENSIONS

SCHEMA = "governed_memory"
metadata = MetaData(schema=SCHEMA)

# One durable record per typed scope: consent, its generation (the fence), and erasure state.
scopes = Table(
    "scopes",
    metadata,
    Column("scope_id", UUID(as_uuid=True), primary_key=True),
    Column("principal", Text, nullable=False),
    Column("origin", Text, nullable=False),
    Column("agent", Text, nullable=False),
    Column("scope_kind", Text, nullable=False),
    Column("room", Text, nullable=False),
    Column("enabled", Boolean, nullable=False),
    Column("generation", BigInteger, nullable=False),
    Column("purpose", Text),
    Column("policy_version", Text),
    Column("consented_at", DateTime(timezone=True)),
    Column("consent_expires_at", DateTime(timezone=True)),
    Column("max_expiry_seconds", Integer, nullable=False),
    Column("entry_cap", Integer, nullable=False),
    Column("erasure", Text),
    Column("erasure_at", DateTime(timezone=True)),
    Column("erasure_entry", UUID(as_uuid=True)),  # what the last erasure erases: one entry, or NULL for all
    Column("resume", Boolean, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("principal", "origin", "agent", "scope_kind", "room", name="scopes_typed_key"),
    CheckConstraint("origin IN ('native', 'appservice')", name="scopes_origin"),
    CheckConstraint("scope_kind = 'control-room'", name="scopes_kind"),
    CheckConstraint("generation >= 0", name="scopes_generation"),
    CheckConstraint("max_expiry_seconds BETWEEN 1 AND 604800", name="scopes_max_expiry"),
    CheckConstraint("entry_cap BETWEEN 1 AND 100", name="scopes_entry_cap"),
    CheckConstraint("erasure IN ('pending', 'verified', 'failed')", name="scopes_erasure"),
    CheckConstraint(
        "NOT enabled OR (generation >= 1 AND erasure IS DISTINCT FROM 'pending' AND erasure IS DISTINCT FROM 'failed')",
        name="scopes_enabled_is_clean",
    ),
    CheckConstraint("char_length(purpose) <= 64 AND char_length(policy_version) <= 64", name="scopes_labels_bounded"),
    Index("scopes_by_principal", "principal", "origin"),
    Index("scopes_unfinished_erasure", "scope_id", postgresql_where=text("erasure IN ('pending', 'failed')")),
)

# Memory content, sealed: text and embedding are one ciphertext under a key of the entry's own, held in the key
# store, never here (R42; store/entry_format.py). ``plain_text`` and ``plain_embedding`` hold what an earlier version
# stored in plain text until ``migrate`` seals it (renamed by 0014, so that version's reads are refused). The scope
# id leads the primary key so the table can be partitioned or distributed by scope (R35). Entries are immutable:
# erasure is DELETE, only after the key's destruction (a trigger), and expiry never moves.
entries = Table(
    "entries",
    metadata,
    Column("scope_id", UUID(as_uuid=True), ForeignKey(scopes.c.scope_id, ondelete="RESTRICT"), nullable=False),
    Column("entry_id", UUID(as_uuid=True), nullable=False),
    Column("sealed", LargeBinary),
    Column("plain_text", Text),
    Column("plain_embedding", VECTOR(EMBEDDING_DIMENSIONS)),
    Column("generation", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("scope_id", "entry_id", name="entries_pkey"),
    CheckConstraint("octet_length(sealed) BETWEEN 3103 AND 3614", name="entries_sealed_size"),
    CheckConstraint(
        "(sealed IS NOT NULL AND plain_text IS NULL AND plain_embedding IS NULL) OR (sealed IS NULL AND plain_text IS"
        " NOT NULL AND plain_embedding IS NOT NULL AND octet_length(plain_text) BETWEEN 1 AND 512)",
        name="entries_sealed_or_plain",
    ),
    CheckConstraint(
        "expires_at > created_at AND expires_at <= created_at + interval '7 days'", name="entries_expiry_ceiling"
    ),
    Index("entries_by_expiry", "expires_at"),
)


def live(now: datetime, rows: FromClause = entries) -> ColumnElement[bool]:
    """An entry is live, readable by anyone, until its expiry: ``expires_at > now`` on the application clock
    (expiry is authorization, R19), of ``entries`` or of ``rows`` taken from it. The database functions that
    read entries state it once each (``store/sql/search.sql``, ``write.sql``)."""
    return rows.c.expires_at > now


def scope_rows(scope_id: uuid.UUID, *columns: str) -> CTE:
    """``columns`` of one scope's entries, found by the primary key alone, to be filtered with ``live``: a
    materialized CTE, so that no cached generic plan joins the expiry index in (a bitmap over every live entry
    of every scope, read on each call)."""
    found = select(*(entries.c[name] for name in columns)).where(entries.c.scope_id == scope_id)
    return found.cte("scoped").prefix_with("MATERIALIZED")


# Content-free evidence: an operation type, a result, a reason code, counts and opaque ids.
# The CHECKs make free text impossible at the database, not only by convention.
ledger = Table(
    "ledger",
    metadata,
    Column("ledger_id", BigInteger, Identity(always=True), primary_key=True),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("operation", Text, nullable=False),
    Column("result", Text, nullable=False),
    Column("reason", Text),
    Column("scope_id", UUID(as_uuid=True)),
    Column("generation", BigInteger),
    Column("count", Integer),
    Column("entry_id", UUID(as_uuid=True)),
    CheckConstraint("operation ~ '^[a-z_]{1,32}$'", name="ledger_operation_code"),
    CheckConstraint("result IN ('ok', 'refused', 'failed')", name="ledger_result"),
    Column("cause", Text),  # a failure's content-free category (``permission_denied``), for operators
    CheckConstraint("reason ~ '^[a-z_]{1,32}$'", name="ledger_reason_code"),
    CheckConstraint("cause ~ '^[a-z0-9_]{1,32}$'", name="ledger_cause_code"),
    Index("ledger_by_scope", "scope_id", "at"),
    Index("ledger_by_age", "at"),
)

# Which conversation turns were admitted under which consent generation, until auto-save collects them
# (R36). Content-free: session and invocation ids are stored as name-based UUIDs, never as given.
turns = Table(
    "turns",
    metadata,
    Column("scope_id", UUID(as_uuid=True), ForeignKey(scopes.c.scope_id, ondelete="CASCADE"), nullable=False),
    Column("session_ref", UUID(as_uuid=True), nullable=False),
    Column("invocation_ref", UUID(as_uuid=True), nullable=False),
    Column("generation", BigInteger, nullable=False),
    Column("recalled", Boolean, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("scope_id", "session_ref", "invocation_ref", name="turns_pkey"),
    CheckConstraint("generation >= 1", name="turns_generation"),
    Index("turns_by_age", "at"),
)

# Token ids of destructive control calls already accepted; kept until the token could no longer verify.
replays = Table(
    "replays",
    metadata,
    Column("jti", Text, primary_key=True),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    CheckConstraint("char_length(jti) BETWEEN 1 AND 128", name="replays_jti_bounded"),
    Index("replays_by_expiry", "expires_at"),
)

# Cost admission state, shared by every replica: explicit-operation token buckets per (sender, agent)
# and usage units per scope (hourly) or bucket (per minute). No content, no text.
buckets = Table(
    "buckets",
    metadata,
    Column("bucket_id", UUID(as_uuid=True), primary_key=True),
    Column("tokens", Float, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

usage = Table(
    "usage",
    metadata,
    Column("usage_id", BigInteger, Identity(always=True), primary_key=True),
    Column("subject_id", UUID(as_uuid=True), nullable=False),
    Column("kind", Text, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("units", Integer, nullable=False),
    CheckConstraint("kind IN ('explicit', 'hourly')", name="usage_kind"),
    CheckConstraint("units BETWEEN 1 AND 100", name="usage_units"),
    Index("usage_window", "subject_id", "kind", "at"),
)

# Which key store holds this database's entry keys (R45): one row, this database's id drawn at migration 0014 and
# the key store's id recorded by the first ``migrate`` after it; the key store records the same pair
# (``store/binding.py``).
binding = Table(
    "binding",
    metadata,
    Column("singleton", Boolean, primary_key=True, server_default=text("true")),
    Column("database_id", UUID(as_uuid=True), nullable=False, server_default=text("gen_random_uuid()")),
    Column("key_store_id", UUID(as_uuid=True)),
    Column("bound_at", DateTime(timezone=True)),
    CheckConstraint("singleton", name="binding_one_row"),
)
