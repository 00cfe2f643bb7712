"""Every database function runs with a pinned ``search_path`` (``pg_catalog, pg_temp``) and names pgvector's
type and ``<=>`` operator by the schema pgvector is installed in; the ``clear`` procedure, which commits and so
cannot carry ``SET``, pins it at the start of each of its transactions.

Before, ``<=>`` and the polymorphic built-ins were resolved through the caller's search path when a function
ran, as the application role: a role allowed to create a schema named after that role (which the default
search path puts first) could plant an operator there and read stored facts with it (#27, finding 2).
Frozen copies: ``migrations/sql/0010/`` (``replaceable``).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

from kagent_memory_governed.migrations import replaceable

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_ROUTINES = ("fence", "search", "write", "admit", "record_turn", "collect_turns", "clear", "entries_are_immutable")


def upgrade() -> None:
    replaceable.install(revision, *_ROUTINES)


def downgrade() -> None:
    replaceable.install("0007", "fence", "search", "admit", "record_turn", "collect_turns", "clear")
    replaceable.install("0009", "write", "entries_are_immutable")
