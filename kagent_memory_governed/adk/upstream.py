"""The kagent-adk versions this package supports, and every difference between them that it depends on.

Nothing else in the package compares versions: a difference found between two supported releases is
recorded here as a fact of ``UpstreamRelease``, and the adapters read the fact of the installed release.

Differences between 0.9.11 and 0.10.4 and where they are handled:

- ``SaveMemoryTool`` calls ``add_memory(content=..., metadata=...)`` on 0.9.11 and
  ``add_memory(memories=[MemoryEntry(...)])`` on 0.10.4 (ADK's form): ``GovernedMemoryService.add_memory``
  accepts both, and the governed ``save_memory`` never calls upstream's ``run_async``.
- ``KagentMemoryService.add_memory`` caught and logged errors on 0.9.11; on 0.10.4 it raises, and upstream's
  ``SaveMemoryTool`` answers ``f"Error saving memory: {e}"`` to the model. The governed tool answers
  reason codes only, on both (``tests/test_upstream_versions.py``).
- ``KAgentApp.build`` on 0.10.4 may build a ``DatabaseSessionService`` (``session_db_url``) and adds
  share-link tools; the names runtime patching replaces (``RUNTIME_PATCH_TARGETS``) exist and mean the
  same on both.
- kagent-core 0.10.4's ``KAgentRequestContextBuilder.build`` keeps its signature and still takes the user from
  the ``x-user-id`` header in ``context.state["headers"]`` (through ``get_call_context_user_id``); the governed
  builder (``request.context_builder``) binds the scope and drops ``X-Memory-Scope`` before it, on both.
- 0.10.4's OpenAI adapter has a Responses API path whose failures echo the provider's text: upstream patch 0005
  covers it in ``patches/v0.10.4/`` only; at run time ``boundary.RecallBoundary`` replaces any model
  ``error_message`` of a scoped request with a reason code, on both.
- google-adk 1.39 (the 0.10.4 lock) emits its own OTel metric ``gen_ai.tool.execution.duration`` beside
  this package's ``governed_memory.operations``.
- Both releases run on a2a-sdk 0.3 (0.23 and 0.26); 0.10.4 does not bound it, so its lock keeps it below 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import version

from kagent_memory_governed.errors import ConfigurationError


@dataclass(frozen=True)
class UpstreamRelease:
    """What this package relies on in one kagent-adk release."""

    version: str
    google_adk: str  # the google-adk of the release's lock
    a2a_sdk: str  # the a2a-sdk of the release's lock (kagent 0.10.x still needs 0.3)
    save_tool_call: str  # how upstream's SaveMemoryTool calls add_memory: "content" or "memories"
    add_memory_raises: bool  # whether upstream's KagentMemoryService.add_memory lets errors reach the tool
    image: str  # upstream's Python runtime image the deploy example builds on


SUPPORTED: tuple[UpstreamRelease, ...] = (
    UpstreamRelease("0.9.11", "1.31.1", "0.3.23", "content", False, "ghcr.io/kagent-dev/kagent/app:0.9.11"),
    UpstreamRelease("0.10.4", "1.39.1", "0.3.26", "memories", True, "ghcr.io/kagent-dev/kagent/app:0.10.4"),
)

# What runtime-patching mode replaces, by module and name; present with the same meaning in every release.
RUNTIME_PATCH_TARGETS: tuple[tuple[str, str], ...] = (
    ("kagent.adk._a2a", "KagentMemoryService"),
    ("kagent.adk._a2a", "Runner"),
    ("kagent.adk._a2a", "KAgentRequestContextBuilder"),
    ("kagent.adk._a2a", "KAgentApp"),
    ("kagent.adk.types", "AgentConfig"),
    ("kagent.adk.tools.memory_tools", "SaveMemoryTool"),
    ("kagent.adk.tools.memory_tools", "LoadMemoryTool"),
    ("kagent.adk.tools.prefetch_memory_tool", "PrefetchMemoryTool"),
)


def installed() -> UpstreamRelease:
    """The supported release installed in this process; refuses any other kagent-adk."""
    found = version("kagent-adk")
    for release in SUPPORTED:
        if release.version == found:
            return release
    raise ConfigurationError(f"unsupported kagent-adk {found}")
