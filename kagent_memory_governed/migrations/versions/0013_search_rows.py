"""``search`` answers a row an entry instead of one row of four arrays.

Measured on the embedded PostgreSQL with 100 sealed entries a scope (about 3 KB each), cold scopes taken in
turn: the arrays, each aggregated in entry-id order, took 2.6-3.2 ms from call to decoded result where rows take
1.7-2.0 ms (#29). The process puts the rows in entry-id order itself. The result type changes, so the function
is dropped and created again. Frozen copy: ``migrations/sql/0013/`` (``replaceable``).

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

from alembic import op

from kagent_memory_governed.migrations import replaceable

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DROP FUNCTION governed_memory.search(uuid, bigint, timestamptz)")
    replaceable.install(revision, "search")


def downgrade() -> None:
    op.execute("DROP FUNCTION governed_memory.search(uuid, bigint, timestamptz)")
    replaceable.install("0012", "search")
