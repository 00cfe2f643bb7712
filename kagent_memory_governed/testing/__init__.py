"""Test doubles for agents with governed memory, and the demo built from them (the ``testing`` extra).

A scripted model, a deterministic offline embedder, a stand-in for the Matrix bridge that signs scope
headers and control tokens, and upstream's real ``KAgentApp`` with an A2A client that speaks to it as the
bridge does. The package's own tests and ``kagent-memory-governed demo`` use them; nothing in the runtime
does.
"""

from __future__ import annotations

from kagent_memory_governed.testing.agent import CARD, CONFIG, A2AClient, build_app, new_context, reply_text
from kagent_memory_governed.testing.bridge import AGENT, HOMESERVER, ISSUER, Bridge, b64, compact
from kagent_memory_governed.testing.embedder import CountingEmbedder, embed, local_embedder
from kagent_memory_governed.testing.model import ScriptedModel, system_instruction

__all__ = [
    "AGENT",
    "CARD",
    "CONFIG",
    "HOMESERVER",
    "ISSUER",
    "A2AClient",
    "Bridge",
    "CountingEmbedder",
    "ScriptedModel",
    "b64",
    "build_app",
    "compact",
    "embed",
    "local_embedder",
    "new_context",
    "reply_text",
    "system_instruction",
]
