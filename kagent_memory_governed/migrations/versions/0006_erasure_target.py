"""What an erasure erases, kept on its scope, so an interrupted one can be completed exactly; and an index
of the scopes whose erasure is unfinished, which ``sweep`` completes.

A scope left ``pending`` or ``failed`` by an earlier version has no recorded target: it is completed as an
erasure of every entry (the scope's ``resume`` still decides whether it comes back enabled).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

SCHEMA = "governed_memory"


def upgrade() -> None:
    op.add_column("scopes", sa.Column("erasure_entry", UUID(as_uuid=True)), schema=SCHEMA)
    op.create_index(
        "scopes_unfinished_erasure",
        "scopes",
        ["scope_id"],
        schema=SCHEMA,
        postgresql_where=sa.text("erasure IN ('pending', 'failed')"),
    )


def downgrade() -> None:
    op.drop_index("scopes_unfinished_erasure", table_name="scopes", schema=SCHEMA)
    op.drop_column("scopes", "erasure_entry", schema=SCHEMA)
