"""A loopback model provider: a real HTTP server speaking every wire protocol kagent-adk's model adapters
speak, recording each request's raw bytes and answering by a script.

A memory-path test builds a real kagent app from an ``AgentConfig`` whose ``model`` is ``adapter.model(provider)``
with ``adapter.apply(provider, monkeypatch)`` in force, so that kagent's own ``_create_llm_from_model_config``
builds the real adapter and its real client, and asserts on what the provider received::

    with Provider(script) as provider:
        adapter = ADAPTERS["openai"]
        adapter.apply(provider, monkeypatch)
        config = AgentConfig(model=adapter.model(provider), description="", instruction="Be brief.")
        ...  # run the agent
        assert provider.received("the user's fact", kind="chat")

Each request is parsed by its protocol into a neutral :class:`View` (system text, last user text, the tool
result the adapter rendered, whether it is the auto-save summarizer's request); the script turns the view into
a :class:`Reply` (text, tool calls) or a :class:`Failure` (an HTTP status with the provider's JSON error body),
which the provider frames as that service does, sent whole or streamed.

One module a provider family (``_openai``, ``_anthropic``, ``_google``, ``_ollama``, ``_bedrock``, ``_sap``),
on what they share (``_script``: the view and the answers; ``_wire``: framing); ``_routing`` picks the protocol,
``_http`` and ``_provider`` serve and record, ``_adapters`` configures kagent to reach the provider.
"""

from __future__ import annotations

from ._adapters import ADAPTERS, RELEASE, Adapter, available
from ._provider import Provider, Request, provider_fixture
from ._script import Failure, Reply, Script, ToolCall, View, default_script

__all__ = [
    "ADAPTERS",
    "RELEASE",
    "Adapter",
    "Failure",
    "Provider",
    "Reply",
    "Request",
    "Script",
    "ToolCall",
    "View",
    "available",
    "default_script",
    "provider_fixture",
]
