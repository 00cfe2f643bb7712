"""The database functions and procedure of the hot path, as statements built once, at import: each is a call
whose every value is a bound parameter, executed with ``Database.call(statement, parameters)``. The
parameter names and types here are the functions' signatures as the store uses them.

Each function's current definition is its source file, ``store/sql/<name>.sql`` (``sources``); migrations
install frozen copies of them (``migrations/replaceable.py``), and ``tests/core/test_database_functions.py`` holds a
migrated database against these sources.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.resources import files
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Integer,
    LargeBinary,
    Select,
    Text,
    bindparam,
    func,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.types import TypeEngine


def sources() -> dict[str, str]:
    """The current definition of every database function and procedure, by name: the text of
    ``store/sql/<name>.sql``, one ``CREATE OR REPLACE`` statement each."""
    directory = files(__package__) / "sql"
    found = (path for path in directory.iterdir() if path.name.endswith(".sql"))
    return {path.name.removesuffix(".sql"): path.read_text("utf-8") for path in sorted(found, key=lambda p: p.name)}


_SCOPE: dict[str, TypeEngine[Any]] = {"scope": UUID(), "generation": BigInteger(), "now": DateTime(timezone=True)}


# Which server answered: its start time, the same in every session a pooler lends and different after a failover,
# a restore or a restart, when a keyring kept from before may be behind what the database brought back
# (``Keyrings.serving``). Named last in every row of the hot path; ``Database.call`` hands it on.
SERVER = "server"


def _call(name: str, parameters: Mapping[str, TypeEngine[Any]], columns: tuple[str, ...]) -> Select[Any]:
    """``SELECT <columns>, pg_postmaster_start_time() FROM governed_memory.<name>(:parameters...)``; a scalar
    function has one column, then the server's (``SERVER``)."""
    call = getattr(func.governed_memory, name)(*(bindparam(key, type_=kind) for key, kind in parameters.items()))
    server = func.pg_postmaster_start_time().label(SERVER)
    if len(columns) == 1:
        return select(call.label(columns[0]), server)
    table = call.table_valued(*columns)
    return select(*(table.c[column] for column in columns), server)


SEARCH = _call("search", _SCOPE, ("refusal", "entry_id", "sealed", "created_at", "expires_at"))
WRITE = _call(
    "write",
    _SCOPE
    | {
        "ids": ARRAY(UUID),
        "sealed": ARRAY(LargeBinary),
        "same_of": ARRAY(Integer),
        "same": ARRAY(UUID),
        "known": ARRAY(UUID),
        "cap": Integer(),
        "lifetime": BigInteger(),
    },
    ("refusal", "entry_id"),
)
ADMIT = _call(
    "admit",
    _SCOPE
    | {
        "operation": Text(),
        "units": Integer(),
        "bucket": UUID(),
        "burst": Integer(),
        "per_minute": Integer(),
        "per_hour": Integer(),
    },
    ("refusal",),
)
RECORD_TURN = _call(
    "record_turn",
    _SCOPE | {"session": UUID(), "invocation": UUID(), "recalled": Boolean()},
    ("refusal", "waiting"),
)
COLLECT_TURNS = _call(
    "collect_turns",
    _SCOPE | {"session": UUID(), "candidates": ARRAY(UUID)},
    ("refusal", "invocation_ref", "recalled"),
)
CLEAR = text("CALL governed_memory.clear(:scope, :generation, :operation, :entry, :now, true, NULL, NULL)").bindparams(
    bindparam("scope", type_=UUID()),
    bindparam("generation", type_=BigInteger()),
    bindparam("operation", type_=Text()),
    bindparam("entry", type_=UUID()),
    bindparam("now", type_=DateTime(timezone=True)),
)  # a procedure: it commits between its steps, so it is called outside any transaction; answers (erased, remaining);
# called only once the erased keys are destroyed and verified gone (``true``: ``entries_deleted_after_keys``)
