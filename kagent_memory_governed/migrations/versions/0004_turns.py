"""Admitted conversation turns awaiting auto-save (R36): content-free references, one row per turn.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

SCHEMA = "governed_memory"


def upgrade() -> None:
    op.create_table(
        "turns",
        sa.Column(
            "scope_id",
            UUID(as_uuid=True),
            sa.ForeignKey(f"{SCHEMA}.scopes.scope_id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("session_ref", UUID(as_uuid=True), nullable=False),
        sa.Column("invocation_ref", UUID(as_uuid=True), nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("recalled", sa.Boolean, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("scope_id", "session_ref", "invocation_ref", name="turns_pkey"),
        sa.CheckConstraint("generation >= 1", name="turns_generation"),
        schema=SCHEMA,
    )
    op.create_index("turns_by_age", "turns", ["at"], schema=SCHEMA)


def downgrade() -> None:
    op.drop_table("turns", schema=SCHEMA)
