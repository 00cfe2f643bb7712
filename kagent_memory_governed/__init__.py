"""Governed long-term memory for kagent agents.

``install()`` activates it in a kagent-adk process; ``Store`` is the governed store over PostgreSQL; memory is a
``DataPlane`` of one call an operation, ``LocalPlane`` over a ``Store`` or ``RemoteStore`` through the governed
memory service (``serve``), which admits and embeds; ``Settings`` reads the
configuration; every refusal is a ``GovernedMemoryError`` whose ``Reason`` code is its whole message (the
exception tree is drawn once, in ``kagent_memory_governed.errors``). See the README for the guarantees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kagent_memory_governed import lazy
from kagent_memory_governed.errors import ConfigurationError, GovernedMemoryError, Operation, PolicyError, Reason

if TYPE_CHECKING:
    from kagent_memory_governed.adk.runtime import Mode, Runtime, install
    from kagent_memory_governed.adk.service import GovernedMemoryService
    from kagent_memory_governed.assertion import Trust
    from kagent_memory_governed.consent import Erasure
    from kagent_memory_governed.keys import Binding, EntryKey, Fence, KeyStore
    from kagent_memory_governed.policy import Policy
    from kagent_memory_governed.scope import AgentId, ControlRoom, Origin, Principal, ScopeKey
    from kagent_memory_governed.service.plane import DataPlane, RequestScope
    from kagent_memory_governed.service.remote import RemoteStore
    from kagent_memory_governed.service.values import Fact
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
    from kagent_memory_governed.store.plane import LocalPlane

# Imported on first use, not with the package: a client (``service.remote``, ``bridge``) imports this package first,
# and must not load the store, the key stores or kagent-adk with it. Only the errors, which every module imports, are
# eager.
__getattr__ = lazy.names(
    __name__,
    {
        "scope": "AgentId ControlRoom Origin Principal ScopeKey",
        "consent": "Erasure",
        "policy": "Policy",
        "assertion": "Trust",
        "settings": "Settings",
        "keys": "Binding EntryKey Fence KeyStore",
        "service.plane": "DataPlane RequestScope",
        "service.remote": "RemoteStore",
        "service.values": "Fact",
        "store": "Entry Erased ErasureRecord Grant Hit NewFact Offboarded Page Status Store Turn",
        "store.plane": "LocalPlane",
        "adk.runtime": "Mode Runtime install",  # these two modules need kagent-adk
        "adk.service": "GovernedMemoryService",
    },
    globals(),
)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AgentId",
    "Binding",
    "ConfigurationError",
    "ControlRoom",
    "DataPlane",
    "Entry",
    "EntryKey",
    "Erased",
    "Erasure",
    "ErasureRecord",
    "Fact",
    "Fence",
    "GovernedMemoryError",
    "GovernedMemoryService",
    "Grant",
    "Hit",
    "KeyStore",
    "LocalPlane",
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
    "RemoteStore",
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
