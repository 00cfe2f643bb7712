"""Activation: install governed memory into an unmodified kagent-adk 0.9.11 process (R31).

``install()`` replaces, by name, what kagent-adk looks up when it builds an agent and its app:

- ``kagent.adk._a2a.KagentMemoryService``       -> a factory returning the ``GovernedMemoryService``
- ``kagent.adk._a2a.Runner``                    -> a Runner that gets the governed service even in local mode
- ``kagent.adk._a2a.KAgentRequestContextBuilder`` -> binds the verified ``X-Memory-Scope`` per request
- ``AgentConfig._configure_memory``             -> governed tools, instruction and auto-save callback
- upstream's memory tool classes in their modules -> the governed subclasses
- ``KAgentApp.build``                           -> also mounts ``/memory/v1``, the memory-work middleware,
                                                  and checks the store at start-up
- the log-record factory and SDK span methods     -> the content boundary (``redaction``)

Upstream's ``KagentMemoryService`` and memory tools are then never constructed. Each replacement is
what an upstream patch in ``patches/`` makes pluggable. Activation that was asked for and fails ends
the process (``activate_from_environment``); it never falls back to upstream memory.
"""

from __future__ import annotations

import os
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from kagent_memory_governed.assertion import Trust
from kagent_memory_governed.errors import ConfigurationError
from kagent_memory_governed.scope import AgentId
from kagent_memory_governed.settings import Settings
from kagent_memory_governed.store import Store

ENVIRONMENT_SWITCH = "KAGENT_GOVERNED_MEMORY"
EXIT_ACTIVATION_FAILED = 78  # EX_CONFIG


@dataclass(frozen=True)
class Runtime:
    """What an activated process holds: one store, one trust, one memory service."""

    settings: Settings
    trust: Trust
    store: Store
    service: Any  # GovernedMemoryService; typed loosely to keep kagent imports out of this module's import


_runtime: Runtime | None = None


def _trust(settings: Settings) -> Trust:
    missing = [
        name
        for name, value in (
            ("KAGENT_GOVERNED_MEMORY_BRIDGE_PUBLIC_KEY", settings.bridge_public_key),
            ("KAGENT_GOVERNED_MEMORY_BRIDGE_ISSUER", settings.bridge_issuer),
            ("KAGENT_GOVERNED_MEMORY_HOMESERVER", settings.homeserver),
            ("KAGENT_NAMESPACE", settings.kagent_namespace),
            ("KAGENT_NAME", settings.kagent_name),
        )
        if not value
    ]
    if missing:
        raise ConfigurationError(f"governed memory needs {', '.join(missing)}")
    try:
        public_key = Trust.load_public_key(settings.bridge_public_key)
    except (OSError, ValueError, TypeError):
        raise ConfigurationError("KAGENT_GOVERNED_MEMORY_BRIDGE_PUBLIC_KEY: not an Ed25519 public key (PEM)") from None
    try:
        agent = AgentId.parse(f"{settings.kagent_namespace}/{settings.kagent_name}")
    except Exception:
        raise ConfigurationError("KAGENT_NAMESPACE/KAGENT_NAME: not a valid agent identity") from None
    return Trust(public_key, settings.bridge_issuer, agent, settings.homeserver)


def install(*, settings: Settings | None = None, store: Store | None = None, embedder: Any = None) -> Runtime:
    """Activate governed memory in this process; idempotent. Raises ``ConfigurationError`` when the
    configuration is incomplete. ``store`` and ``embedder`` are for embedding and tests; by default the
    store comes from the settings and the embedder from each Agent's ``memory.embedding``."""
    global _runtime
    if _runtime is not None:
        return _runtime
    try:
        settings = settings or Settings()
    except ValidationError as error:
        names = ", ".join(".".join(map(str, problem["loc"])) for problem in error.errors())
        raise ConfigurationError(f"invalid settings: {names}") from None
    trust = _trust(settings)
    if store is None:
        from kagent_memory_governed.embedded import database_url

        store = Store.connect(database_url(settings), settings.load_policy())

    import kagent.adk._a2a as a2a
    import kagent.adk.tools.memory_tools as memory_tools
    import kagent.adk.tools.prefetch_memory_tool as prefetch_tool
    from kagent.adk.types import AgentConfig

    from kagent_memory_governed import control, redaction
    from kagent_memory_governed.adk import tools
    from kagent_memory_governed.adk.request import context_builder
    from kagent_memory_governed.adk.service import GovernedMemoryService, kagent_embedder

    redaction.install()
    service = GovernedMemoryService(store, embedder)

    def memory_service_factory(*, embedding_config: Any = None, **_: Any) -> GovernedMemoryService:
        # kagent passes its controller client and ttl_days too: unused, memory never goes there
        if service._embedder is None and embedding_config is not None:
            service._embedder = kagent_embedder(embedding_config)
        return service

    class GovernedRunner(a2a.Runner):
        def __init__(self, **kwargs: Any) -> None:
            kwargs["memory_service"] = service
            super().__init__(**kwargs)

        async def run_async(self, *args: Any, **kwargs: Any) -> Any:
            try:
                async for event in super().run_async(*args, **kwargs):
                    yield event
            except Exception as error:
                if redaction.in_memory_work():  # kagent would answer str(error) to the caller
                    raise redaction.WithheldError(type(error).__name__) from None
                raise

    upstream_build = a2a.KAgentApp.build

    def build(self: Any, local: bool = False) -> Any:
        if self.agent_config is not None and self.agent_config.memory is not None:
            memory_service_factory(embedding_config=self.agent_config.memory.embedding)
        app = upstream_build(self, local=local)
        app.add_middleware(redaction.MemoryWorkMiddleware)
        control.mount(app, store, trust)
        upstream_lifespan = app.router.lifespan_context

        @asynccontextmanager
        async def lifespan(app: Any):
            await store.check_ready()  # a store that is not ready stops start-up
            async with upstream_lifespan(app) as state:
                yield state
            await service.drain()

        app.router.lifespan_context = lifespan
        return app

    a2a.KagentMemoryService = memory_service_factory
    a2a.Runner = GovernedRunner
    a2a.KAgentRequestContextBuilder = context_builder(trust)
    a2a.KAgentApp.build = build
    AgentConfig._configure_memory = tools.configure_memory
    memory_tools.SaveMemoryTool = tools.GovernedSaveMemoryTool
    memory_tools.LoadMemoryTool = tools.GovernedLoadMemoryTool
    prefetch_tool.PrefetchMemoryTool = tools.GovernedPrefetchMemoryTool
    _runtime = Runtime(settings, trust, store, service)
    return _runtime


def activate_from_environment() -> None:
    """Called at interpreter start (``kagent_memory_governed.pth``): with ``KAGENT_GOVERNED_MEMORY=on``,
    install or end the process with a content-free message and a non-zero status."""
    switch = os.environ.get(ENVIRONMENT_SWITCH, "").strip().lower()
    if switch in ("", "off"):
        return
    try:
        if switch != "on":
            raise ConfigurationError(f"{ENVIRONMENT_SWITCH} must be 'on' or 'off'")
        install()
    except Exception as error:
        detail = str(error) if isinstance(error, ConfigurationError) else type(error).__name__
        sys.stderr.write(f"kagent-memory-governed: activation failed: {detail}\n")
        sys.stderr.flush()
        os._exit(EXIT_ACTIVATION_FAILED)
