"""The database functions and procedure have one current source each (``store/sql/<name>.sql``): a freshly
migrated database holds exactly those definitions, a downgrade restores what the older revision installed,
and every code the SQL writes or compares is a member of the Python enum it belongs to."""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator
from enum import StrEnum

import asyncpg
import pytest
from support import keys_of

from kagent_memory_governed.consent import Erasure
from kagent_memory_governed.errors import Operation, Reason, Result
from kagent_memory_governed.migrations.replaceable import render
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.store import Store
from kagent_memory_governed.store.functions import sources

_databases = itertools.count()

# Literals of the SQL that are no code of ours: settings, intervals, the empty array, the trigger's message, and
# the usage kinds, which the table's CHECK constraint (schema.usage) holds to its two values.
NOT_CODES = {
    "search_path",
    "pg_catalog, pg_temp",
    "synchronous_commit",
    "off",
    "1 minute",
    "1 hour",
    "{}",
    "explicit",
    "hourly",
    "governed_memory: entries are immutable",
    "check_violation",
    "governed_memory: entries are deleted after their keys",
    "object_not_in_prerequisite_state",
    "governed_memory.keys_destroyed",
    "on",
}


@pytest.fixture
async def fresh(store: Store, database_url: str, sql: asyncpg.Connection) -> AsyncIterator[str]:
    """The URL of a new, empty database on the test server (whose own database ``store`` migrates), dropped
    afterwards."""
    name = f"functions_{next(_databases)}"
    await sql.execute(f"DROP DATABASE IF EXISTS {name}")
    await sql.execute(f"CREATE DATABASE {name}")
    yield database_url.replace("/postgres?", f"/{name}?")
    await sql.execute(f"DROP DATABASE {name} WITH (FORCE)")


async def migrated(url: str, *steps: str) -> dict[tuple[str, str], str]:
    """Migrate the database at ``url`` through ``steps``; then every routine of the schema, by name and
    arguments, as PostgreSQL spells its definition."""
    store = Store.connect(url, Policy(), keys=keys_of(url))
    try:
        for step in steps:
            await store.migrate(step)
    finally:
        await store.close()
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        return await definitions(conn)
    finally:
        await conn.close()


async def definitions(conn: asyncpg.Connection) -> dict[tuple[str, str], str]:
    rows = await conn.fetch(
        "SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS arguments, pg_get_functiondef(p.oid) AS body"
        " FROM pg_proc AS p WHERE p.pronamespace = 'governed_memory'::regnamespace"
    )
    return {(row["proname"], row["arguments"]): row["body"] for row in rows}


class _Unchanged(Exception):
    pass


async def test_a_migrated_database_holds_exactly_the_source_of_every_function(fresh: str) -> None:
    """Each source, run over the migrated database (and rolled back), changes no definition and adds none; and
    every function of the schema has a source."""
    installed = await migrated(fresh, "head")
    conn = await asyncpg.connect(fresh.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        with pytest.raises(_Unchanged):
            async with conn.transaction():
                schema = await conn.fetchval(
                    "SELECT quote_ident(extnamespace::regnamespace::text) FROM pg_extension WHERE extname = 'vector'"
                )
                for source in sources().values():
                    await conn.execute(render(source, schema))
                replaced = await definitions(conn)
                raise _Unchanged
    finally:
        await conn.close()
    assert {name for name, _ in installed} == set(sources())
    for routine, definition in installed.items():
        assert replaced[routine] == definition, f"{routine[0]}: the database differs from store/sql/{routine[0]}.sql"
    assert replaced.keys() == installed.keys()  # no source declares another signature


@pytest.mark.parametrize("revision", ["0012", "0011", "0009", "0008", "0007"])
async def test_a_downgrade_restores_the_functions_that_revision_installed(fresh: str, revision: str) -> None:
    direct = await migrated(fresh, revision)
    conn = await asyncpg.connect(fresh.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute("DROP SCHEMA governed_memory CASCADE")  # the version table with it: a new database
    finally:
        await conn.close()
    assert await migrated(fresh, "head", revision) == direct


def _literals(text: str) -> list[str]:
    return [value.replace("''", "'") for value in re.findall(r"'((?:[^']|'')*)'", text)]


def _split(expressions: str) -> list[str]:
    """Top-level comma-separated parts of an SQL expression list."""
    parts, depth, current = [], 0, ""
    for char in expressions:
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


def _ledger_rows(text: str) -> list[dict[str, str]]:
    """Each ``INSERT INTO governed_memory.ledger`` of the SQL, its columns mapped to their expressions."""
    rows = []
    for found in re.finditer(r"INSERT INTO governed_memory\.ledger\s*\(([^)]*)\)\s*(VALUES\s*\(|SELECT\b)", text):
        columns = [column.strip() for column in found.group(1).split(",")]
        rest = text[found.end() :]
        if found.group(2).startswith("VALUES"):
            depth, end = 1, 0
            while depth:
                depth += (rest[end] == "(") - (rest[end] == ")")
                end += 1
            values = rest[: end - 1]
        else:
            values = re.split(r"\bFROM\b", rest, maxsplit=1)[0]
        expressions = _split(values)
        assert len(expressions) == len(columns), found.group(0)
        rows.append(dict(zip(columns, expressions, strict=True)))
    return rows


def _members(enum: type[StrEnum]) -> set[str]:
    return {member.value for member in enum}


@pytest.mark.parametrize("name", sorted(sources()))
def test_every_code_in_the_sql_is_a_member_of_its_python_enum(name: str) -> None:
    text = re.sub(r"--[^\n]*", "", sources()[name])
    checked: set[str] = set()
    for row in _ledger_rows(text):
        for column, enum in (("operation", Operation), ("result", Result), ("reason", Reason)):
            values = _literals(row.get(column, ""))
            assert set(values) <= _members(enum), f"{name}: ledger {column} {values}"
            checked |= set(values)
    refusals = re.findall(r"v_refusal := '(\w+)'", text)
    if name == "fence":  # the fence answers its reason
        refusals += re.findall(r"THEN '(\w+)'", text)
    assert set(refusals) <= _members(Reason), f"{name}: refusals {refusals}"
    states = [
        value
        for found in re.finditer(r"erasure\s*(?:IN\s*\(([^)]*)\)|=\s*('\w+'))", text)
        for value in _literals(found.group(1) or found.group(2))
    ]
    assert set(states) <= _members(Erasure), f"{name}: erasure states {states}"
    checked |= set(refusals) | set(states)
    codes = _members(Operation) | _members(Result) | _members(Reason) | _members(Erasure)
    unknown = {value for value in _literals(text) if value not in checked | codes | NOT_CODES}
    assert not unknown, f"{name}: literals that are no member of any code enum: {unknown}"


def test_the_codes_checked_cover_every_kind_the_sql_uses() -> None:
    """The checks above found ledger rows, refusals and erasure states (a parser that finds nothing checks nothing)."""
    text = "\n".join(sources().values())
    assert len(_ledger_rows(text)) >= 7
    assert {"entry_cap_reached", "consent_missing", "rate_limited", "hourly_ceiling"} <= set(
        re.findall(r"'(\w+)'", text)
    )
    assert re.search(r"erasure IN \('pending', 'failed'\)", text)
