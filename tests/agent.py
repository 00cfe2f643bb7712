"""Test doubles for the runtime tests: a scripted model, a counting deterministic embedder, and an
A2A client speaking to upstream's real ``KAgentApp`` over ASGI as the bridge would."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

import httpx
from a2a.types import AgentCard
from google.adk.models import BaseLlm, LlmRequest, LlmResponse
from google.genai import types
from kagent.adk import AgentConfig, KAgentApp
from pydantic import PrivateAttr

from kagent_memory_governed.adk.conversation import SUMMARY_MARKER
from kagent_memory_governed.local_embedding import embed

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


class ScriptedModel(BaseLlm):
    """Answers by rules instead of a provider. ``on_user(text)`` returns tool calls to make for a user
    message (a list of (tool name, args)); summaries answer ``summary``; every request is recorded."""

    model: str = "scripted"
    _requests: list[LlmRequest] = PrivateAttr(default_factory=list)
    _on_user: Callable[[str], list[tuple[str, dict]]] | None = PrivateAttr(default=None)
    _summary: str | Callable[[str], list[str]] = PrivateAttr(default="[]")
    _tool_reply: str | None = PrivateAttr(default=None)
    _summary_gate: asyncio.Event | None = PrivateAttr(default=None)
    _fail_summary: bool = PrivateAttr(default=False)
    _fail_chat: str | None = PrivateAttr(default=None)
    _summarizing: asyncio.Event = PrivateAttr(default_factory=asyncio.Event)

    def script(
        self,
        on_user=None,
        summary: str | Callable[[str], list[str]] | None = None,
        gate=None,
        fail_summary: bool = False,
        fail_chat=None,
        tool_reply: str | None = None,
    ):
        """``summary`` is the summarizer's answer, or a function from the conversation to facts;
        ``tool_reply`` is the answer after a tool result (default: the results, echoed)."""
        if on_user is not None:
            self._on_user = on_user
        if summary is not None:
            self._summary = summary
        self._tool_reply = tool_reply
        self._summary_gate, self._fail_summary, self._fail_chat = gate, fail_summary, fail_chat
        return self

    @property
    def summarizing(self) -> asyncio.Event:
        """Set when the first summary request arrives."""
        return self._summarizing

    @property
    def requests(self) -> list[LlmRequest]:
        return self._requests

    @property
    def summaries(self) -> list[LlmRequest]:
        return [r for r in self._requests if SUMMARY_MARKER in _last_text(r)]

    @property
    def chats(self) -> list[LlmRequest]:
        return [r for r in self._requests if SUMMARY_MARKER not in _last_text(r)]

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self._requests.append(llm_request)
        text = _last_text(llm_request)
        if SUMMARY_MARKER in text:
            self._summarizing.set()
            if self._summary_gate is not None:
                await self._summary_gate.wait()
            summary = self._summary(text) if callable(self._summary) else self._summary
            summary = summary if isinstance(summary, str) else json.dumps(summary)
            if self._fail_summary:
                raise RuntimeError(f"provider error, body: {summary}")
            yield _reply(types.Part(text=summary))
            return
        if self._fail_chat is not None:
            raise RuntimeError(f"provider returned 500, body: {self._fail_chat}")
        last = llm_request.contents[-1]
        if any(part.function_response for part in last.parts or []) and self._tool_reply is not None:
            yield _reply(types.Part(text=self._tool_reply))
            return
        if any(part.function_response for part in last.parts or []):
            results = [json.dumps(part.function_response.response) for part in last.parts if part.function_response]
            yield _reply(types.Part(text="done: " + " | ".join(results)))
            return
        calls = self._on_user(text) if self._on_user else []
        if calls:
            yield _reply(*[types.Part(function_call=types.FunctionCall(name=n, args=a)) for n, a in calls])
        else:
            yield _reply(types.Part(text="ok"))


def _reply(*parts: types.Part) -> LlmResponse:
    return LlmResponse(content=types.Content(role="model", parts=list(parts)))


def _last_text(request: LlmRequest) -> str:
    last = request.contents[-1] if request.contents else None
    return "".join(part.text or "" for part in (last.parts or [])) if last else ""


def system_instruction(request: LlmRequest) -> str:
    return str(request.config.system_instruction) if request.config else ""


class CountingEmbedder:
    """The deterministic local embedder, counting calls and items."""

    def __init__(self) -> None:
        self.calls = 0
        self.items = 0
        self.fail_with: str | None = None
        self.gate: asyncio.Event | None = None
        self.embedding = asyncio.Event()  # set on every call
        self.batches: list[list[str]] = []

    async def __call__(self, texts: list[str]) -> list[list[float]]:
        self.calls += 1
        self.items += len(texts)
        self.batches.append(list(texts))
        self.embedding.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_with is not None:
            raise RuntimeError(self.fail_with)
        return [embed(text) for text in texts]


def build_app(model: BaseLlm, *, config: dict | None = None, local: bool = True, streaming: bool = False) -> Any:
    agent_config = AgentConfig.model_validate(config or CONFIG)
    card = AgentCard.model_validate({**CARD, "capabilities": {"streaming": streaming}})

    def factory():
        agent = agent_config.to_agent("helper")
        agent.model = model
        return agent

    app = KAgentApp(factory, card, "http://controller.invalid", "kagent__NS__helper", agent_config=agent_config)
    return app.build(local=local)


class A2AClient:
    """Speaks A2A JSON-RPC ``message/send`` with the bridge's headers."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def send(self, text: str, *, context_id: str, user: str | None, scope: str | None) -> dict:
        answer = await self.http.post("/", **self._request("message/send", text, context_id, user, scope))
        assert answer.status_code == 200
        return answer.json()

    async def stream(self, text: str, *, context_id: str, user: str | None, scope: str | None) -> str:
        """``message/stream``: the whole server-sent event stream, as text."""
        answer = await self.http.post("/", **self._request("message/stream", text, context_id, user, scope))
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        return answer.text

    @staticmethod
    def _request(method: str, text: str, context_id: str, user: str | None, scope: str | None) -> dict:
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


def reply_text(answer: dict) -> str:
    """All text the agent sent back in a ``message/send`` answer."""
    return json.dumps(answer.get("result", {}))


def new_context() -> str:
    return str(uuid.uuid4())
