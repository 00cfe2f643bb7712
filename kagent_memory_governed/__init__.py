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
from kagent_memory_governed.errors import ConfigurationError, GovernedMemoryError, PolicyError, Reason
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import AgentId, ControlRoom, Origin, Principal, ScopeKey
from kagent_memory_governed.settings import Settings
from kagent_memory_governed.store import Entry, Hit, NewFact, Page, Status, Store

if TYPE_CHECKING:
    from kagent_memory_governed.adk.runtime import Mode, Runtime, install

_RUNTIME = {"Mode", "Runtime", "install"}  # need kagent-adk: imported on first use, not with the package


def __getattr__(name: str) -> Any:
    if name in _RUNTIME:
        from kagent_memory_governed.adk import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AgentId",
    "ConfigurationError",
    "ControlRoom",
    "Entry",
    "GovernedMemoryError",
    "Hit",
    "Mode",
    "NewFact",
    "Origin",
    "Page",
    "Policy",
    "PolicyError",
    "Principal",
    "Reason",
    "Runtime",
    "ScopeKey",
    "Settings",
    "Status",
    "Store",
    "Trust",
    "install",
]
