"""The governed store: scopes, immutable entries, content-free ledger.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import VECTOR
from sqlalchemy.dialects.postgresql import UUID

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

SCHEMA = "governed_memory"


def upgrade() -> None:
    op.create_table(
        "scopes",
        sa.Column("scope_id", UUID(as_uuid=True), primary_key=True),
        sa.Column("principal", sa.Text, nullable=False),
        sa.Column("origin", sa.Text, nullable=False),
        sa.Column("agent", sa.Text, nullable=False),
        sa.Column("scope_kind", sa.Text, nullable=False),
        sa.Column("room", sa.Text, nullable=False),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("purpose", sa.Text),
        sa.Column("policy_version", sa.Text),
        sa.Column("consented_at", sa.DateTime(timezone=True)),
        sa.Column("consent_expires_at", sa.DateTime(timezone=True)),
        sa.Column("max_expiry_seconds", sa.Integer, nullable=False),
        sa.Column("entry_cap", sa.Integer, nullable=False),
        sa.Column("erasure", sa.Text),
        sa.Column("erasure_at", sa.DateTime(timezone=True)),
        sa.Column("resume", sa.Boolean, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("principal", "origin", "agent", "scope_kind", "room", name="scopes_typed_key"),
        sa.CheckConstraint("origin IN ('native', 'appservice')", name="scopes_origin"),
        sa.CheckConstraint("scope_kind = 'control-room'", name="scopes_kind"),
        sa.CheckConstraint("generation >= 0", name="scopes_generation"),
        sa.CheckConstraint("max_expiry_seconds BETWEEN 1 AND 604800", name="scopes_max_expiry"),
        sa.CheckConstraint("entry_cap BETWEEN 1 AND 100", name="scopes_entry_cap"),
        sa.CheckConstraint("erasure IN ('pending', 'verified', 'failed')", name="scopes_erasure"),
        sa.CheckConstraint(
            "NOT enabled OR (generation >= 1 AND erasure IS DISTINCT FROM 'pending' "
            "AND erasure IS DISTINCT FROM 'failed')",
            name="scopes_enabled_is_clean",
        ),
        sa.CheckConstraint(
            "char_length(purpose) <= 64 AND char_length(policy_version) <= 64", name="scopes_labels_bounded"
        ),
        schema=SCHEMA,
    )
    op.create_index("scopes_by_principal", "scopes", ["principal", "origin"], schema=SCHEMA)

    op.create_table(
        "entries",
        sa.Column(
            "scope_id",
            UUID(as_uuid=True),
            sa.ForeignKey(f"{SCHEMA}.scopes.scope_id", ondelete="RESTRICT"),
            nullable=False,
        ),
        sa.Column("entry_id", UUID(as_uuid=True), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("embedding", VECTOR(768), nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("scope_id", "entry_id", name="entries_pkey"),
        sa.CheckConstraint("octet_length(text) BETWEEN 1 AND 512", name="entries_fact_size"),
        sa.CheckConstraint(
            "expires_at > created_at AND expires_at <= created_at + interval '7 days'",
            name="entries_expiry_ceiling",
        ),
        schema=SCHEMA,
    )
    op.create_index("entries_page_order", "entries", ["scope_id", "created_at", "entry_id"], schema=SCHEMA)
    op.create_index("entries_by_expiry", "entries", ["expires_at"], schema=SCHEMA)
    # A 768-d vector is over the 2 KB TOAST threshold; keep it inline so exact search reads one heap tuple.
    op.execute(f"ALTER TABLE {SCHEMA}.entries ALTER COLUMN embedding SET STORAGE PLAIN")
    # Entries are immutable: expiry can never be extended, content never rewritten. Erasure is DELETE.
    op.execute(
        f"""
        CREATE FUNCTION {SCHEMA}.entries_are_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'governed_memory: entries are immutable' USING ERRCODE = 'check_violation';
        END;
        $$
        """
    )
    op.execute(
        f"""
        CREATE TRIGGER entries_are_immutable BEFORE UPDATE ON {SCHEMA}.entries
        FOR EACH ROW EXECUTE FUNCTION {SCHEMA}.entries_are_immutable()
        """
    )

    op.create_table(
        "ledger",
        sa.Column("ledger_id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("operation", sa.Text, nullable=False),
        sa.Column("result", sa.Text, nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("scope_id", UUID(as_uuid=True)),
        sa.Column("generation", sa.BigInteger),
        sa.Column("count", sa.Integer),
        sa.Column("entry_id", UUID(as_uuid=True)),
        sa.CheckConstraint("operation ~ '^[a-z_]{1,32}$'", name="ledger_operation_code"),
        sa.CheckConstraint("result IN ('ok', 'refused', 'failed')", name="ledger_result"),
        sa.CheckConstraint("reason ~ '^[a-z_]{1,32}$'", name="ledger_reason_code"),
        schema=SCHEMA,
    )
    op.create_index("ledger_by_scope", "ledger", ["scope_id", "at"], schema=SCHEMA)


def downgrade() -> None:
    op.drop_table("ledger", schema=SCHEMA)
    op.execute(f"DROP TRIGGER entries_are_immutable ON {SCHEMA}.entries")
    op.drop_table("entries", schema=SCHEMA)
    op.execute(f"DROP FUNCTION {SCHEMA}.entries_are_immutable()")
    op.drop_table("scopes", schema=SCHEMA)
