"""Governed long-term memory for kagent agents.

``install()`` activates it in a kagent-adk process; ``Store`` is the governed store over PostgreSQL;
``Settings`` reads the configuration; every refusal is a ``GovernedMemoryError`` whose ``Reason`` code is
its whole message. See the README for the guarantees.

    GovernedMemoryError(Exception)   a refusal or failure at run time; str() is the reason code
    ConfigurationError(ValueError)   start-up only: a setting is missing or invalid (named, never echoed)
      PolicyError                    a policy file or key is invalid
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kagent_memory_governed.assertion import Trust
from kagent_memory_governed.consent import Erasure
from kagent_memory_governed.errors import ConfigurationError, GovernedMemoryError, Operation, PolicyError, Reason
from kagent_memory_governed.keys import Binding, EntryKey, Fence, KeyStore
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import AgentId, ControlRoom, Origin, Principal, ScopeKey
from kagent_memory_governed.settings import Settings
from kagent_memory_governed.store import (
    Entry,
    Erased,
    ErasureRecord,
    Grant,
    Hit,
    NewFact,
    Offboarded,
    Page,
    Status,
    Store,
    Turn,
)

if TYPE_CHECKING:
    from kagent_memory_governed.adk.request import RequestScope
    from kagent_memory_governed.adk.runtime import Mode, Runtime, install
    from kagent_memory_governed.adk.service import GovernedMemoryService

# These need kagent-adk: imported on first use, not with the package.
_RUNTIME = {
    "Mode": "kagent_memory_governed.adk.runtime",
    "Runtime": "kagent_memory_governed.adk.runtime",
    "install": "kagent_memory_governed.adk.runtime",
    "GovernedMemoryService": "kagent_memory_governed.adk.service",
    "RequestScope": "kagent_memory_governed.adk.request",
}


def __getattr__(name: str) -> Any:
    if name in _RUNTIME:
        import importlib

        return getattr(importlib.import_module(_RUNTIME[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AgentId",
    "Binding",
    "ConfigurationError",
    "ControlRoom",
    "Entry",
    "EntryKey",
    "Erased",
    "Erasure",
    "ErasureRecord",
    "Fence",
    "GovernedMemoryError",
    "GovernedMemoryService",
    "Grant",
    "Hit",
    "KeyStore",
    "Mode",
    "NewFact",
    "Offboarded",
    "Operation",
    "Origin",
    "Page",
    "Policy",
    "PolicyError",
    "Principal",
    "Reason",
    "RequestScope",
    "Runtime",
    "ScopeKey",
    "Settings",
    "Status",
    "Store",
    "Trust",
    "Turn",
    "install",
]
