"""Database functions and procedures as replaceable objects (Alembic's cookbook, "Replaceable Objects").

Each function's current definition is one source file, ``store/sql/<name>.sql`` (a ``CREATE OR REPLACE``
statement). A migration never reads those: a revision that installs or changes a function carries a frozen
copy of its definition as that revision saw it, ``migrations/sql/<revision>/<name>.sql``, so editing a source
later changes no migration that has already run anywhere. A downgrade installs the frozen copy of the
revision it returns to, named by that revision (the cookbook's ``replaces="<revision>.<name>"``).

A definition names pgvector's schema as ``@extschema:vector@`` (PostgreSQL's own spelling in extension
scripts): pgvector may live in any schema of the database, and the functions name its type and operator by
schema rather than through a search path. ``render`` puts the schema in at installation.
"""

from __future__ import annotations

from importlib.resources import files

from alembic import op
from sqlalchemy import text

VECTOR_SCHEMA = "@extschema:vector@"
_INSTALLED_SCHEMA = text(
    "SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_extension AS e"
    " JOIN pg_catalog.pg_namespace AS n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
)


def frozen(revision: str, name: str) -> str:
    """The definition of ``name`` that ``revision`` installs, exactly as frozen with it."""
    return (files("kagent_memory_governed.migrations") / "sql" / revision / f"{name}.sql").read_text("utf-8")


def render(definition: str, vector_schema: str) -> str:
    """``definition`` with ``vector_schema`` (an identifier as ``quote_ident`` spells it) for ``@extschema:vector@``."""
    return definition.replace(VECTOR_SCHEMA, vector_schema)


def install(revision: str, *names: str) -> None:
    """Create or replace each of ``names`` with its definition frozen at ``revision``, naming the schema that
    pgvector is installed in."""
    definitions = [frozen(revision, name) for name in names]
    vector_schema = op.get_bind().scalar(_INSTALLED_SCHEMA) if any(VECTOR_SCHEMA in d for d in definitions) else ""
    if vector_schema is None:
        raise RuntimeError("pgvector is not installed in this database")  # migrate creates it before any revision
    for definition in definitions:
        op.execute(render(definition, vector_schema))
