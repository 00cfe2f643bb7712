"""A memory-service replica SIGKILLed mid-write and mid-erasure (#35): the short, deterministic version of
benchmarks/service_chaos.py. Two ``serve`` processes over one PostgreSQL and one key store, two agent replicas and
the bridge; each strike holds one call where it must land (inside the write statement; before an erasure's fence,
between fence and delete, between delete and settle), SIGKILLs the replica serving it, lets the replica's backends
end or finish their statement, restarts it, and checks the invariants against the database: nothing acknowledged
lost, a struck write all or none, every interrupted erasure left disabled and completed exactly by the next
operation on its scope or by ``kagent-memory-governed sweep``, nothing erased back through either replica, only
reason codes seen by the clients (``service_unavailable`` while a replica is down, and the clients fail over), no
sentinel in any log line of either replica, the sweep or this process."""

from __future__ import annotations

import random

import pytest
from support import benchmark, private_directory

from kagent_memory_governed.errors import GovernedMemoryError, Reason


@pytest.mark.long
async def test_a_service_replica_killed_mid_write_and_mid_erasure_keeps_every_invariant() -> None:
    bench = benchmark("service_chaos")
    rng = random.Random(35)
    with bench.chaos.watching_logs() as watch:
        async with bench.Harness.running(private_directory("service-chaos"), scopes=5, seed=35) as h:
            run, (a, b), (pod_a, _) = h.run, h.replicas, h.pods
            for scope in h.scopes:  # acknowledged entries in every scope, through each agent and service replica
                for pod in h.pods:
                    await h.save(pod, scope, rng, operation="autosave", lasting=True, sentinel=pod is pod_a)
            await h.check()
            alone, failover, erased, off, one = h.scopes

            # a write inside its statement at replica a, a killed, its backend ended with it: nothing of it lands
            write = await h.strike_write(0, rng, orphans="end", scope=alone)
            assert (write.landed, write.outcome) == (True, "service_unavailable")
            # while a is down, the agent replica calling it sees service_unavailable and fails over to b; so does
            # the bridge
            try:
                await h.save(pod_a, failover, rng, operation="autosave", lasting=True)
                raise AssertionError("a call to a replica that is down was answered")
            except GovernedMemoryError as refused:
                assert refused.reason is Reason.SERVICE_UNAVAILABLE
            assert pod_a.current == 1 and await h.save(pod_a, failover, rng, operation="autosave", lasting=True)
            try:
                await h.control(failover, lambda client: client.status())
                raise AssertionError("a control call to a replica that is down was answered")
            except bench.Unanswered:
                pass
            assert h.bridge_current == 1 and (await h.control(failover, lambda client: client.status())).enabled
            await h.restart(0)
            await h.settle("the next data-plane call")
            await h.check()

            # the same at replica b, its backend left to finish the statement of a client that is gone: all lands
            write = await h.strike_write(1, rng, orphans="finish", scope=alone)
            assert (write.landed, write.outcome) == (True, "service_unavailable")
            await h.restart(1)
            await h.settle("the next data-plane call")
            await h.check()
            assert run.checks["struck writes landed none"] == 1 and run.checks["struck writes landed all"] == 1

            # forget-all between fence and delete (keys destroyed, rows there), replica a and its backend gone:
            # disabled, then completed by an agent replica's next call at the generation it knew
            strike = await h.strike_erasure(
                0, rng, where="between fence and delete", orphans="end", name="forget_all", scope=erased
            )
            assert (strike.landed, strike.outcome) == (True, "unanswered")
            await h.capture()
            assert run.checks["interrupted erasures found"] == 1
            await h.restart(0)
            await h.settle("the next data-plane call")
            await h.check()
            await h.read_back(erased)

            # off between delete and settle, replica b and its backend gone: completed by the sweep, run as a process
            strike = await h.strike_erasure(
                1, rng, where="between delete and settle", orphans="end", name="off", scope=off
            )
            assert (strike.landed, strike.outcome) == (True, "unanswered")
            await h.restart(1)
            await h.settle("the sweep process")
            await h.check()
            await h.read_back(off)

            # forget one entry held before its fence, replica a killed, the fence committed after it died:
            # completed by the bridge's next control call, that entry only
            strike = await h.strike_erasure(
                0, rng, where="before the fence", orphans="finish", name="forget", scope=one
            )
            assert (strike.landed, strike.outcome) == (True, "unanswered")
            await h.restart(0)
            await h.settle("the next control call")
            await h.check()
            await h.read_back(one)

            # forget-all between delete and settle, its backend left to finish: settled by the dead replica's
            # backend, the answer lost; nothing left to complete
            strike = await h.strike_erasure(
                1, rng, where="between delete and settle", orphans="finish", name="forget_all", scope=failover
            )
            assert (strike.landed, strike.outcome) == (True, "unanswered")
            await h.restart(1)
            await h.settle("the sweep process")
            await h.check()
            for scope in h.scopes:
                await h.read_back(scope)
            await h.check()
        leaks = h.leaks()
    assert +run.violations == {} and +run.escapes == {}
    assert leaks == {} and +watch.leaks == {} and run.checks["service log lines read"] > 1000
    checks = run.checks
    assert checks["interrupted erasures found"] == 3  # off, forget-all and forget one; each completed exactly:
    assert checks["interrupted erasures completed by the next data-plane call"] == 1
    assert checks["interrupted erasures completed by the sweep process"] == 1
    assert checks["interrupted erasures completed by the next control call"] == 1
    assert checks["reads through the data plane"] and checks["reads through inspect"]
    assert checks["checks"] == 8 and run.operations["sentinel writes"]
    assert set(h.stopped.values()) == {0}  # both replicas stopped cleanly at the end
    assert a.incarnation == 4 and b.incarnation == 4
