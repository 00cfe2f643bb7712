"""Test doubles for agents with governed memory, and the demo built from them (the ``testing`` extra).

A scripted model, a deterministic offline embedder, a stand-in for the Matrix bridge that signs scope
headers and control tokens, and upstream's real ``KAgentApp`` with an A2A client that speaks to it as the
bridge does. The package's own tests and ``kagent-memory-governed demo`` use them; nothing in the runtime
does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kagent_memory_governed import lazy

if TYPE_CHECKING:
    from kagent_memory_governed.testing.agent import CARD, CONFIG, A2AClient, build_app, new_context, reply_text
    from kagent_memory_governed.testing.bridge import AGENT, HOMESERVER, ISSUER, Bridge, b64, compact
    from kagent_memory_governed.testing.embedder import (
        CountingEmbedder,
        EmbeddingServer,
        embed,
        local_embedder,
        openai_compatible_url,
    )
    from kagent_memory_governed.testing.model import ScriptedModel, system_instruction

# Imported on first use: the package's pytest plugin (``testing.plugin``, loaded by every pytest session where this
# package is installed) imports this package first, and a session that never asks for an agent must not pay for
# kagent-adk's import (seconds, in the session's first process and in each worker). ``agent`` and ``model`` need it.
__getattr__ = lazy.names(
    __name__,
    {
        "agent": "CARD CONFIG A2AClient build_app new_context reply_text",
        "bridge": "AGENT HOMESERVER ISSUER Bridge b64 compact",
        "embedder": "CountingEmbedder EmbeddingServer embed local_embedder openai_compatible_url",
        "model": "ScriptedModel system_instruction",
    },
    globals(),
)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AGENT",
    "CARD",
    "CONFIG",
    "HOMESERVER",
    "ISSUER",
    "A2AClient",
    "Bridge",
    "CountingEmbedder",
    "EmbeddingServer",
    "ScriptedModel",
    "b64",
    "build_app",
    "compact",
    "embed",
    "local_embedder",
    "new_context",
    "openai_compatible_url",
    "reply_text",
    "system_instruction",
]
