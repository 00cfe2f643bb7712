"""A scripted model: google-adk's ``BaseLlm`` answering by rules instead of a provider, recording every
request it gets, so a test can assert on exactly what memory put in front of the model."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable
from typing import Any

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types
from pydantic import PrivateAttr

from kagent_memory_governed.adk.conversation import SUMMARY_MARKER


class ScriptedModel(BaseLlm):
    """Answers by rules instead of a provider. ``on_user(text)`` returns tool calls to make for a user
    message (a list of (tool name, args)); ``reply(request)`` the text of an answer without tool calls
    (default ``ok``); summaries answer ``summary``; every request is recorded."""

    model: str = "scripted"
    _requests: list[LlmRequest] = PrivateAttr(default_factory=list)
    _on_user: Callable[[str], list[tuple[str, dict[str, Any]]]] | None = PrivateAttr(default=None)
    _summary: str | Callable[[str], list[str]] = PrivateAttr(default="[]")
    _tool_reply: str | None = PrivateAttr(default=None)
    _reply: Callable[[LlmRequest], str] | None = PrivateAttr(default=None)
    _summary_gate: asyncio.Event | None = PrivateAttr(default=None)
    _fail_summary: bool = PrivateAttr(default=False)
    _fail_chat: str | None = PrivateAttr(default=None)
    _summarizing: asyncio.Event = PrivateAttr(default_factory=asyncio.Event)

    def script(
        self,
        on_user: Callable[[str], list[tuple[str, dict[str, Any]]]] | None = None,
        summary: str | Callable[[str], list[str]] | None = None,
        gate: asyncio.Event | None = None,
        fail_summary: bool = False,
        fail_chat: str | None = None,
        tool_reply: str | None = None,
        reply: Callable[[LlmRequest], str] | None = None,
    ) -> ScriptedModel:
        """``summary`` is the summarizer's answer, or a function from the conversation to facts;
        ``tool_reply`` is the answer after a tool result (default: the results, echoed)."""
        if on_user is not None:
            self._on_user = on_user
        if summary is not None:
            self._summary = summary
        self._tool_reply = tool_reply
        if reply is not None:
            self._reply = reply
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
            yield _answer(types.Part(text=summary))
            return
        if self._fail_chat is not None:
            raise RuntimeError(f"provider returned 500, body: {self._fail_chat}")
        last = llm_request.contents[-1]
        if any(part.function_response for part in last.parts or []) and self._tool_reply is not None:
            yield _answer(types.Part(text=self._tool_reply))
            return
        if any(part.function_response for part in last.parts or []):
            responses = [part.function_response for part in last.parts or [] if part.function_response]
            results = [json.dumps(response.response) for response in responses]
            yield _answer(types.Part(text="done: " + " | ".join(results)))
            return
        calls = self._on_user(text) if self._on_user else []
        if calls:
            yield _answer(*[types.Part(function_call=types.FunctionCall(name=n, args=a)) for n, a in calls])
        else:
            yield _answer(types.Part(text=self._reply(llm_request) if self._reply else "ok"))


def _answer(*parts: types.Part) -> LlmResponse:
    return LlmResponse(content=types.Content(role="model", parts=list(parts)))


def _last_text(request: LlmRequest) -> str:
    last = request.contents[-1] if request.contents else None
    return "".join(part.text or "" for part in (last.parts or [])) if last else ""


def system_instruction(request: LlmRequest) -> str:
    return str(request.config.system_instruction) if request.config else ""
