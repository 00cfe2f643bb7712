"""The hot path in one round trip: the consent fence, search, admission, write and the conversation turns
as database functions, each called as one statement in its own transaction; and an erasure's delete,
verification and settle as one procedure call, committing between them.

Why functions: a statement with CTEs sees one snapshot, taken before any lock wait, so a writer counting
live entries after waiting for the scope lock would count on a stale snapshot (two concurrent writers
filled a scope past its cap that way). In PL/pgSQL every statement takes a fresh snapshot at READ
COMMITTED, so ``SELECT ... FOR UPDATE`` followed by a count sees what earlier lock holders committed,
exactly as the multi-statement transactions they replace did; search keeps its one statement, so one
snapshot decides the fence and the entries. A refusal is returned, not raised: its ledger row commits
with the call.

Vectors arrive as ``vector[]`` in pgvector's binary format (``database.Vectors``). No statement is
assembled from input: every value is a parameter. The definitions this revision installs are its frozen
copies, ``migrations/sql/0007/`` (``replaceable``); later revisions replace them.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from alembic import op

from kagent_memory_governed.migrations import replaceable

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# the frozen copies of this revision, migrations/sql/0007/<name>.sql (replaceable.py); dropped in reverse
_FUNCTIONS = {
    "fence": "fence(governed_memory.scopes, bigint, timestamptz)",
    "search": "search(uuid, bigint, timestamptz, vector[], integer, double precision)",
    "write": "write(uuid, bigint, timestamptz, text[], vector[], integer, bigint)",
    "admit": "admit(uuid, bigint, timestamptz, text, integer, uuid, integer, integer, integer)",
    "record_turn": "record_turn(uuid, bigint, timestamptz, uuid, uuid, boolean)",
    "collect_turns": "collect_turns(uuid, bigint, timestamptz, uuid, uuid[])",
}
_PROCEDURES = {"clear": "clear(uuid, bigint, text, uuid, timestamptz, bigint, bigint)"}


def upgrade() -> None:
    replaceable.install(revision, *_FUNCTIONS, *_PROCEDURES)


def downgrade() -> None:
    for signature in _PROCEDURES.values():
        op.execute(f"DROP PROCEDURE governed_memory.{signature}")
    for signature in reversed(_FUNCTIONS.values()):
        op.execute(f"DROP FUNCTION governed_memory.{signature}")
