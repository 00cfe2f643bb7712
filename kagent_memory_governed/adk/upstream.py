"""The kagent-adk versions this package supports, and every difference between them that it depends on.

Nothing else in the package compares versions: a difference found between two supported releases is
recorded here as a fact of ``UpstreamRelease``, and the adapters read the fact of the installed release.

Differences between 0.9.11 and 0.10.4 and where they are handled:

- ``SaveMemoryTool`` calls ``add_memory(content=..., metadata=...)`` on 0.9.11 and
  ``add_memory(memories=[MemoryEntry(...)])`` on 0.10.4 (ADK's form): ``GovernedMemoryService.add_memory``
  accepts both, and the governed ``save_memory`` never calls upstream's ``run_async``.
- ``KagentMemoryService.add_memory`` caught and logged errors on 0.9.11; on 0.10.4 it raises, and upstream's
  ``SaveMemoryTool`` answers ``f"Error saving memory: {e}"`` to the model. The governed tool answers
  reason codes only, on both (``tests/runtime/test_upstream_versions.py``).
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

``PORT_NAMES`` lists every upstream name the package patches, subclasses, overrides, imports or calls at run time
(``tests/runtime/test_upstream_port.py`` holds it complete against the package's source and present in the installed
release); ``./upstream-diff port`` reports, per name, whether kagent-adk 1.0.0a17 still has it with the same
signature. kagent-adk 1.0 is not supported (``pyproject.toml`` admits ``<0.11``): it cannot be installed here, so
no lock and no CI run cover it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
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


class Use(StrEnum):
    """How the package depends on an upstream name."""

    PATCHED = "patched"  # runtime-patching mode rebinds it (RUNTIME_PATCH_TARGETS, and two methods)
    SUBCLASSED = "subclassed"  # a governed class derives from it
    OVERRIDDEN = "overridden"  # a governed subclass overrides this method
    IMPORTED = "imported"  # imported at run time
    CALLED = "called"  # a method the package calls or a function it runs
    SERIES = "series"  # exists with the PR series only: what entry-point mode uses


@dataclass(frozen=True)
class UpstreamName:
    """One upstream name the package depends on: ``module[.Class[.member]]``, how, and where."""

    name: str
    use: Use
    where: str
    successor: str = ""  # what 1.0 has in its place, where the port report cannot find the name itself


def _names(use: Use, where: str, *names: str) -> tuple[UpstreamName, ...]:
    return tuple(UpstreamName(name, use, where) for name in names)


PORT_NAMES: tuple[UpstreamName, ...] = (  # each name once, under the strongest use
    *_names(
        Use.PATCHED,
        "adk/integration.py",
        "kagent.adk._a2a.KagentMemoryService",
        "kagent.adk._a2a.Runner",
        "kagent.adk._a2a.KAgentRequestContextBuilder",
        "kagent.adk._a2a.KAgentApp",
        "kagent.adk._a2a.KAgentApp.build",
    ),
    UpstreamName(
        "kagent.adk.types.AgentConfig._configure_memory",
        Use.PATCHED,
        "adk/integration.py",
        successor="kagent.adk.types._configure_memory",
    ),
    *_names(
        Use.PATCHED,
        "adk/integration.py rebinds it, adk/tools.py subclasses it",
        "kagent.adk.tools.memory_tools.SaveMemoryTool",
        "kagent.adk.tools.memory_tools.LoadMemoryTool",
        "kagent.adk.tools.prefetch_memory_tool.PrefetchMemoryTool",
    ),
    *_names(Use.SUBCLASSED, "adk/request.py", "kagent.core.a2a.KAgentRequestContextBuilder"),
    *_names(Use.SUBCLASSED, "adk/service.py", "google.adk.memory.BaseMemoryService"),
    *_names(Use.SUBCLASSED, "adk/boundary.py, adk/integration.py", "google.adk.plugins.BasePlugin"),
    *_names(Use.SUBCLASSED, "adk/integration.py, adk/runtime.py", "google.adk.runners.Runner"),
    *_names(Use.SUBCLASSED, "adk/service.py, testing/model.py, testing/agent.py", "google.adk.models.base_llm.BaseLlm"),
    *_names(
        Use.OVERRIDDEN,
        "adk/tools.py",
        "kagent.adk.tools.memory_tools.LoadMemoryTool.run_async",
        "kagent.adk.tools.memory_tools.SaveMemoryTool.run_async",
        "kagent.adk.tools.prefetch_memory_tool.PrefetchMemoryTool.process_llm_request",
    ),
    *_names(Use.OVERRIDDEN, "adk/request.py", "kagent.core.a2a.KAgentRequestContextBuilder.build"),
    *_names(
        Use.OVERRIDDEN,
        "adk/service.py",
        "google.adk.memory.BaseMemoryService.add_memory",
        "google.adk.memory.BaseMemoryService.add_session_to_memory",
        "google.adk.memory.BaseMemoryService.search_memory",
    ),
    *_names(
        Use.OVERRIDDEN,
        "adk/boundary.py, adk/integration.py",
        "google.adk.plugins.BasePlugin.__init__",
        "google.adk.plugins.BasePlugin.after_run_callback",
        "google.adk.plugins.BasePlugin.before_model_callback",
        "google.adk.plugins.BasePlugin.before_run_callback",
        "google.adk.plugins.BasePlugin.on_event_callback",
        "google.adk.plugins.BasePlugin.on_model_error_callback",
        "google.adk.plugins.BasePlugin.on_tool_error_callback",
    ),
    *_names(
        Use.OVERRIDDEN,
        "adk/integration.py",
        "google.adk.runners.Runner.__init__",
        "google.adk.runners.Runner.run_async",
    ),
    *_names(Use.OVERRIDDEN, "testing/model.py", "google.adk.models.base_llm.BaseLlm.generate_content_async"),
    *_names(Use.IMPORTED, "adk/integration.py", "kagent.adk._a2a", "kagent.adk._memory_service.KagentMemoryService"),
    *_names(
        Use.IMPORTED, "adk/integration.py", "kagent.adk.tools.memory_tools", "kagent.adk.tools.prefetch_memory_tool"
    ),
    *_names(Use.IMPORTED, "adk/integration.py", "kagent.adk.types.AgentConfig", "google.adk.tools.base_tool.BaseTool"),
    *_names(Use.IMPORTED, "adk/conversation.py", "kagent.adk.tools.prefetch_memory_tool._split_sentences"),
    *_names(Use.IMPORTED, "adk/service.py", "kagent.adk.models.KAgentEmbedding"),
    *_names(Use.IMPORTED, "adk/service.py", "kagent.adk.types.EmbeddingConfig", "kagent.adk.types.MemoryConfig"),
    *_names(
        Use.IMPORTED,
        "adk/service.py",
        "google.adk.memory.base_memory_service.SearchMemoryResponse",
        "google.adk.memory.memory_entry.MemoryEntry",
        "google.adk.sessions.Session",
    ),
    *_names(Use.IMPORTED, "adk/tools.py", "google.adk.agents.LlmAgent"),
    *_names(Use.IMPORTED, "adk/integration.py, adk/tools.py", "google.adk.tools.tool_context.ToolContext"),
    *_names(
        Use.IMPORTED,
        "adk/tools.py",
        "google.adk.agents.llm_agent.InstructionProvider",
        "google.adk.agents.readonly_context.ReadonlyContext",
    ),
    *_names(Use.IMPORTED, "testing/agent.py", "google.adk.agents.BaseAgent"),
    *_names(Use.IMPORTED, "adk/boundary.py, adk/tools.py", "google.adk.agents.callback_context.CallbackContext"),
    *_names(Use.IMPORTED, "adk/boundary.py", "google.adk.agents.invocation_context.InvocationContext"),
    *_names(Use.IMPORTED, "adk/boundary.py, adk/conversation.py", "google.adk.events.Event"),
    *_names(Use.IMPORTED, "adk/boundary.py, adk/tools.py, testing", "google.adk.models.llm_request.LlmRequest"),
    *_names(Use.IMPORTED, "adk/boundary.py, testing/model.py", "google.adk.models.llm_response.LlmResponse"),
    *_names(Use.IMPORTED, "adk/boundary.py, adk/service.py, testing/model.py", "google.genai.types"),
    *_names(Use.IMPORTED, "cli.py", "kagent.adk.cli.run_cli"),
    *_names(Use.IMPORTED, "testing/agent.py", "kagent.adk.AgentConfig", "kagent.adk.KAgentApp", "a2a.types.AgentCard"),
    *_names(Use.CALLED, "adk/service.py", "kagent.adk.models.KAgentEmbedding.generate"),
    UpstreamName(
        "kagent.adk.types.AgentConfig.to_agent",
        Use.CALLED,
        "testing/agent.py",
        successor="kagent.adk.types.create_agent",
    ),
    *_names(
        Use.SERIES,
        "adk/runtime.py",
        "kagent.adk.extensions.load_extension",
        "kagent.adk.extensions.RuntimeExtension.create_memory_service",
        "kagent.adk.extensions.RuntimeExtension.configure_memory",
        "kagent.adk.extensions.RuntimeExtension.request_context_builder",
        "kagent.adk.extensions.RuntimeExtension.plugins",
        "kagent.adk.extensions.RuntimeExtension.configure_app",
    ),
)


def installed() -> UpstreamRelease:
    """The supported release installed in this process; refuses any other kagent-adk."""
    found = version("kagent-adk")
    for release in SUPPORTED:
        if release.version == found:
            return release
    raise ConfigurationError(f"unsupported kagent-adk {found}")
