"""The database functions resolve nothing through the caller's search path (#27, finding 2): each runs with
``search_path = pg_catalog, pg_temp`` and names pgvector's type and operator by the schema pgvector lives in.

The attack: a role allowed to create schemas in the database creates one named after the application role,
which the default search path (``"$user", public``) puts first, and plants objects that match what the
functions call by name: an operator ``<=>`` on vectors and exact-type overloads of polymorphic built-ins. Run
as the application role, such an object could copy every stored fact out."""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from support import facts, keys_of, make_key

from kagent_memory_governed.policy import Policy
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import embed

_serial = itertools.count()
PINNED = "search_path=pg_catalog, pg_temp"


@dataclass(frozen=True)
class Database:
    name: str
    url: str  # as the superuser that migrates

    def as_role(self, role: str) -> str:
        return self.url.replace("postgresql+asyncpg://postgres@", f"postgresql+asyncpg://{role}@")


def _plain(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


@pytest.fixture
async def fresh(store: Store, database_url: str, sql: asyncpg.Connection) -> AsyncIterator[Database]:
    """A new, empty database on the test server, dropped afterwards with the roles a test made."""
    name = f"search_path_{next(_serial)}"
    await sql.execute(f"DROP DATABASE IF EXISTS {name}")
    await sql.execute(f"CREATE DATABASE {name}")
    yield Database(name, database_url.replace("/postgres?", f"/{name}?"))
    await sql.execute(f"DROP DATABASE {name} WITH (FORCE)")
    for role in await sql.fetch("SELECT rolname FROM pg_roles WHERE rolname LIKE $1", f"{name}_%"):
        await sql.execute(f"DROP ROLE {role['rolname']}")


async def migrate(url: str) -> None:
    migrating = Store.connect(url, Policy(), keys=keys_of(url))
    try:
        await migrating.migrate()
    finally:
        await migrating.close()


async def test_every_function_runs_with_a_pinned_search_path(store: Store, sql: asyncpg.Connection) -> None:
    routines = await sql.fetch(
        "SELECT proname, prokind::text, proconfig, prosrc FROM pg_proc"
        " WHERE pronamespace = 'governed_memory'::regnamespace"
    )
    assert {r["prokind"] for r in routines} == {"f", "p"}
    for routine in routines:
        if routine["prokind"] == "f":
            assert routine["proconfig"] == [PINNED], routine["proname"]
        else:  # a procedure that commits cannot carry SET: it pins the path at the start of each transaction
            pin = r"PERFORM pg_catalog\.set_config\('search_path', 'pg_catalog, pg_temp', true\);"
            transactions = re.split(r"\bCOMMIT;[^\n]*\n", routine["prosrc"])
            assert len(transactions) > 1, routine["proname"]
            for transaction in transactions:
                assert re.match(rf"\s*(BEGIN\s*)?(--[^\n]*\n\s*)*{pin}", transaction), routine["proname"]


# Everything the functions call by name that a schema ahead in the search path could capture: pgvector's
# operator (same argument types: the first schema in the path wins) and exact-type overloads of polymorphic
# built-ins (an exact match wins over pg_catalog's polymorphic one, wherever it is in the path). Each records
# that it ran and copies the stored facts out, as the application role that calls it.
HOSTILE = """
CREATE TABLE {schema}.calls (name text, fact text);
GRANT INSERT ON {schema}.calls TO PUBLIC;
CREATE FUNCTION {schema}.steal(name text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.calls VALUES (name, NULL);
    INSERT INTO {schema}.calls SELECT name, e.plain_text FROM governed_memory.entries AS e;
END
$$;
CREATE FUNCTION {schema}.distance(a public.vector, b public.vector) RETURNS double precision LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {schema}.steal('<=>');
    RETURN 0;
END
$$;
CREATE OPERATOR {schema}.<=> (LEFTARG = public.vector, RIGHTARG = public.vector, FUNCTION = {schema}.distance);
CREATE FUNCTION {schema}.unnest(a public.vector[]) RETURNS SETOF public.vector LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {schema}.steal('unnest(vector[])');
    RETURN QUERY SELECT * FROM pg_catalog.unnest(a);
END
$$;
CREATE FUNCTION {schema}.unnest(a text[]) RETURNS SETOF text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {schema}.steal('unnest(text[])');
    RETURN QUERY SELECT * FROM pg_catalog.unnest(a);
END
$$;
CREATE FUNCTION {schema}.unnest(a uuid[]) RETURNS SETOF uuid LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {schema}.steal('unnest(uuid[])');
    RETURN QUERY SELECT * FROM pg_catalog.unnest(a);
END
$$;
CREATE FUNCTION {schema}.cardinality(a text[]) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {schema}.steal('cardinality(text[])');
    RETURN pg_catalog.cardinality(a);
END
$$;
GRANT USAGE ON SCHEMA {schema} TO PUBLIC;
"""

# What the application role needs at run time (docs/operator.md): no CREATE anywhere, no ownership.
APPLICATION_GRANTS = """
GRANT CONNECT ON DATABASE {database} TO {role};
GRANT USAGE ON SCHEMA governed_memory TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA governed_memory TO {role};
"""


async def test_a_schema_planted_ahead_in_the_search_path_captures_no_call(fresh: Database) -> None:
    app, mallory = f"{fresh.name}_app", f"{fresh.name}_mallory"
    await migrate(fresh.url)
    owner = await asyncpg.connect(_plain(fresh.url))
    try:
        await owner.execute(f"CREATE ROLE {app} LOGIN; CREATE ROLE {mallory} LOGIN")
        await owner.execute(APPLICATION_GRANTS.format(database=fresh.name, role=app))
        await owner.execute(f"GRANT CREATE ON DATABASE {fresh.name} TO {mallory}")  # not a default grant
    finally:
        await owner.close()
    attacker = await asyncpg.connect(_plain(fresh.as_role(mallory)))
    try:  # a schema named after the application role: "$user", the first in its search path
        await attacker.execute(f"CREATE SCHEMA {app}")
        await attacker.execute(HOSTILE.format(schema=app))
    finally:
        await attacker.close()

    store = Store.connect(fresh.as_role(app), Policy(), keys=keys_of(fresh.url))
    try:
        key = make_key()
        generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
        await store.admit(key, generation, "save", units=1, explicit=True)
        [kept, _] = await store.write(key, generation, facts("likes green tea", "lives in Lisbon"))
        await store.write(key, generation, facts("likes green tea"))  # a live fact again: the answer reads it
        hits = await store.search(key, generation, embed("likes green tea"))
        await store.search_many(key, generation, [embed("tea"), embed("Lisbon")])
        assert await store.record_turn(key, generation, "session", "invocation", recalled=True) == 1
        await store.collect_turns(key, generation, "session", ["invocation"])
        await store.status(key)
        await store.inspect(key)
        generation = (await store.forget(key, kept)).generation
        await store.claim_once("token", datetime.now(UTC) + timedelta(minutes=5))
        await store.off(key)
        await store.sweep()
    finally:
        await store.close()
    planted = await asyncpg.connect(_plain(fresh.url))
    as_app = await asyncpg.connect(_plain(fresh.as_role(app)))
    try:
        assert await planted.fetch(f"SELECT DISTINCT name, fact FROM {app}.calls") == []
        assert hits[0].entry_id == kept  # distances were pgvector's
        # and the plant works: the application role's own statements resolve into it
        assert (await as_app.fetchval("SELECT current_schemas(false)"))[0] == app
        assert await as_app.fetchval("SELECT '[1,0]'::vector <=> '[0,1]'::vector") == 0
        assert await planted.fetchval(f"SELECT count(*) FROM {app}.calls WHERE name = '<=>'") == 1
    finally:
        await as_app.close()
        await planted.close()


async def test_pgvector_installed_in_another_schema_is_named_by_that_schema(fresh: Database) -> None:
    """Installed by a database owner in a schema of its own, on the search path while migrating (as managed
    services put an ``extensions`` schema there); the store then works without it on the path."""
    owner = await asyncpg.connect(_plain(fresh.url))
    try:
        await owner.execute('CREATE SCHEMA "Vectors"; CREATE EXTENSION vector SCHEMA "Vectors"')
        await owner.execute(f'ALTER DATABASE {fresh.name} SET search_path = "$user", public, "Vectors"')
        await migrate(fresh.url)
        await owner.execute(f"ALTER DATABASE {fresh.name} RESET search_path")
    finally:
        await owner.close()
    store = Store.connect(fresh.url, Policy(), keys=keys_of(fresh.url))
    try:
        key = make_key()
        generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
        [entry] = await store.write(key, generation, facts("likes green tea"))
        [hit] = await store.search(key, generation, embed("likes green tea"))
        assert (hit.entry_id, round(hit.score, 6)) == (entry, 1.0)
    finally:
        await store.close()
