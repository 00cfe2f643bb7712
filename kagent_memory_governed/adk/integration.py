"""How governed memory enters a kagent-adk process, in either of two modes (``runtime.Mode``):

- ``entry-point``: kagent-adk has runtime extensions (upstream patch 0001 in ``patches/v<base>/``);
  ``runtime.GovernedMemoryExtension`` answers their hooks and nothing in kagent is replaced: the governed
  service comes from ``create_memory_service`` (local mode too), and what the governed Runner adds comes from
  ``plugins`` (``governed_plugins``);
- ``runtime-patching``: unmodified kagent-adk (a release of ``upstream.SUPPORTED``); ``patch_kagent``
  replaces by name the classes and functions the extension hooks stand for (``upstream.RUNTIME_PATCH_TARGETS``):

  - ``kagent.adk._a2a.KagentMemoryService``       -> a factory returning the ``GovernedMemoryService``
  - ``kagent.adk._a2a.Runner``                    -> a Runner that gets the governed service even in local mode
  - ``kagent.adk._a2a.KAgentRequestContextBuilder`` -> binds the verified ``X-Memory-Scope`` per request
  - ``AgentConfig._configure_memory``             -> governed tools, instruction and auto-save callback
  - upstream's memory tool classes in their modules -> the governed subclasses
  - ``KAgentApp.build``                           -> also mounts ``/memory/v1``, the memory-work middleware,
                                                    and checks the store at start-up

Both modes use the same pieces: one memory service, the recall boundary, failures inside memory work without
their text, the request context builder binding the verified scope, the governed tools, and the app's control
API, middleware and start-up check.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

from google.adk.plugins import BasePlugin
from google.adk.runners import Runner
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.tool_context import ToolContext

from kagent_memory_governed import health, redaction
from kagent_memory_governed.adk import tools
from kagent_memory_governed.adk.boundary import RecallBoundary
from kagent_memory_governed.adk.request import context_builder
from kagent_memory_governed.adk.service import GovernedMemoryService
from kagent_memory_governed.errors import GovernedMemoryError
from kagent_memory_governed.service.remote import RemoteStore

if TYPE_CHECKING:
    from kagent_memory_governed.assertion import Trust
    from kagent_memory_governed.store import Store


class Runtime(Protocol):
    """What an activated process hands the integration (``runtime.Runtime`` is one): declared here, so that the
    integration never imports the module that installs it."""

    @property
    def trust(self) -> Trust: ...

    @property
    def store(self) -> Store | RemoteStore: ...

    @property
    def service(self) -> GovernedMemoryService: ...


EXIT_NOT_READY = 78  # EX_CONFIG: the database is unreachable, unsupported or not migrated


def upstream_has_extensions() -> bool:
    """Whether the installed kagent-adk has the runtime extensions of upstream patch 0001."""
    return importlib.util.find_spec("kagent.adk.extensions") is not None


def governed_runner(service: GovernedMemoryService) -> type[Runner]:
    """A Runner that always uses the governed service (local mode included), keeps recalled memory out of
    the events it persists (``RecallBoundary``), and whose failures inside memory work leave it without
    their text: kagent answers ``str(error)`` to the caller."""

    class GovernedRunner(Runner):
        def __init__(self, **kwargs: Any) -> None:
            kwargs["memory_service"] = service
            super().__init__(**kwargs)
            self.plugin_manager.plugins.insert(0, RecallBoundary())  # first: no other plugin's answer skips it

        async def run_async(self, *args: Any, **kwargs: Any) -> Any:
            try:
                async for event in super().run_async(*args, **kwargs):
                    yield event
            except Exception as error:
                if redaction.in_memory_work():
                    raise redaction.WithheldError(type(error).__name__) from None
                raise

    return GovernedRunner


class MemoryWorkToolErrors(BasePlugin):
    """A tool that fails inside memory work answers its exception type only: kagent would publish the exception's
    text. In runtime-patching mode ``GovernedRunner.run_async`` withholds such failures; entry-point mode has no
    Runner of its own, so this plugin does (model failures are the recall boundary's)."""

    def __init__(self) -> None:
        super().__init__(name="governed_memory_tool_errors")

    async def on_tool_error_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext, error: Exception
    ) -> dict[str, Any] | None:
        if redaction.in_memory_work():
            return {"error": str(redaction.WithheldError(type(error).__name__))}
        return None


def governed_plugins() -> list[BasePlugin]:
    """Entry-point mode's counterpart of ``governed_runner``: the plugins kagent-adk registers before its own."""
    return [RecallBoundary(), MemoryWorkToolErrors()]


def configure_app(app: Any, runtime: Runtime) -> None:
    """The memory-work middleware, ``/memory/ready``, and a start-up that fails unless the store is ready; with the
    in-process store also the control API ``/memory/v1`` (through the service, the service serves it: what
    ``inspect`` answers never transits this pod)."""
    app.add_middleware(redaction.MemoryWorkMiddleware)
    store = runtime.store
    if not isinstance(store, RemoteStore):
        from kagent_memory_governed import control

        control.mount(app, store, runtime.trust)
    health.mount(app, store)
    upstream_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        try:
            await store.check_ready()
        except GovernedMemoryError as refused:  # one content-free line and EX_CONFIG, never a traceback
            sys.stderr.write(f"kagent-memory-governed: not serving: {refused.explained()}\n")
            sys.stderr.flush()
            os._exit(EXIT_NOT_READY)
        if isinstance(store, RemoteStore):
            line = "memory through the governed memory service; this process holds no database or key-store credential"
        else:
            _, replication = await store.replication()  # what a failover means for erasures, content-free
            line = f"replication: {replication}"
        sys.stderr.write(f"kagent-memory-governed: {line}\n")
        sys.stderr.flush()
        async with upstream_lifespan(app) as state:
            yield state
        await runtime.service.drain()

    app.router.lifespan_context = lifespan


def patched() -> bool:
    """Whether unmodified kagent-adk, as loaded in this process, has its memory pieces replaced."""
    import kagent.adk._a2a as a2a
    from kagent.adk._memory_service import KagentMemoryService
    from kagent.adk.types import AgentConfig

    return (
        getattr(a2a, "KagentMemoryService") is not KagentMemoryService  # noqa: B009  (a name runtime patching replaces)
        and getattr(AgentConfig, "_configure_memory") is tools.configure_memory  # noqa: B009
    )


def patch_kagent(runtime: Runtime) -> None:
    """Runtime-patching mode: replace by name what each extension hook stands for (the module docstring)."""
    import kagent.adk._a2a as a2a
    import kagent.adk.tools.memory_tools as memory_tools
    import kagent.adk.tools.prefetch_memory_tool as prefetch_tool
    from kagent.adk.types import AgentConfig

    service = runtime.service
    upstream_build = a2a.KAgentApp.build

    def memory_service_factory(*, embedding_config: Any = None, **_: Any) -> GovernedMemoryService:
        service.configure_embedding(embedding_config)  # kagent's controller client is never used
        return service

    def build(self: Any, local: bool = False) -> Any:
        if self.agent_config is not None and self.agent_config.memory is not None:
            service.configure(self.agent_config.memory)  # its embedding; its ttl_days may lower expiry
        app = upstream_build(self, local=local)
        configure_app(app, runtime)
        return app

    replacements: list[tuple[object, str, object]] = [
        (a2a, "KagentMemoryService", memory_service_factory),
        (a2a, "Runner", governed_runner(service)),
        (a2a, "KAgentRequestContextBuilder", context_builder(runtime.trust)),
        (a2a.KAgentApp, "build", build),
        (AgentConfig, "_configure_memory", tools.configure_memory),
        (memory_tools, "SaveMemoryTool", tools.GovernedSaveMemoryTool),
        (memory_tools, "LoadMemoryTool", tools.GovernedLoadMemoryTool),
        (prefetch_tool, "PrefetchMemoryTool", tools.GovernedPrefetchMemoryTool),
    ]
    for owner, name, replacement in replacements:  # by name: what upstream.RUNTIME_PATCH_TARGETS lists
        setattr(owner, name, replacement)
