"""Entries sealed under keys held outside the database (R42): the text and the embedding of an entry become one
authenticated ciphertext, ``sealed``, whose key lives in the key store (``kagent_memory_governed.keys``);
erasure destroys the key, so no copy of the database (data files, WAL, replicas, dumps, backups) can be read back.

``search`` now returns a scope's live entries sealed, for the process to open and rank; ``write`` takes sealed
entries and recognizes a fact saved again by the ids the caller's keyring names, without any fact-derived value
in the database. Entries stored in plain text by an earlier version keep their columns until ``migrate`` has
sealed them (``Store.migrate``, right after this revision); the server refuses to serve while any is left
(``schema_outdated``). Plain-text copies in WAL, replicas and backups taken before remain (docs/privacy.md).

The downgrade refuses while sealed entries exist: an earlier version could not read them (``bad_input``, detail
``sealed entries: erase them first, or keep 0011``, and nothing changes). Erase them first (``forget-all``/``off``),
or keep this revision. Frozen copies: ``migrations/sql/0011/`` (``replaceable``).

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import VECTOR

from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.migrations import replaceable

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

SCHEMA = "governed_memory"
# a fact of 1 to 512 UTF-8 bytes and a 768-dimensional single-precision embedding, with nonce, length and tag
_SEALED = "octet_length(sealed) BETWEEN 3103 AND 3614"
_ONE_FORM = (
    "(sealed IS NOT NULL AND text IS NULL AND embedding IS NULL)"
    " OR (sealed IS NULL AND text IS NOT NULL AND embedding IS NOT NULL AND octet_length(text) BETWEEN 1 AND 512)"
)


def upgrade() -> None:
    op.add_column("entries", sa.Column("sealed", sa.LargeBinary()), schema=SCHEMA)
    op.execute("ALTER TABLE governed_memory.entries ALTER COLUMN sealed SET STORAGE PLAIN")  # inline, like vectors
    op.alter_column("entries", "text", nullable=True, schema=SCHEMA)
    op.alter_column("entries", "embedding", nullable=True, schema=SCHEMA)
    op.drop_constraint("entries_fact_size", "entries", schema=SCHEMA)
    op.create_check_constraint("entries_sealed_size", "entries", _SEALED, schema=SCHEMA)
    op.create_check_constraint("entries_sealed_or_plain", "entries", _ONE_FORM, schema=SCHEMA)
    op.execute("DROP FUNCTION governed_memory.search(uuid, bigint, timestamptz, vector[], integer, double precision)")
    op.execute("DROP FUNCTION governed_memory.write(uuid, bigint, timestamptz, text[], vector[], integer, bigint)")
    replaceable.install(revision, "search", "write", "entries_are_immutable")


def downgrade() -> None:
    if op.get_bind().scalar(sa.text("SELECT EXISTS (SELECT FROM governed_memory.entries WHERE sealed IS NOT NULL)")):
        # a refusal like every other target migrate refuses, in one line naming why (no count, no content); the
        # transaction migrate runs in rolls back every step of this downgrade taken before it
        raise GovernedMemoryError(Reason.BAD_INPUT, detail="sealed entries: erase them first, or keep 0011")
    op.execute("DROP FUNCTION governed_memory.search(uuid, bigint, timestamptz)")
    op.execute(
        "DROP FUNCTION governed_memory.write(uuid, bigint, timestamptz, uuid[], bytea[], integer[], uuid[], uuid[],"
        " integer, bigint)"
    )
    op.drop_constraint("entries_sealed_or_plain", "entries", schema=SCHEMA)
    op.drop_constraint("entries_sealed_size", "entries", schema=SCHEMA)
    op.create_check_constraint("entries_fact_size", "entries", "octet_length(text) BETWEEN 1 AND 512", schema=SCHEMA)
    op.alter_column("entries", "embedding", nullable=False, existing_type=VECTOR(768), schema=SCHEMA)
    op.alter_column("entries", "text", nullable=False, existing_type=sa.Text(), schema=SCHEMA)
    op.drop_column("entries", "sealed", schema=SCHEMA)
    replaceable.install("0010", "search", "write", "entries_are_immutable")
