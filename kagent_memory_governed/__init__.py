"""Governed long-term memory for kagent agents.

``install()`` activates it in a kagent-adk process; ``Store`` is the governed store; every refusal is a
``GovernedMemoryError`` carrying a ``Reason`` code. See the README for the guarantees.
"""

from kagent_memory_governed.activation import Runtime, install
from kagent_memory_governed.errors import ConfigurationError, GovernedMemoryError, PolicyError, Reason
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import AgentId, ControlRoom, Origin, Principal, ScopeKey
from kagent_memory_governed.store import Store

__all__ = [
    "AgentId",
    "ConfigurationError",
    "ControlRoom",
    "GovernedMemoryError",
    "Origin",
    "Policy",
    "PolicyError",
    "Principal",
    "Reason",
    "Runtime",
    "ScopeKey",
    "Store",
    "install",
]
