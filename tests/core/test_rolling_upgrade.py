"""A rolling upgrade from a previous release, with replicas of both on one database (R44), with the previous
releases' real packages (``tests/previous.py``): no data lost, no erased entry back, an old replica refusing with a
reason code instead of failing, and every erasure it leaves unfinished completed by this release, keys first.

The previous releases, by commit of this repository:

- ``7396e9a``, before sealing (schema head 0008): it knows no keys. Beside a database this release migrated it is not
  ready (``schema_newer``: its chat runs memory-free), its reads of the entries' text are refused by the database
  (``store_unavailable``: the plain-text columns are renamed), and each of its erasures fences its scope, has its
  delete refused by the trigger of migration 0014 (it destroyed no key) and answers ``erasure_failed``: it never
  answers ``verified`` while the erased entries' keys are still in the key store. Its sweep: ``store_unavailable``.
- ``7c22e94``, the last release (seals entries, knows keys, no binding; head 0013): not ready either
  (``schema_newer``); its reads and writes of sealed entries are served right (the key store is the same); each of
  its erasures destroys the erased keys and verifies them gone, then has its delete refused (its ``clear`` does not
  say so) and answers ``erasure_failed``; its sweep destroys the expired entries' keys, then is refused
  (``store_unavailable``).

Either way the scopes stay disabled with the erasure unfinished, and this release completes each one: the scope's
next operation, or ``sweep``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from previous import AGENT, drive
from support import KEY_STORE, key_store_of, keys_of, run_command

from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.keys import LocalKeyStore, entry_keys
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey
from kagent_memory_governed.store import NewFact, Store
from kagent_memory_governed.testing import embed

URL = "KAGENT_GOVERNED_MEMORY_DATABASE_URL"
SCOPES: dict[str, dict[str, Any]] = {
    "forget": {
        "mxid": "@alice:example.org",
        "room": "!forget:example.org",
        "facts": ["alice's locker code is 4312", "alice takes her tea with lemon"],
        "forget": "alice's locker code is 4312",
    },
    "forget_all": {"mxid": "@alice:example.org", "room": "!all:example.org", "facts": ["alice rides a red bike"]},
    "off": {"mxid": "@bob:example.org", "room": "!off:example.org", "facts": ["bob's sister lives in Lyon"]},
    "offboard_1": {"mxid": "@carol:example.org", "room": "!c1:example.org", "facts": ["carol plays the cello"]},
    "offboard_2": {"mxid": "@carol:example.org", "room": "!c2:example.org", "facts": ["carol is allergic to nuts"]},
    "kept": {
        "mxid": "@dave:example.org",
        "room": "!kept:example.org",
        "facts": ["dave prefers meetings after ten", "dave's team ships on Thursdays"],
        "expired": ["dave's parking spot was B12 last week"],  # written an hour back, for a minute
        "later": ["dave's new desk is by the window"],  # written by the old replica during the roll
    },
}
TEXTS = ("facts", "expired", "later")
ERASED = ("forget_all", "off", "offboard_1", "offboard_2")  # every entry; "forget": one
ENABLED_AFTER = {"forget": True, "forget_all": True, "off": False, "offboard_1": False, "offboard_2": False}
FAILED = [503, {"error": "erasure_failed"}]
SEALED_ENTRIES = "bad_input (sealed entries: erase them first, or keep 0011)"


def _schema_newer(head: str) -> str:
    return f"schema_newer (database at 0014, this package migrates to {head})"


# What each previous release answers beside the migrated database (``previous._serve``): ``keys`` says whether its
# erasures and its sweep destroy the keys they cover (before their delete is refused).
RELEASES: dict[str, dict[str, Any]] = {
    "7396e9a": {
        "head": "0008",
        "ready": ["refused", "schema_newer"],  # this release named no cause yet
        "entries": [503, {"error": "store_unavailable"}],  # it reads the plain text column: renamed
        "search": ["refused", "store_unavailable"],  # its search and write functions are gone since 0011
        "write": ["refused", "store_unavailable"],
        "sweep": ["refused", "store_unavailable"],  # its delete of the expired entry is refused by the trigger
        "keys": False,
    },
    "7c22e94": {
        "head": "0013",
        "ready": ["refused", _schema_newer("0013")],
        "entries": "served",  # the sealed entries, opened with the keys of the same key store
        "search": "served",
        "write": "served",
        "sweep": ["refused", "store_unavailable"],  # after destroying the expired entry's key
        "keys": True,
    },
}
_databases = itertools.count()


def _key(scope: dict[str, Any]) -> ScopeKey:
    return ScopeKey(Principal.parse(scope["mxid"], "native"), AgentId.parse(AGENT), ControlRoom.parse(scope["room"]))


@pytest.fixture(params=sorted(RELEASES))
def release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def shared(store: Store, database_url: str, sql: asyncpg.Connection) -> AsyncIterator[str]:
    """A new database on the test server (``store`` migrates the server's own), with a key store of its own."""
    name = f"rolling_{os.getpid()}_{next(_databases)}"
    await sql.execute(f"CREATE DATABASE {name}")
    yield database_url.replace("/postgres?", f"/{name}?")
    await sql.execute(f"DROP DATABASE {name} WITH (FORCE)")


async def _rows(url: str) -> dict[str, tuple[str, bool]]:
    """Every entry in the database: its scope, and whether it is sealed with no plain text beside."""
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        rows = await conn.fetch(
            "SELECT scope_id, entry_id, sealed IS NOT NULL AND plain_text IS NULL AND plain_embedding IS NULL AS sealed"
            " FROM governed_memory.entries"
        )
    finally:
        await conn.close()
    return {str(row["entry_id"]): (str(row["scope_id"]), row["sealed"]) for row in rows}


async def _keys(directory: Path, scope_ids: set[str]) -> set[str]:
    """The entry ids whose keys the key store still gives back, over ``scope_ids``."""
    store = LocalKeyStore(directory)
    try:
        return {str(entry) for scope in scope_ids for entry in entry_keys(await store.fetch(uuid.UUID(scope)))}
    finally:
        await store.close()


@pytest.mark.long
async def test_a_rolling_upgrade_loses_nothing_brings_back_no_erased_entry_and_completes_old_erasures(
    release: str, shared: str
) -> None:
    expected = RELEASES[release]
    directory = key_store_of(shared)
    env = {URL: shared, KEY_STORE: f"file://{directory}"}  # the old release knowing keys uses the same key store

    # the previous release's replicas serve a database they migrated
    vectors = {text: embed(text) for scope in SCOPES.values() for key in TEXTS for text in scope.get(key, [])}
    seeded = await asyncio.to_thread(drive, release, "seed", {"url": shared, "scopes": SCOPES, "vectors": vectors}, env)
    assert seeded["revision"] == expected["head"]
    written = seeded["scopes"]
    ids = {name: written[name]["entries"] for name in SCOPES}
    scope_ids = {written[name]["scope_id"] for name in SCOPES}

    # 1. this release's migrate Job: every entry sealed (7396e9a's were plain text), its key in the key store
    migrated = await asyncio.to_thread(run_command, "migrate", **{URL: shared})
    assert (migrated.returncode, migrated.stderr) == (0, "")
    assert migrated.stdout.endswith("governed memory schema at revision 0014\n")
    every = {entry for entries in ids.values() for entry in entries.values()}
    assert await _rows(shared) == {entry: (scope, True) for entry, scope in _owners(written, ids).items()}
    assert await _keys(directory, scope_ids) == every

    # 2. the old replicas, still serving during the roll: every refusal a reason code, no erasure "verified"
    request = {"url": shared, "scopes": SCOPES, "seeded": written, "vectors": vectors}
    served = await asyncio.to_thread(drive, release, "serve", request, env)
    assert served["ready"] == expected["ready"]  # its readiness; a pod of it that restarts exits 78 with it
    assert served["status"][0] == 200 and served["status"][1]["entries"] == 2  # the expired entry not counted
    kept_texts = SCOPES["kept"]["facts"]
    if expected["entries"] == "served":
        assert served["entries"][0] == 200
        assert sorted(entry["text"] for entry in served["entries"][1]["entries"]) == sorted(kept_texts)
        assert served["search"][0] == "ok" and served["search"][1][0]["text"] == kept_texts[0]
        assert served["write"][0] == "ok"
        [later] = served["write"][1]
        ids["kept"] |= {SCOPES["kept"]["later"][0]: later}
    else:
        assert (served["entries"], served["search"], served["write"]) == (
            expected["entries"],
            expected["search"],
            expected["write"],
        )
    for erasure in ("forget", "forget_all", "off", "offboard"):
        assert served[erasure] == FAILED, erasure  # never 200 {"verified": true}
    assert served["entries_forgetting"] == FAILED  # an unfinished erasure's entries are never shown
    for name, status in served["after"].items():
        assert status[0] == 200 and status[1]["enabled"] is False, name
        assert status[1]["last_erasure"]["result"] == "failed", name
    assert served["sweep"] == expected["sweep"]

    forgotten = ids["forget"][SCOPES["forget"]["forget"]]
    expired = ids["kept"][SCOPES["kept"]["expired"][0]]
    erased = {forgotten} | {entry for name in ERASED for entry in ids[name].values()}
    kept = {text: entry for name in SCOPES for text, entry in ids[name].items() if entry not in erased | {expired}}
    # no row deleted (none without its key destroyed first, and its delete says nothing of keys); the release that
    # knows keys destroyed the erased and expired entries' keys, the other none: so it answered no "verified"
    assert set(await _rows(shared)) == erased | {expired} | set(kept.values())
    left = await _keys(directory, scope_ids)
    assert left == set(kept.values()) | (set() if expected["keys"] else erased | {expired})

    # 3. this release: the scope's next operation completes its erasure, then `sweep` every other one
    store = Store.connect(shared, Policy(), keys=keys_of(shared))
    try:
        status = await store.status(_key(SCOPES["forget"]))
        assert status.last_erasure is not None and status.last_erasure.result.value == "verified"
        assert forgotten not in await _rows(shared) and forgotten not in await _keys(directory, scope_ids)

        swept = await asyncio.to_thread(run_command, "sweep", **{URL: shared})
        assert (swept.returncode, swept.stderr) == (0, "")
        assert swept.stdout.endswith("swept 1 expired entries\n")

        owners = _owners(written, ids)
        assert await _rows(shared) == {entry: (owners[entry], True) for entry in kept.values()}
        assert await _keys(directory, scope_ids) == set(kept.values())  # every erased or expired entry's key gone
        for name, enabled in ENABLED_AFTER.items():
            status = await store.status(_key(SCOPES[name]))
            assert status.last_erasure is not None and status.last_erasure.result.value == "verified", name
            assert status.enabled is enabled, name
        for name in ("forget", "kept"):  # every kept entry still opens, and is found
            key = _key(SCOPES[name])
            page = await store.inspect(key)
            mine = {text: entry for text, entry in kept.items() if entry in ids[name].values()}
            assert {entry.text: str(entry.entry_id) for entry in page.entries} == mine
            generation = (await store.status(key)).generation
            for text, entry in mine.items():
                [best, *_] = await store.search(key, generation, embed(text))
                assert (best.text, str(best.entry_id)) == (text, entry)
    finally:
        await store.close()


def _owners(written: dict[str, Any], ids: dict[str, dict[str, str]]) -> dict[str, str]:
    """Each entry id the previous release wrote, with its scope's id."""
    return {entry: written[name]["scope_id"] for name, entries in ids.items() for entry in entries.values()}


async def test_a_downgrade_below_sealing_with_sealed_entries_is_refused_in_one_line_and_changes_nothing(
    shared: str,
) -> None:
    """Before, ``migrate --to 0008`` over sealed entries failed like a defect: ``failed: internal_error
    (RuntimeError)``."""
    store = Store.connect(shared, Policy(), keys=keys_of(shared))
    try:
        assert await store.migrate() == "0014"
        key = _key(SCOPES["kept"])
        grant = await store.grant(key, purpose="p", policy_version="1")
        [entry] = await store.write(key, grant.generation, [NewFact("dave's desk is by the window", embed("desk"))])
        refused = await asyncio.to_thread(run_command, "migrate", "--to", "0008", **{URL: shared})
        assert (refused.returncode, refused.stderr) == (1, f"refused: {SEALED_ENTRIES}\n")
        with pytest.raises(GovernedMemoryError) as direct:
            await store.migrate("0010")  # any revision before sealing
        assert (direct.value.reason, direct.value.explained()) == (Reason.BAD_INPUT, SEALED_ENTRIES)
        assert await store.revision() == "0014"  # every step of the downgrade before the refusal rolled back
        await store.check_ready()
        assert [found.entry_id for found in (await store.inspect(key)).entries] == [entry]
        conn = await asyncpg.connect(shared.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            trigger = "SELECT count(*) FROM pg_trigger WHERE tgname = 'entries_deleted_after_keys'"
            assert await conn.fetchval(trigger) == 1
        finally:
            await conn.close()
    finally:
        await store.close()
