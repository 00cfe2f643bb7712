"""Upstream's real ``KAgentApp`` with an agent from kagent's own ``AgentConfig``, and an A2A client that
speaks to it over ASGI as the Matrix bridge does (``X-User-Id``, ``X-Memory-Scope``)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
from a2a.types import AgentCard
from google.adk.agents import BaseAgent
from google.adk.models.base_llm import BaseLlm
from kagent.adk import AgentConfig, KAgentApp

CONFIG = {
    "model": {"type": "openai", "model": "gpt-4o-mini"},
    "description": "a helpful test agent",
    "instruction": "You are helpful.",
    "memory": {"ttl_days": 7, "embedding": {"provider": "openai", "model": "text-embedding-3-small"}},
}
CARD = {
    "name": "helper",
    "description": "a helpful test agent",
    "url": "http://localhost:8080/",
    "version": "0.1",
    "capabilities": {"streaming": False},
    "skills": [],
    "defaultInputModes": ["text"],
    "defaultOutputModes": ["text"],
}


def build_app(
    model: BaseLlm | None, *, config: dict[str, Any] | None = None, local: bool = True, streaming: bool = False
) -> Any:
    """Upstream's app for an agent of ``config`` (default ``CONFIG``), as ``kagent-adk static`` builds it.
    ``model`` replaces the model kagent builds from the config (``None``: kagent's own adapter for the
    config's ``model``, which then calls its provider); ``streaming`` allows ``message/stream``, and the
    config's ``stream`` asks the provider to stream, as in a Declarative agent."""
    agent_config = AgentConfig.model_validate(config or CONFIG)
    card = AgentCard.model_validate({**CARD, "capabilities": {"streaming": streaming}})

    def factory() -> BaseAgent:
        agent = agent_config.to_agent("helper")
        if model is not None:
            agent.model = model
        return agent

    app = KAgentApp(
        factory,
        card,
        "http://controller.invalid",
        "kagent__NS__helper",
        stream=bool(agent_config.stream),
        agent_config=agent_config,
    )
    return app.build(local=local)


class A2AClient:
    """Speaks A2A JSON-RPC ``message/send`` with the bridge's headers."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def send(self, text: str, *, context_id: str, user: str | None, scope: str | None) -> dict[str, Any]:
        answer = await self.http.post("/", **self._request("message/send", text, context_id, user, scope))
        assert answer.status_code == 200
        found: dict[str, Any] = answer.json()
        return found

    async def send_as(self, headers: dict[str, str], text: str, *, context_id: str | None = None) -> dict[str, Any]:
        """``message/send`` with the bridge's headers (a control client's ``headers()``), in a new session
        unless ``context_id`` names one; without ``X-Memory-Scope`` the request is memory-free."""
        context = context_id or uuid.uuid4().hex
        return await self.send(text, context_id=context, user=headers["X-User-Id"], scope=headers.get("X-Memory-Scope"))

    async def stream(self, text: str, *, context_id: str, user: str | None, scope: str | None) -> str:
        """``message/stream``: the whole server-sent event stream, as text."""
        answer = await self.http.post("/", **self._request("message/stream", text, context_id, user, scope))
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        return answer.text

    @staticmethod
    def _request(method: str, text: str, context_id: str, user: str | None, scope: str | None) -> dict[str, Any]:
        headers = {}
        if user is not None:
            headers["X-User-Id"] = user
        if scope is not None:
            headers["X-Memory-Scope"] = scope
        body = {
            "jsonrpc": "2.0",
            "id": str(uuid.uuid4()),
            "method": method,
            "params": {
                "message": {
                    "kind": "message",
                    "role": "user",
                    "messageId": str(uuid.uuid4()),
                    "contextId": context_id,
                    "parts": [{"kind": "text", "text": text}],
                }
            },
        }
        return {"json": body, "headers": headers}


def reply_text(answer: dict[str, Any]) -> str:
    """All text the agent sent back in a ``message/send`` answer."""
    return json.dumps(answer.get("result", {}))


def new_context() -> str:
    return str(uuid.uuid4())
