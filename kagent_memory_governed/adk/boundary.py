"""The conversation boundary: what memory work leaves in the conversation kagent keeps (R37, R38).

kagent persists every event of a run to its controller (session events, A2A task history) and sends the
session back to the model on later turns. So a recall never becomes an event: ``load_memory`` answers a
content-free placeholder (``{"result": "Recalled 2 memories for that turn only ...", "reference": ...}``) and
the recalled entries are kept for the running invocation only, in a ``ContextVar`` that dies with it;
``RecallBoundary`` puts them into the outgoing model request of that invocation and nowhere else.

Both are ``{"result": <text>}``, the form google-adk gives a tool's string answer: every model adapter kagent
ships (OpenAI chat and Responses, Azure, Anthropic, Ollama, Bedrock, SAP AI Core, Gemini) turns ``result``
into the tool message's text; other keys of a function response reach some providers as ``""``.

A model failure inside memory work becomes the reason code ``model_failed``, whether the adapter answered
an error response or raised: the provider's text can quote the prompt and the facts in it.
"""

from __future__ import annotations

import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from google.adk.agents.callback_context import CallbackContext
from google.adk.agents.invocation_context import InvocationContext
from google.adk.events import Event
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins import BasePlugin
from google.genai import types

from kagent_memory_governed.adk.request import current
from kagent_memory_governed.errors import Reason

PLUGIN_NAME = "governed_memory_boundary"
MODEL_ERROR_CODE = "API_ERROR"  # what kagent's own adapters answer for a provider failure


@dataclass
class Recall:
    """What the running invocation recalled: tool results by placeholder reference, and whether any hit."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    hit: bool = False


_recall: ContextVar[Recall | None] = ContextVar("governed_memory_recall", default=None)


def model_failed() -> LlmResponse:
    """The model answer inside memory work when the provider failed: the reason code, no provider text."""
    return LlmResponse(error_code=MODEL_ERROR_CODE, error_message=Reason.MODEL_FAILED.value)


def placeholder(count: int) -> str:
    """What a later turn of the conversation reads where ``count`` memories were recalled."""
    return (
        f"Recalled {count} memories for that turn only; memory is not kept in the conversation "
        "(call load_memory again if it is needed)."
    )


def keep(result: str, count: int) -> dict[str, Any]:
    """Keep the tool answer ``result`` for this invocation's model requests; returns what the event may hold
    instead: a placeholder text and a random reference (ADK strips call ids from model requests, so the
    placeholder names itself). Outside a governed run, where there is no invocation to keep it for, the
    model gets the placeholder only."""
    reference = f"recall-{uuid.uuid4().hex}"
    recall = _recall.get()
    if recall is not None:
        recall.results[reference] = {"result": result}
    if count:
        note_hit()
    return {"result": placeholder(count), "reference": reference}


def note_hit() -> None:
    """The running invocation recalled at least one entry (prefetch or ``load_memory``)."""
    recall = _recall.get()
    if recall is not None:
        recall.hit = True


def recalled() -> bool:
    """Whether the running invocation recalled memory: its agent text is not auto-save input (R36)."""
    recall = _recall.get()
    return recall is not None and recall.hit


def restore(llm_request: LlmRequest) -> None:
    """Put this invocation's kept results into ``llm_request`` in place of their placeholders. The
    request's contents are copies of the session's events, so the events keep the placeholders."""
    recall = _recall.get()
    if recall is None or not recall.results:
        return
    for index, content in enumerate(llm_request.contents):
        parts = content.parts or []
        if not any(_kept(part, recall) for part in parts):
            continue
        restored = [_restored(part, recall) for part in parts]
        llm_request.contents[index] = content.model_copy(update={"parts": restored})


def _restored(part: types.Part, recall: Recall) -> types.Part:
    reference = _reference(part)
    if part.function_response is None or not isinstance(reference, str) or reference not in recall.results:
        return part
    return types.Part(
        function_response=part.function_response.model_copy(update={"response": recall.results[reference]})
    )


def _reference(part: types.Part) -> object:
    response = part.function_response.response if part.function_response else None
    return response.get("reference") if isinstance(response, dict) else None


def _kept(part: types.Part, recall: Recall) -> bool:
    reference = _reference(part)
    return isinstance(reference, str) and reference in recall.results


class RecallBoundary(BasePlugin):
    """Runs first among a governed Runner's plugins: opens each invocation's recall, restores it into that
    invocation's model requests only, and strips provider error text from events inside memory work."""

    def __init__(self) -> None:
        super().__init__(name=PLUGIN_NAME)

    async def before_run_callback(self, *, invocation_context: InvocationContext) -> None:
        _recall.set(Recall())  # a fresh, empty recall per invocation: nothing carries over
        return None

    async def before_model_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        restore(llm_request)
        return None

    async def on_model_error_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest, error: Exception
    ) -> LlmResponse | None:
        # Some adapters raise (google-adk's Anthropic and Gemini); kagent's executor would publish str(error)
        return model_failed() if current() is not None else None

    async def on_event_callback(self, *, invocation_context: InvocationContext, event: Event) -> Event | None:
        if event.error_message and current() is not None:
            # kagent's model adapters put str(exception) here; it reaches the A2A answer and the session
            return event.model_copy(update={"error_message": Reason.MODEL_FAILED.value})
        return None

    async def after_run_callback(self, *, invocation_context: InvocationContext) -> None:
        _recall.set(None)
        return None
