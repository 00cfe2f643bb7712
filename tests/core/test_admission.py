"""Cost admission before model work, shared by every replica through PostgreSQL (R21-R27)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypedDict, Unpack

import asyncpg
import pytest
from freezegun import freeze_time

from kagent_memory_governed.errors import GovernedMemoryError
from kagent_memory_governed.keys import KeyStore, LocalKeyStore
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import Store

T0 = datetime(2026, 7, 1, 9, tzinfo=UTC)


class Admission(TypedDict, total=False):
    """What ``Store.admit`` is asked to admit, besides the scope and its generation."""

    units: int
    explicit: bool


async def _outcome(store: Store, key: ScopeKey, generation: int, **kwargs: Unpack[Admission]) -> str:
    try:
        await store.admit(key, generation, "save" if kwargs.get("explicit") else "prefetch", **kwargs)
    except GovernedMemoryError as refused:
        return refused.reason.value
    return "ok"


@pytest.mark.long
async def test_the_fourth_in_a_burst_and_the_seventh_in_a_minute_are_refused(store: Store, key: ScopeKey) -> None:
    with freeze_time(T0, real_asyncio=True) as frozen:
        generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
        explicit: Admission = {"units": 1, "explicit": True}
        assert [await _outcome(store, key, generation, **explicit) for _ in range(4)] == ["ok"] * 3 + ["rate_limited"]
        outcomes = []
        for seconds in (10, 20, 30, 40):  # one token back every 10 s; the 7th inside the minute is refused
            frozen.move_to(T0 + timedelta(seconds=seconds))
            outcomes.append(await _outcome(store, key, generation, **explicit))
        assert outcomes == ["ok", "ok", "ok", "rate_limited"]
        frozen.move_to(T0 + timedelta(seconds=60) - timedelta(microseconds=1))
        assert await _outcome(store, key, generation, **explicit) == "rate_limited"
        frozen.move_to(T0 + timedelta(seconds=60))  # the three of T0 leave the window exactly now
        assert await _outcome(store, key, generation, **explicit) == "ok"


async def test_tokens_refill_up_to_the_burst_and_a_clock_step_back_adds_none(store: Store, key: ScopeKey) -> None:
    with freeze_time(T0, real_asyncio=True) as frozen:
        generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
        explicit: Admission = {"units": 1, "explicit": True}
        assert [await _outcome(store, key, generation, **explicit) for _ in range(3)] == ["ok"] * 3
        frozen.move_to(T0 - timedelta(seconds=30))  # the clock steps back: no token accrues
        assert await _outcome(store, key, generation, **explicit) == "rate_limited"
        frozen.move_to(T0 + timedelta(seconds=9, microseconds=999_999))  # 0.99 of a token at 6 a minute
        assert await _outcome(store, key, generation, **explicit) == "rate_limited"
        frozen.move_to(T0 + timedelta(hours=1))  # an idle hour refills the burst and no more
        assert [await _outcome(store, key, generation, **explicit) for _ in range(4)] == ["ok"] * 3 + ["rate_limited"]


async def test_the_explicit_limit_is_per_sender_and_agent_across_rooms(
    store: Store, new_key: Callable[..., ScopeKey]
) -> None:
    rooms = [new_key(), new_key()]
    with freeze_time(T0, real_asyncio=True):
        generations = [(await store.grant(k, purpose="assist", policy_version="v1")).generation for k in rooms]
        outcomes = [await _outcome(store, rooms[n % 2], generations[n % 2], units=1, explicit=True) for n in range(4)]
        assert outcomes == ["ok", "ok", "ok", "rate_limited"]
        other_agent = new_key(agent="kagent/planner")
        generation = (await store.grant(other_agent, purpose="assist", policy_version="v1")).generation
        assert await _outcome(store, other_agent, generation, units=1, explicit=True) == "ok"


async def test_the_61st_unit_of_an_hour_is_refused_whatever_its_kind(store: Store, key: ScopeKey) -> None:
    with freeze_time(T0, real_asyncio=True) as frozen:
        generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
        for minute, units in enumerate([8, 8, 8, 8, 8, 8, 8, 1, 1, 1, 1]):  # prefetches, a summary, embeddings
            frozen.move_to(T0 + timedelta(minutes=minute))
            assert await _outcome(store, key, generation, units=units) == "ok"
        frozen.move_to(T0 + timedelta(minutes=20))
        assert await _outcome(store, key, generation, units=1, explicit=True) == "hourly_ceiling"
        assert await _outcome(store, key, generation, units=1) == "hourly_ceiling"
        frozen.move_to(T0 + timedelta(hours=1))  # the first prefetch's 8 units leave the window
        assert await _outcome(store, key, generation, units=8) == "ok"
        assert await _outcome(store, key, generation, units=1) == "hourly_ceiling"


async def test_refused_admission_records_no_usage_and_a_fenced_scope_is_refused_first(
    store: Store, key: ScopeKey, sql: asyncpg.Connection
) -> None:
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    assert await _outcome(store, key, generation, units=61) == "hourly_ceiling"
    assert await _outcome(store, key, generation + 1, units=1) == "consent_stale"
    assert await sql.fetchval("SELECT count(*) FROM governed_memory.usage") == 0


async def test_a_lowered_policy_lowers_the_limits(database_url: str, key_store: KeyStore, key: ScopeKey) -> None:
    lowered = Store.connect(database_url, Policy(explicit_burst=1, scope_ops_per_hour=2), keys=key_store)
    try:
        with freeze_time(T0, real_asyncio=True):
            generation = (await lowered.grant(key, purpose="assist", policy_version="v1")).generation
            assert await _outcome(lowered, key, generation, units=1, explicit=True) == "ok"
            assert await _outcome(lowered, key, generation, units=1, explicit=True) == "rate_limited"
            assert await _outcome(lowered, key, generation, units=1) == "ok"
            assert await _outcome(lowered, key, generation, units=1) == "hourly_ceiling"
    finally:
        await lowered.close()


async def test_concurrent_admissions_never_pass_the_ceiling(store: Store, key: ScopeKey) -> None:
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    outcomes = Counter(await asyncio.gather(*(_outcome(store, key, generation, units=1) for _ in range(80))))
    assert outcomes == {"ok": 60, "hourly_ceiling": 20}


async def test_concurrent_explicit_operations_of_one_sender_across_rooms_share_one_burst(
    store: Store, new_key: Callable[..., ScopeKey]
) -> None:
    rooms = [new_key(), new_key(), new_key()]
    generations = [(await store.grant(k, purpose="assist", policy_version="v1")).generation for k in rooms]
    attempts = [_outcome(store, rooms[n % 3], generations[n % 3], units=1, explicit=True) for n in range(12)]
    assert Counter(await asyncio.gather(*attempts)) == {"ok": 3, "rate_limited": 9}


REPLICA = textwrap.dedent(
    """
    import asyncio, sys
    from kagent_memory_governed import GovernedMemoryError, Policy, Store
    from kagent_memory_governed.keys import LocalKeyStore
    from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey

    async def main(url, generation, attempts, keys):
        store = Store.connect(url, Policy(), keys=LocalKeyStore(keys))
        key = ScopeKey(Principal.parse("@alice:example.org", "native"), AgentId.parse("kagent/helper"),
                       ControlRoom.parse("!replicas:example.org"))
        admitted = 0
        async def one():
            nonlocal admitted
            try:
                await store.admit(key, generation, "prefetch", units=1)
                admitted += 1
            except GovernedMemoryError:
                pass
        await asyncio.gather(*(one() for _ in range(attempts)))
        await store.close()
        print(admitted)

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
    """
)


async def test_two_replica_processes_share_one_ceiling(
    store: Store, database_url: str, key_store: LocalKeyStore, new_key: Callable[..., ScopeKey]
) -> None:
    keys = key_store.root  # each replica process is handed the store's key store, as its operator would
    key = new_key(room="!replicas:example.org")
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    replicas = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", REPLICA, database_url, str(generation), "45", str(keys), stdout=subprocess.PIPE
        )
        for _ in range(2)
    ]
    admitted = [int((await replica.communicate())[0]) for replica in replicas]
    assert sum(admitted) == 60 and all(count > 0 for count in admitted)
