"""The key store bound to its database (R45); entries deleted only after their keys; the cause of a failure.

``binding`` holds one row: this database's own id, drawn here once, and the id of the key store that holds its
entry keys, recorded by the first ``migrate`` after this revision (``store/binding.py``). The key store records
the same pair on its side. A process, ``migrate`` or ``sweep`` with a key store of another database (or one
that never held these keys) refuses to serve or to erase (``key_store_mismatch``) instead of "verifying"
erasures of keys it never held.

A downgrade keeps ``binding`` (earlier revisions ignore it), so that the database stays the one its key store
serves; ``DROP SCHEMA governed_memory`` drops it, and the key store, which still records the dropped database,
then refuses the new one until it is emptied or replaced (docs/operator.md).

Entries are deleted only by code that destroyed their keys first (R42, R44): a trigger before DELETE refuses any
other (``entries_deleted_after_keys``), and ``clear`` takes ``p_keys_destroyed`` (a replica of an earlier release
calls it without, is refused by the trigger and leaves its erasure unfinished, for a replica of this release to
complete, keys first); and the plain-text columns an earlier version wrote are renamed ``plain_text`` and
``plain_embedding`` (until ``migrate`` seals them), so an earlier release's reads of them are refused by the
database instead of failing in its code. Frozen copies: ``migrations/sql/0014/`` (``replaceable``).

``ledger.cause`` is the content-free category of a failure (``key_unavailable`` because of
``permission_denied``, say), so a failed-closed erasure names why in the one record that outlives the log.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

from kagent_memory_governed.migrations import replaceable

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

SCHEMA = "governed_memory"
_CLEAR_0010 = "uuid, bigint, text, uuid, timestamptz, bigint, bigint"  # the procedure's arguments before


def upgrade() -> None:
    if not sa.inspect(op.get_bind()).has_table("binding", schema=SCHEMA):  # kept by a downgrade: the same database
        op.create_table(
            "binding",
            sa.Column("singleton", sa.Boolean, primary_key=True, server_default=sa.true()),
            sa.Column("database_id", UUID(as_uuid=True), nullable=False, server_default=sa.text("gen_random_uuid()")),
            sa.Column("key_store_id", UUID(as_uuid=True)),
            sa.Column("bound_at", sa.DateTime(timezone=True)),
            sa.CheckConstraint("singleton", name="binding_one_row"),
            schema=SCHEMA,
        )
        op.execute("INSERT INTO governed_memory.binding DEFAULT VALUES")
    op.add_column("ledger", sa.Column("cause", sa.Text), schema=SCHEMA)
    op.create_check_constraint("ledger_cause_code", "ledger", "cause ~ '^[a-z0-9_]{1,32}$'", schema=SCHEMA)
    op.alter_column("entries", "text", new_column_name="plain_text", schema=SCHEMA)
    op.alter_column("entries", "embedding", new_column_name="plain_embedding", schema=SCHEMA)
    op.execute(f"DROP PROCEDURE {SCHEMA}.clear({_CLEAR_0010})")
    replaceable.install(revision, "clear", "entries_are_immutable", "entries_deleted_after_keys")
    op.execute(
        f"CREATE TRIGGER entries_deleted_after_keys BEFORE DELETE ON {SCHEMA}.entries"
        f" FOR EACH STATEMENT EXECUTE FUNCTION {SCHEMA}.entries_deleted_after_keys()"
    )


def downgrade() -> None:
    # ``binding`` stays: the key store keeps this database's keys at any revision, and an upgrade finds the same
    # identity again (earlier revisions never read it)
    op.execute(f"DROP TRIGGER entries_deleted_after_keys ON {SCHEMA}.entries")
    op.execute(f"DROP FUNCTION {SCHEMA}.entries_deleted_after_keys()")
    op.execute(f"DROP PROCEDURE {SCHEMA}.clear({_CLEAR_0010.replace('timestamptz', 'timestamptz, boolean')})")
    op.alter_column("entries", "plain_text", new_column_name="text", schema=SCHEMA)
    op.alter_column("entries", "plain_embedding", new_column_name="embedding", schema=SCHEMA)
    replaceable.install("0010", "clear")
    replaceable.install("0011", "entries_are_immutable")
    op.drop_column("ledger", "cause", schema=SCHEMA)
