"""``GET /memory/ready``: the readiness probe of an agent with governed memory.

Unauthenticated and content-free: ``200 {"ready": true}`` while the store is reachable, supported and
migrated to this package's head; ``503 {"error": <reason code>}`` otherwise (``store_unavailable``,
``schema_outdated``, ``unsupported_database``). kagent's own ``/health`` answers for the process only.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from kagent_memory_governed.errors import GovernedMemoryError
from kagent_memory_governed.store import Store

READY = "/memory/ready"


def mount(app: FastAPI, store: Store) -> None:
    """Add the probe to an agent's app (idempotent)."""
    if getattr(app.state, "governed_memory_ready", False):
        return

    async def ready() -> JSONResponse:
        try:
            await store.check_ready()
        except GovernedMemoryError as refused:
            return JSONResponse({"error": refused.reason.value}, status_code=503)
        return JSONResponse({"ready": True})

    app.add_api_route(READY, ready, methods=["GET"], include_in_schema=False)
    app.state.governed_memory_ready = True
