"""The store's health, for people and monitoring: ``GET /memory/ready`` and the health gauges.

What readiness means (docs/operator.md, "Health and metrics"): a pod is ready when it can chat. A store
that goes down after start-up does not make it unready: every replica shares the store, so gating on it
would take chat down on all of them at once, and chat carries on memory-free (memory work fails closed,
as over any limit). kagent's controller probes ``/.well-known/agent-card.json`` and the Agent CRD has no
probe field, so this is also what kagent lets a Declarative agent have. The store's state is reported
instead: ``/memory/ready`` (unauthenticated, content-free: ``200 {"ready": true}``, or ``503 {"error":
<reason code>}``) for a look by hand or a blackbox probe, and the gauges of ``metering``, refreshed every
``WATCH_SECONDS`` while the app runs, for alerts. At start-up a store that cannot serve stops the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from kagent_memory_governed import metering
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.store import Store

READY = "/memory/ready"
WATCH_SECONDS = 30.0  # half the OpenTelemetry SDK's default export interval


async def observe(store: Store) -> Reason | None:
    """Look at the store once and record it for the gauges: why it cannot serve (``None`` when it can) and,
    when it can, its unfinished erasures. Never raises for the store's sake."""
    try:
        await store.check_ready()
        erasures = await store.unfinished_erasures()
    except GovernedMemoryError as refused:
        metering.observe_store(metering.StoreHealth(refused.reason, None))
        return refused.reason
    metering.observe_store(metering.StoreHealth(None, erasures))
    return None


async def watch(store: Store, every: float = WATCH_SECONDS) -> None:
    """``observe`` every ``every`` seconds, from ``every`` seconds on, until cancelled."""
    while True:
        await asyncio.sleep(every)
        try:
            await observe(store)
        except Exception:  # a defect must not end the watch: report it as what it is
            metering.observe_store(metering.StoreHealth(Reason.INTERNAL_ERROR, None))


def mount(app: FastAPI, store: Store) -> None:
    """Add the probe to an agent's app, and the gauges' watch to its lifespan (idempotent)."""
    if getattr(app.state, "governed_memory_ready", False):
        return

    async def ready() -> JSONResponse:
        try:
            await store.check_ready()
        except GovernedMemoryError as refused:
            return JSONResponse({"error": refused.reason.value}, status_code=503)
        return JSONResponse({"ready": True})

    app.add_api_route(READY, ready, methods=["GET"], include_in_schema=False)
    upstream_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[Any]:
        await observe(store)  # the gauges have a value from the start
        watching = asyncio.create_task(watch(store))
        try:
            async with upstream_lifespan(app) as state:
                yield state
        finally:
            watching.cancel()
            with suppress(asyncio.CancelledError):
                await watching

    app.router.lifespan_context = lifespan
    app.state.governed_memory_ready = True
