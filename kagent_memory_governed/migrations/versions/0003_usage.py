"""Usage records for cost admission: per-sender explicit-operation buckets and per-scope hourly units.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

SCHEMA = "governed_memory"


def upgrade() -> None:
    op.create_table(
        "buckets",
        sa.Column("bucket_id", UUID(as_uuid=True), primary_key=True),
        sa.Column("tokens", sa.Float, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        schema=SCHEMA,
    )
    op.create_table(
        "usage",
        sa.Column("usage_id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("subject_id", UUID(as_uuid=True), nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("units", sa.Integer, nullable=False),
        sa.CheckConstraint("kind IN ('explicit', 'hourly')", name="usage_kind"),
        sa.CheckConstraint("units BETWEEN 1 AND 100", name="usage_units"),
        schema=SCHEMA,
    )
    op.create_index("usage_window", "usage", ["subject_id", "kind", "at"], schema=SCHEMA)


def downgrade() -> None:
    op.drop_table("usage", schema=SCHEMA)
    op.drop_table("buckets", schema=SCHEMA)
