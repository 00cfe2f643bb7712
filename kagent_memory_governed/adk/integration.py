"""How governed memory enters a kagent-adk process, in either of two modes:

- ``entry-point``: kagent-adk has the memory plugin surface (upstream patch 0001 in ``patches/``);
  ``GovernedMemoryPlugin`` answers its hooks and nothing in kagent is replaced;
- ``runtime-patching``: pinned, unmodified kagent-adk 0.9.11; ``patch_kagent`` replaces by name the
  classes and functions the plugin hooks stand for.

Both modes use the same pieces: one memory service, the governed Runner, the request context builder
binding the verified scope, the governed tools, and the app's control API, middleware and start-up check.
"""

from __future__ import annotations

import importlib.util
from contextlib import asynccontextmanager
from typing import Any

from google.adk.runners import Runner

from kagent_memory_governed import control, redaction
from kagent_memory_governed.adk import tools
from kagent_memory_governed.adk.boundary import RecallBoundary
from kagent_memory_governed.adk.request import context_builder
from kagent_memory_governed.adk.service import GovernedMemoryService, kagent_embedder

PLUGIN_NAME = "governed"  # the entry point name in the kagent.adk.memory group


def upstream_has_plugins() -> bool:
    """Whether the installed kagent-adk has the memory plugin surface of upstream patch 0001."""
    return importlib.util.find_spec("kagent.adk.memory_plugin") is not None


def use_embedding(service: GovernedMemoryService, embedding_config: Any) -> GovernedMemoryService:
    """The Agent's ``memory.embedding`` configures the embedder unless one was given at activation."""
    if service._embedder is None and embedding_config is not None:
        service._embedder = kagent_embedder(embedding_config)
    return service


def governed_runner(service: GovernedMemoryService) -> type[Runner]:
    """A Runner that always uses the governed service (local mode included), keeps recalled memory out of
    the events it persists (``RecallBoundary``), and whose failures inside memory work leave it without
    their text: kagent answers ``str(error)`` to the caller."""

    class GovernedRunner(Runner):
        def __init__(self, **kwargs: Any) -> None:
            kwargs["memory_service"] = service
            boundary = RecallBoundary()  # first, so no other plugin's answer can skip it
            if kwargs.get("app") is not None:
                app = kwargs["app"]
                kwargs["app"] = app.model_copy(update={"plugins": [boundary, *app.plugins]})
            else:
                kwargs["plugins"] = [boundary, *(kwargs.get("plugins") or [])]
            super().__init__(**kwargs)

        async def run_async(self, *args: Any, **kwargs: Any) -> Any:
            try:
                async for event in super().run_async(*args, **kwargs):
                    yield event
            except Exception as error:
                if redaction.in_memory_work():
                    raise redaction.WithheldError(type(error).__name__) from None
                raise

    return GovernedRunner


def configure_app(app: Any, runtime: Any) -> None:
    """The memory-work middleware, ``/memory/v1``, and a start-up that fails unless the store is ready."""
    app.add_middleware(redaction.MemoryWorkMiddleware)
    control.mount(app, runtime.store, runtime.trust)
    upstream_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: Any):
        await runtime.store.check_ready()
        async with upstream_lifespan(app) as state:
            yield state
        await runtime.service.drain()

    app.router.lifespan_context = lifespan


class GovernedMemoryPlugin:
    """The ``kagent.adk.memory`` entry point: upstream's plugin hooks, answered by the activated runtime."""

    @staticmethod
    def _runtime() -> Any:
        from kagent_memory_governed.activation import install

        return install()

    def create_memory_service(self, *, app_name: str, agent_config: Any, http_client: Any) -> GovernedMemoryService:
        memory = agent_config.memory if agent_config is not None else None
        return use_embedding(self._runtime().service, memory.embedding if memory is not None else None)

    def configure_agent(self, agent_config: Any, agent: Any) -> None:
        tools.configure_memory(agent_config, agent)

    def request_context_builder(self, task_store: Any) -> Any:
        return context_builder(self._runtime().trust)(task_store=task_store)

    @property
    def runner_class(self) -> type[Runner]:
        return governed_runner(self._runtime().service)

    def configure_app(self, app: Any) -> None:
        configure_app(app, self._runtime())


plugin = GovernedMemoryPlugin()


def in_charge(runtime: Any) -> bool:
    """Whether kagent-adk, as loaded in this process, builds memory from governed pieces only."""
    if runtime.mode == "entry-point":
        from kagent.adk.memory_plugin import load_memory_plugin

        return load_memory_plugin() is plugin
    import kagent.adk._a2a as a2a
    from kagent.adk._memory_service import KagentMemoryService
    from kagent.adk.types import AgentConfig

    return (
        a2a.KagentMemoryService is not KagentMemoryService and AgentConfig._configure_memory is tools.configure_memory
    )


def patch_kagent(runtime: Any) -> None:
    """Runtime-patching mode: replace by name what each plugin hook stands for (see activation)."""
    import kagent.adk._a2a as a2a
    import kagent.adk.tools.memory_tools as memory_tools
    import kagent.adk.tools.prefetch_memory_tool as prefetch_tool
    from kagent.adk.types import AgentConfig

    service = runtime.service
    upstream_build = a2a.KAgentApp.build

    def memory_service_factory(*, embedding_config: Any = None, **_: Any) -> GovernedMemoryService:
        return use_embedding(service, embedding_config)  # kagent's controller client is never used

    def build(self: Any, local: bool = False) -> Any:
        if self.agent_config is not None and self.agent_config.memory is not None:
            use_embedding(service, self.agent_config.memory.embedding)
        app = upstream_build(self, local=local)
        configure_app(app, runtime)
        return app

    a2a.KagentMemoryService = memory_service_factory
    a2a.Runner = governed_runner(service)
    a2a.KAgentRequestContextBuilder = context_builder(runtime.trust)
    a2a.KAgentApp.build = build
    AgentConfig._configure_memory = tools.configure_memory
    memory_tools.SaveMemoryTool = tools.GovernedSaveMemoryTool
    memory_tools.LoadMemoryTool = tools.GovernedLoadMemoryTool
    prefetch_tool.PrefetchMemoryTool = tools.GovernedPrefetchMemoryTool
