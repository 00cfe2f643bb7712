"""Alembic environment: runs on the connection that ``Store.migrate`` hands over (under its advisory lock)."""

from __future__ import annotations

from alembic import context

from kagent_memory_governed.schema import SCHEMA, metadata

context.configure(
    connection=context.config.attributes["connection"],
    target_metadata=metadata,
    version_table_schema=SCHEMA,
    include_schemas=True,
    transaction_per_migration=True,
)
with context.begin_transaction():
    context.run_migrations()
