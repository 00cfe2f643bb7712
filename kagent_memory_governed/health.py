"""The store's health, for people and monitoring: ``GET /memory/ready`` and the health gauges.

What readiness means (docs/operator.md, "Health and metrics"): a pod is ready when it can chat. A store
that goes down after start-up does not make it unready: every replica shares the store, so gating on it
would take chat down on all of them at once, and chat carries on memory-free (memory work fails closed,
as over any limit). kagent's controller probes ``/.well-known/agent-card.json`` and the Agent CRD has no
probe field, so this is also what kagent lets a Declarative agent have. The store's state is reported
instead: ``/memory/ready`` (unauthenticated, content-free: ``200 {"ready": true}``, or ``503 {"error":
<reason code>, "cause": <its cause, when known>}``) for a look by hand or a blackbox probe, the gauges of
``metering``, refreshed every ``WATCH_SECONDS`` while the app runs, for alerts, and one WARNING line a change of
the store's state, for the log. At start-up a store that cannot serve stops the server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any, Protocol

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from kagent_memory_governed import metering
from kagent_memory_governed.consent import Erasure
from kagent_memory_governed.errors import GovernedMemoryError, Reason

logger = logging.getLogger(__name__)
READY = "/memory/ready"
WATCH_SECONDS = 30.0  # half the OpenTelemetry SDK's default export interval


class Store(Protocol):
    """What is looked at: the in-process ``store.Store``, or the memory service as a runtime reaches it
    (``service.remote.RemoteStore``, which counts no erasures: the service reports its own)."""

    async def check_ready(self) -> None: ...

    async def unfinished_erasures(self) -> Mapping[Erasure, int] | None: ...


async def observe(store: Store) -> Reason | None:
    """Look at the store once and record it for the gauges: why it cannot serve (``None`` when it can) and,
    when it can, its unfinished erasures. Never raises for the store's sake."""
    refused = await _look(store, None)
    return refused.reason if refused else None


async def _look(store: Store, last: str | None) -> GovernedMemoryError | None:
    """``observe``, logging each change of state since ``last`` (the reason code the previous look found) as one
    content-free WARNING line with its cause, so an operator reading the log sees why memory is off and when it
    is back (a cause that changes within one outage, a lost connection then a refused one, is not a new state)."""
    try:
        await store.check_ready()
        erasures = await store.unfinished_erasures()
    except GovernedMemoryError as refused:
        metering.observe_store(metering.StoreHealth(refused.reason, None))
        if refused.reason.value != last:
            logger.warning("memory store unavailable: %s", refused.explained())
        return refused
    metering.observe_store(metering.StoreHealth(None, erasures))
    if last is not None:
        logger.warning("memory store serving again")
    return None


async def watch(store: Store, every: float = WATCH_SECONDS, *, last: str | None = None) -> None:
    """``observe`` every ``every`` seconds, from ``every`` seconds on, until cancelled; ``last``: the reason code
    the look before this watch found."""
    while True:
        await asyncio.sleep(every)
        try:
            refused = await _look(store, last)
            last = refused.reason.value if refused else None
        except Exception:  # a defect must not end the watch: report it as what it is
            metering.observe_store(metering.StoreHealth(Reason.INTERNAL_ERROR, None))


def mount(app: FastAPI, store: Store) -> None:
    """Add the probe to an agent's app, and the gauges' watch to its lifespan (idempotent)."""
    if getattr(app.state, "governed_memory_ready", False):
        return

    async def ready() -> JSONResponse:
        try:
            await store.check_ready()
        except GovernedMemoryError as refused:  # its content-free cause too: an operator looks to learn why
            body = {"error": refused.reason.value} | ({"cause": refused.shown} if refused.shown else {})
            return JSONResponse(body, status_code=503)
        return JSONResponse({"ready": True})

    app.add_api_route(READY, ready, methods=["GET"], include_in_schema=False)
    upstream_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[Any]:
        first = await _look(store, None)  # the gauges have a value from the start
        watching = asyncio.create_task(watch(store, last=first.reason.value if first else None))
        try:
            async with upstream_lifespan(app) as state:
                yield state
        finally:
            watching.cancel()
            with suppress(asyncio.CancelledError):
                await watching

    app.router.lifespan_context = lifespan
    app.state.governed_memory_ready = True
