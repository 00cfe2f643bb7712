"""``write`` reads the scope's live entries once, after the scope lock, instead of stating "live" four times
(count, two re-checks and the answer); its answers, refusals and ledger rows are unchanged. And the entries'
immutability trigger function is installed from its source, as every database function now is
(``replaceable``: this revision's frozen copies are ``migrations/sql/0009/``).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from alembic import op

from kagent_memory_governed.migrations import replaceable

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    replaceable.install(revision, "write", "entries_are_immutable")


def downgrade() -> None:
    replaceable.install("0007", "write")
    # 0001's body, as 0001 wrote it: the same one statement
    op.execute(
        """
        CREATE OR REPLACE FUNCTION governed_memory.entries_are_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'governed_memory: entries are immutable' USING ERRCODE = 'check_violation';
        END;
        $$
        """
    )
