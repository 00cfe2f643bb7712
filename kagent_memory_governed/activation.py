"""Activation: install governed memory into a kagent-adk process (R31).

With kagent-adk's memory plugin surface (upstream patch 0001 in ``patches/``), ``install()`` only
selects this package's ``kagent.adk.memory`` entry point (``adk/integration.py``). On unmodified
kagent-adk 0.9.11 it replaces, by name, what kagent-adk looks up when it builds an agent and its app:

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
    mode: str  # "entry-point" (kagent-adk with the plugin surface) or "runtime-patching" (pinned 0.9.11)


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
        raise ConfigurationError(
            "KAGENT_GOVERNED_MEMORY_BRIDGE_PUBLIC_KEY: not an Ed25519 public key (PEM) of prime order"
        ) from None
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
        problems = [".".join(map(str, p["loc"])) or p["msg"].removeprefix("Value error, ") for p in error.errors()]
        raise ConfigurationError(f"invalid settings: {', '.join(problems)}") from None
    trust = _trust(settings)
    if store is None:
        from kagent_memory_governed.embedded import database_url

        store = Store.connect(database_url(settings), settings.load_policy())

    from kagent_memory_governed import redaction
    from kagent_memory_governed.adk import integration
    from kagent_memory_governed.adk.service import GovernedMemoryService

    redaction.install()
    service = GovernedMemoryService(store, embedder)
    entry_point = integration.upstream_has_plugins()
    runtime = Runtime(settings, trust, store, service, "entry-point" if entry_point else "runtime-patching")
    if entry_point:
        os.environ["KAGENT_MEMORY_PLUGIN"] = integration.PLUGIN_NAME  # kagent-adk loads our plugin itself
    else:
        integration.patch_kagent(runtime)
    _runtime = runtime
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
