"""Database functions and procedures as replaceable objects (Alembic's cookbook, "Replaceable Objects").

Each function's current definition is one source file, ``store/sql/<name>.sql`` (a ``CREATE OR REPLACE``
statement). A migration never reads those: a revision that installs or changes a function carries a frozen
copy of its definition as that revision saw it, ``migrations/sql/<revision>/<name>.sql``, so editing a source
later changes no migration that has already run anywhere. A downgrade installs the frozen copy of the
revision it returns to, named by that revision (the cookbook's ``replaces="<revision>.<name>"``).
"""

from __future__ import annotations

from importlib.resources import files

from alembic import op


def frozen(revision: str, name: str) -> str:
    """The definition of ``name`` that ``revision`` installs, exactly as frozen with it."""
    return (files("kagent_memory_governed.migrations") / "sql" / revision / f"{name}.sql").read_text("utf-8")


def install(revision: str, *names: str) -> None:
    """Create or replace each of ``names`` with its definition frozen at ``revision``."""
    for name in names:
        op.execute(frozen(revision, name))
