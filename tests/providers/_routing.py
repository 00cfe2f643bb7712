"""Which protocol a request is for: every protocol the provider speaks, by name, and the route that picks one
(or an auxiliary endpoint: OAuth tokens, SAP AI Core's deployments, OpenAI's embeddings)."""

from __future__ import annotations

from urllib.parse import urlsplit

from ._anthropic import Anthropic, AnthropicVertex
from ._bedrock import BedrockConverse
from ._google import Gemini
from ._ollama import Ollama
from ._openai import OpenAIChat, OpenAIResponses
from ._sap import SAPOrchestration
from ._wire import WireProtocol

PROTOCOLS: dict[str, WireProtocol] = {
    p.name: p
    for p in (
        OpenAIChat("openai"),
        OpenAIChat("azure_openai"),
        OpenAIResponses(),
        Anthropic(),
        AnthropicVertex(),
        Ollama(),
        Gemini("gemini"),
        Gemini("gemini_vertex"),
        BedrockConverse(),
        SAPOrchestration(),
    )
}


def route_of(method: str, path: str) -> str | None:
    """The protocol (or the auxiliary endpoint) a request is for."""
    route = urlsplit(path).path
    if method == "GET":
        return "deployments" if route.endswith("/v2/lm/deployments") else None
    if route.endswith("/oauth/token") or route == "/token":
        return "token"
    if route.startswith("/openai/deployments/") and route.endswith("/chat/completions"):
        return "azure_openai"
    if route.endswith("/chat/completions"):
        return "openai"
    if route.endswith("/embeddings"):
        return "embeddings"
    if route.endswith("/responses"):
        return "openai_responses"
    if route.endswith("/v1/messages"):
        return "anthropic"
    if "/publishers/anthropic/models/" in route and route.endswith(("rawPredict", "streamRawPredict")):
        return "anthropic_vertex"
    if route == "/api/chat":
        return "ollama"
    if route.endswith((":generateContent", ":streamGenerateContent")):
        return "gemini_vertex" if "/publishers/google/" in route else "gemini"
    if route.startswith("/model/") and route.endswith(("/converse", "/converse-stream")):
        return "bedrock"
    if route.endswith("/v2/completion"):
        return "sap_ai_core"
    return None
