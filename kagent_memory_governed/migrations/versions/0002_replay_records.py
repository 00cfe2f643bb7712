"""Replay records: a destructive control call is accepted once per token id, across replicas.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

SCHEMA = "governed_memory"


def upgrade() -> None:
    op.create_table(
        "replays",
        sa.Column("jti", sa.Text, primary_key=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("char_length(jti) BETWEEN 1 AND 128", name="replays_jti_bounded"),
        schema=SCHEMA,
    )
    op.create_index("replays_by_expiry", "replays", ["expires_at"], schema=SCHEMA)


def downgrade() -> None:
    op.drop_table("replays", schema=SCHEMA)
