"""The process runtime: one store, one trust, one memory service, installed once per process (R31).

``install()`` builds it and puts it in charge of kagent-adk: with kagent-adk's runtime extensions
(upstream patch 0001 in ``patches/v<base>/``) by selecting this package's ``kagent.adk.extensions`` entry point,
``extension``; on unmodified kagent-adk (``upstream.SUPPORTED``) by ``integration.patch_kagent``.
``active()`` is the way to reach it. Upstream's ``KagentMemoryService`` and memory tools are then never
constructed; activation never falls back to upstream memory.

Its store is one of two (``mode``): with ``KAGENT_GOVERNED_MEMORY_SERVICE_URL`` the governed memory service's
data plane (``service.remote.RemoteStore``), and this process holds no database or key-store credential; without,
the in-process ``Store``, which holds both for every scope of the agent: the default for local runs, the demo and
tests, and inside a Kubernetes pod only with ``KAGENT_GOVERNED_MEMORY_IN_PROCESS=true``.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from google.adk.plugins import BasePlugin

from kagent_memory_governed import metering, redaction
from kagent_memory_governed.adk import integration, tools
from kagent_memory_governed.adk.request import context_builder
from kagent_memory_governed.adk.service import GovernedMemoryService
from kagent_memory_governed.assertion import Trust
from kagent_memory_governed.embedding import Embedder
from kagent_memory_governed.mode import connect, load
from kagent_memory_governed.service.remote import RemoteStore
from kagent_memory_governed.settings import Settings
from kagent_memory_governed.store import Store

EXTENSION_NAME = "governed"  # the entry point name in the kagent.adk.extensions group


class Mode(StrEnum):
    """How the runtime is in charge of kagent-adk."""

    ENTRY_POINT = "entry-point"  # kagent-adk with runtime extensions loads ``extension``
    RUNTIME_PATCHING = "runtime-patching"  # pinned, unmodified kagent-adk: replaced by name


@dataclass(frozen=True)
class Runtime:
    """What an activated process holds."""

    settings: Settings
    trust: Trust
    store: Store | RemoteStore
    service: GovernedMemoryService
    mode: Mode

    @property
    def remote(self) -> bool:
        """Whether memory is reached through the governed memory service (this process holds no credential)."""
        return isinstance(self.store, RemoteStore)

    def in_charge(self) -> bool:
        """Whether kagent-adk, as loaded in this process, builds memory from governed pieces only."""
        if self.mode is Mode.ENTRY_POINT:
            extensions = importlib.import_module("kagent.adk.extensions")  # only with upstream patch 0001

            return bool(extensions.load_extension() is extension)
        return integration.patched()


_active: Runtime | None = None


def active() -> Runtime | None:
    """The runtime installed in this process, or ``None`` before ``install()``."""
    return _active


def install(
    *, settings: Settings | None = None, store: Store | RemoteStore | None = None, embedder: Embedder | None = None
) -> Runtime:
    """Activate governed memory in this process; idempotent. Raises ``ConfigurationError`` when the
    configuration is incomplete or invalid. ``store`` and ``embedder`` are for embedding and tests; by
    default the store comes from the settings (``mode.connect``) and, in process, the embedder from each Agent's
    ``memory.embedding`` (through the memory service, the service embeds: ``embedder`` is not used)."""
    global _active
    if _active is not None:
        return _active
    settings = settings or load()
    trust = settings.trust()
    if store is None:
        store = connect(settings)
    redaction.install()
    metering.export_from_environment()
    mode = Mode.ENTRY_POINT if integration.upstream_has_extensions() else Mode.RUNTIME_PATCHING
    runtime = Runtime(settings, trust, store, GovernedMemoryService(store.plane(embedder)), mode)
    if mode is Mode.ENTRY_POINT:
        os.environ["KAGENT_ADK_EXTENSION"] = EXTENSION_NAME  # kagent-adk loads ``extension`` itself
    else:
        integration.patch_kagent(runtime)
    _active = runtime
    return runtime


class GovernedMemoryExtension:
    """The ``kagent.adk.extensions`` entry point: the hooks of upstream's ``RuntimeExtension`` Protocol (patch 0001
    of ``patches/v<base>/``), answered by the installed runtime (installing it from the environment if kagent-adk
    loads the extension first). It implements every hook of the 0.9.11 and 0.10.4 series, so it satisfies that
    Protocol without importing it (runtime-patching mode has no ``kagent.adk.extensions``). kagent-adk 1.0's
    Protocol also has ``grpc_interceptors``, which this class does not answer yet: 1.0 refuses to load it rather
    than serve gRPC requests unmarked (CONTRIBUTING.md, "The port to kagent-adk 1.0")."""

    def create_memory_service(self, context: Any) -> GovernedMemoryService:
        service = install().service
        service.configure(context.memory)  # its embedding; its ttl_days may lower expiry
        return service

    def configure_memory(self, agent: Any, memory: Any) -> bool:
        tools.configure_memory(memory, agent)
        return True  # upstream's memory tools, instruction and auto-save are never added

    def request_context_builder(self, context: Any, task_store: Any) -> Any:
        return context_builder(install().trust)(task_store=task_store)

    def plugins(self, context: Any) -> list[BasePlugin]:
        return integration.governed_plugins()

    def configure_app(self, context: Any, app: Any) -> None:
        integration.configure_app(app, install())


extension = GovernedMemoryExtension()
