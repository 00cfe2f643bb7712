"""What a provider's script sees and answers: the neutral :class:`View` of a model request, whatever the
protocol, and the answers a script gives (a :class:`Reply`, a :class:`Failure`, or a shorthand for a reply)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class View:
    """A model request as the provider parsed it, the same fields whatever the protocol.

    ``tool_result`` is the text of the last message when that message is a tool result, as the adapter
    rendered it (``None`` otherwise; a Gemini ``functionResponse`` object is given as compact JSON).
    ``user_text`` is the text of the last user message that has text; ``summary`` is true when it holds
    the summarizer's marker."""

    protocol: str
    model: str
    stream: bool
    system: str
    user_text: str
    tool_result: str | None
    tool_name: str | None
    tools: tuple[str, ...]
    summary: bool


@dataclass(frozen=True)
class ToolCall:
    """A tool call to answer with. ``id`` is assigned by the provider when empty (Gemini sends none)."""

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)
    id: str = ""


@dataclass(frozen=True)
class Reply:
    """A model answer: text, tool calls, or both (text first)."""

    text: str = ""
    calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class Failure:
    """A provider error: the HTTP ``status`` and the service's JSON error body carrying ``message`` and a
    provider error code (``code``, or the service's usual code for the status). ``retry`` sets the
    Stainless SDKs' ``x-should-retry`` header (OpenAI, Anthropic): false by default, so one failure is one
    request and no client backoff runs. ``midstream``: a streamed request is answered 200 and its stream,
    once open, carries the error as the service frames one (an ``error`` event, a failed response, an
    exception message); a request sent whole still gets the HTTP error."""

    status: int = 500
    message: str = "loopback provider failure"
    code: str | None = None
    retry: bool = False
    midstream: bool = False


Answer = Reply | Failure | str | ToolCall | Sequence[ToolCall]
Script = Callable[[View], Answer]


def default_script(view: View) -> Reply:
    """``noted`` after a tool result, ``ok`` otherwise (the summarizer's request included)."""
    return Reply("noted" if view.tool_result is not None else "ok")


def as_reply(answer: Answer) -> Reply | Failure:
    """The answer a shorthand stands for: text is a reply with that text, tool calls a reply making them."""
    if isinstance(answer, Reply | Failure):
        return answer
    if isinstance(answer, str):
        return Reply(answer)
    if isinstance(answer, ToolCall):
        return Reply(calls=(answer,))
    return Reply(calls=tuple(answer))
