"""An index on the ledger's time, so ``sweep`` prunes records past ``ledger_retention_days`` in batches.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

SCHEMA = "governed_memory"


def upgrade() -> None:
    op.create_index("ledger_by_age", "ledger", ["at"], schema=SCHEMA)


def downgrade() -> None:
    op.drop_index("ledger_by_age", table_name="ledger", schema=SCHEMA)
