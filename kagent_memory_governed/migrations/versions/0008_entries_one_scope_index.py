"""One index over a scope's entries instead of two: ``entries_page_order`` (scope, created_at, entry_id)
goes; the primary key (scope, entry_id) serves every per-scope read. A scope holds at most 100 entries
(R20), so a page of ``inspect`` sorts at most 100 rows, and search reads them all anyway. Saves about
90 bytes an entry (benchmarks/storage.py).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

SCHEMA = "governed_memory"


def upgrade() -> None:
    op.drop_index("entries_page_order", table_name="entries", schema=SCHEMA)


def downgrade() -> None:
    op.create_index("entries_page_order", "entries", ["scope_id", "created_at", "entry_id"], schema=SCHEMA)
