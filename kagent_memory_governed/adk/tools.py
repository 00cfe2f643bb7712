"""Governed ``save_memory``, ``load_memory``, first-message prefetch and auto-save callback.

The tools subclass upstream's, so names, descriptions and model-facing declarations stay exactly as
agents' prompts know them. Only behaviour changes: the scope is the request's verified scope, never
anything the model says (R34); without one every tool answers a reason code and prefetch does nothing.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.agents.callback_context import CallbackContext
from google.adk.agents.llm_agent import InstructionProvider
from google.adk.agents.readonly_context import ReadonlyContext
from google.adk.memory.base_memory_service import SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.models.llm_request import LlmRequest
from google.adk.tools.tool_context import ToolContext
from kagent.adk.tools.memory_tools import LoadMemoryTool, SaveMemoryTool
from kagent.adk.tools.prefetch_memory_tool import PrefetchMemoryTool

from kagent_memory_governed.adk import boundary, conversation
from kagent_memory_governed.adk.request import current
from kagent_memory_governed.adk.service import GovernedMemoryService
from kagent_memory_governed.errors import GovernedMemoryError, Operation, Reason

MEMORY_INSTRUCTION = (
    "\n\nYou may have long-term memory of this user: save_memory stores an important fact or preference, "
    "load_memory searches what was stored. Memory works only where the user has consented; when a memory "
    "tool answers with a refusal, continue without memory and do not retry."
)
PREFETCH_PREAMBLE = (
    "The following facts were remembered from earlier conversations with this user, with their consent. "
    "They may help with the current request.\n<REMEMBERED_FACTS>\n{facts}\n</REMEMBERED_FACTS>\n"
)


def refusal(reason: Reason) -> str:
    """What a memory tool tells the model when memory is refused: the reason code and nothing else."""
    return f"Memory unavailable: {reason.value}"


def _service(tool_context: ToolContext | CallbackContext) -> GovernedMemoryService | None:
    service = tool_context._invocation_context.memory_service
    return service if isinstance(service, GovernedMemoryService) else None


def _user_turns(tool_context: ToolContext | CallbackContext) -> int:
    return sum(1 for event in tool_context._invocation_context.session.events if event.author == "user")


class GovernedSaveMemoryTool(SaveMemoryTool):
    """``save_memory``: stores ``content`` in the request's consented scope, or answers a reason code."""

    async def run_async(self, *, args: dict[str, Any], tool_context: ToolContext) -> str:
        service, scope = _service(tool_context), current()
        if service is None or scope is None:
            return refusal(Reason.NO_ASSERTION)
        try:
            await service.save(scope, [args.get("content")], Operation.SAVE)
        except GovernedMemoryError as refused:
            return refusal(refused.reason)
        return "Saved to long-term memory."


class GovernedLoadMemoryTool(LoadMemoryTool):
    """``load_memory``: searches the request's consented scope, or answers a reason code."""

    async def run_async(  # type: ignore[override]  # google-adk takes a dict answer as it is: the placeholder
        self, *, args: dict[str, Any], tool_context: ToolContext
    ) -> str | dict[str, Any]:
        """Upstream's answer, a JSON text ``{"memories": [...]}`` of ``SearchMemoryResponse``, for this
        invocation's model requests; the kept event holds a placeholder (``boundary.keep``). No hits answer
        ``{"memories": []}`` (upstream: ``{}``), which needs no keeping."""
        service, scope = _service(tool_context), current()
        if service is None or scope is None:
            return refusal(Reason.NO_ASSERTION)
        query = args.get("query")
        if not isinstance(query, str) or not query.strip():
            return refusal(Reason.BAD_INPUT)
        query = conversation.clip_utf8(query, service.policy.prefetch_max_query_bytes)
        try:
            entries = await service.search(scope, [query], Operation.LOAD)
        except GovernedMemoryError as refused:
            return refusal(refused.reason)
        if not entries:
            return json.dumps({"memories": []})
        found = SearchMemoryResponse(memories=entries).model_dump(mode="json", exclude_none=True)
        for memory in found["memories"]:
            memory.pop("custom_metadata", None)  # always empty here; upstream leaves empty values out
        return boundary.keep(json.dumps(found), len(entries))


class GovernedPrefetchMemoryTool(PrefetchMemoryTool):
    """On the first user message of a session only: search the consented scope with at most
    ``prefetch_max_subqueries`` bounded subqueries and add what is found to the system instruction."""

    async def process_llm_request(self, *, tool_context: ToolContext, llm_request: LlmRequest) -> None:
        service, scope = _service(tool_context), current()
        content = tool_context.user_content
        if service is None or scope is None or not content or not content.parts or _user_turns(tool_context) != 1:
            return
        if tool_context.state.get("temp:governed_memory_prefetched"):
            return  # once per invocation: the flow calls this before every model call
        tool_context.state["temp:governed_memory_prefetched"] = True
        queries = conversation.subqueries(" ".join(p.text for p in content.parts if p.text), service.policy)
        if not queries:
            return
        try:
            entries = await service.search(scope, queries, Operation.PREFETCH)
        except GovernedMemoryError:
            return
        if entries:
            boundary.note_hit()
            facts = "\n".join(f"- {_text(entry)}" for entry in entries)
            llm_request.append_instructions([PREFETCH_PREAMBLE.format(facts=facts)])  # this request only


def _text(entry: MemoryEntry) -> str:
    return "".join(part.text or "" for part in entry.content.parts or [])


def autosave_callback(agent: LlmAgent) -> Callable[[CallbackContext], Awaitable[None]]:
    """An ``after_agent_callback`` that records each turn admitted under the request's scope and
    generation, and auto-saves once ``autosave_every_user_turns`` of them await collection (R7, R24, R36)."""

    async def governed_auto_save(callback_context: CallbackContext) -> None:
        service = _service(callback_context)
        if service is not None:
            await service.end_turn(
                callback_context._invocation_context.session,
                callback_context.invocation_id,
                agent.canonical_model,
                recalled=boundary.recalled(),
            )
        return None

    return governed_auto_save


def _with_memory_instruction(instruction: str | InstructionProvider) -> str | InstructionProvider:
    """``instruction`` followed by ``MEMORY_INSTRUCTION``, whether it is text or a provider of text."""
    if isinstance(instruction, str):
        return instruction + MEMORY_INSTRUCTION
    provider = instruction

    async def with_memory(context: ReadonlyContext) -> str:
        text = provider(context)
        return (await text if inspect.isawaitable(text) else text) + MEMORY_INSTRUCTION

    return with_memory


def configure_memory(config: Any, agent: LlmAgent) -> None:
    """Replaces ``AgentConfig._configure_memory``: governed tools, instruction and auto-save only."""
    tools = [GovernedPrefetchMemoryTool(), GovernedLoadMemoryTool(), GovernedSaveMemoryTool()]  # type: ignore[no-untyped-call]
    agent.tools.extend(tools)
    if isinstance(agent.static_instruction, str) and agent.static_instruction:
        agent.static_instruction += MEMORY_INSTRUCTION
    else:  # no static text (it may be None, or content that is not text): the instruction says it
        agent.instruction = _with_memory_instruction(agent.instruction)
    callbacks = agent.after_agent_callback
    callbacks = [] if callbacks is None else list(callbacks) if isinstance(callbacks, list) else [callbacks]
    agent.after_agent_callback = [*callbacks, autosave_callback(agent)]
