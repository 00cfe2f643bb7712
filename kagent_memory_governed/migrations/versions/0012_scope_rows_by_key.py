"""``search`` and ``write`` find a scope's rows by the primary key alone, then keep the live ones.

Before, each read a scope's entries with ``scope_id = p_scope AND expires_at > p_now`` in one condition. Once
PostgreSQL caches a generic plan for a function's statement (after five calls in a session), it may answer it
with a bitmap AND of the primary key and the expiry index, which reads the expiry index for every live entry
of every scope on each call: measured at 100,000 entries before the table was first analyzed, 11.8 ms for a
statement that takes 0.1 ms by the key (#29). A materialized set of the scope's rows leaves the planner
nothing to join. Frozen copies: ``migrations/sql/0012/`` (``replaceable``).

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from kagent_memory_governed.migrations import replaceable

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    replaceable.install(revision, "search", "write")


def downgrade() -> None:
    replaceable.install("0011", "search", "write")
