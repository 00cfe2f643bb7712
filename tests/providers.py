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
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import shutil
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import version
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from kagent_memory_governed.adk.conversation import SUMMARY_MARKER
from kagent_memory_governed.testing import embed

__all__ = [
    "ADAPTERS",
    "RELEASE",
    "Adapter",
    "Failure",
    "Provider",
    "Reply",
    "Request",
    "ToolCall",
    "View",
    "available",
    "default_script",
    "provider_fixture",
]

RELEASE = version("kagent-adk")
"""The kagent-adk release this interpreter runs."""

_CREATED = 1_767_225_600  # a fixed timestamp: answers are byte-for-byte reproducible


# ---------------------------------------------------------------------------------------------------------
# What the script sees and answers


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


def _reply(answer: Answer) -> Reply | Failure:
    if isinstance(answer, Reply | Failure):
        return answer
    if isinstance(answer, str):
        return Reply(answer)
    if isinstance(answer, ToolCall):
        return Reply(calls=(answer,))
    return Reply(calls=tuple(answer))


@dataclass(frozen=True)
class Request:
    """One request as it arrived: ``path`` holds the query; ``body`` the bytes, undecoded.

    ``kind`` is ``chat`` or ``summary`` (model requests, ``view`` set), ``embedding`` (OpenAI's embeddings
    API, answered with ``testing.embed``), ``token`` (an OAuth token request),
    ``deployments`` (SAP AI Core's deployment listing) or ``unknown`` (no protocol serves its route, or its
    body did not parse: answered 404 or 500, and the test fails)."""

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    kind: str
    view: View | None = None

    def header(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key.lower() == name.lower()), None)

    def json(self) -> Any:
        return json.loads(self.body)


# ---------------------------------------------------------------------------------------------------------
# Wire framing shared by the protocols


@dataclass(frozen=True)
class _Response:
    status: int
    content_type: str
    chunks: tuple[bytes, ...]  # more than one: sent with chunked transfer encoding, one write per chunk
    headers: tuple[tuple[str, str], ...] = ()
    stream: bool = False


def _json(status: int, value: Any, *headers: tuple[str, str]) -> _Response:
    return _Response(status, "application/json", (json.dumps(value).encode(),), headers)


def _sse(events: Iterable[tuple[str | None, Any]], *, separator: str = "\n\n", done: bool = False) -> _Response:
    chunks = []
    for event, data in events:
        head = f"event: {event}\n" if event else ""
        chunks.append(f"{head}data: {json.dumps(data)}{separator}".encode())
    if done:
        chunks.append(f"data: [DONE]{separator}".encode())
    return _Response(200, "text/event-stream", tuple(chunks), stream=True)


def _pieces(text: str) -> list[str]:
    """Text cut in two, so a streaming client aggregates deltas."""
    if len(text) < 2:
        return [text] if text else []
    return [text[: len(text) // 2], text[len(text) // 2 :]]


def _text(value: Any) -> str:
    """The text of a message content: a string, or a list of text blocks (``text``/``input_text``...)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(item["text"] for item in value if isinstance(item, dict) and isinstance(item.get("text"), str))
    return ""


def _usage(view: View, reply: Reply) -> tuple[int, int]:
    return len(view.system + view.user_text) // 4 + 1, len(reply.text) // 4 + len(reply.calls) + 1


class _Ids:
    def __init__(self) -> None:
        self._next = itertools.count(1)

    def __call__(self, prefix: str) -> str:
        return f"{prefix}{next(self._next)}"


def _calls(reply: Reply, ids: _Ids, prefix: str) -> list[ToolCall]:
    return [ToolCall(c.name, dict(c.args), c.id or ids(prefix)) for c in reply.calls]


# ---------------------------------------------------------------------------------------------------------
# The protocols: each parses a request into a View and frames a Reply or a Failure as its service does


class _Protocol:
    name: str

    def view(self, path: str, body: Any) -> View:
        raise NotImplementedError

    def reply(self, view: View, reply: Reply, ids: _Ids) -> _Response:
        raise NotImplementedError

    def failure(self, view: View, failure: Failure) -> _Response:
        raise NotImplementedError


def _openai_messages_view(protocol: str, model: str, stream: bool, messages: list[dict], tools: list[str]) -> View:
    names = {c.get("id"): c["function"]["name"] for m in messages for c in m.get("tool_calls") or []}
    last = messages[-1] if messages else {}
    result = _text(last.get("content")) if last.get("role") == "tool" else None
    users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    return View(
        protocol=protocol,
        model=model,
        stream=stream,
        system="\n".join(_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer")),
        user_text=next((t for t in reversed(users) if t), ""),
        tool_result=result,
        tool_name=names.get(last.get("tool_call_id")) if result is not None else None,
        tools=tuple(tools),
        summary=False,
    )


_OPENAI_ERRORS = {400: "invalid_request_error", 401: "invalid_api_key", 429: "requests"}


def _openai_error(failure: Failure) -> dict[str, Any]:
    kind = "server_error" if failure.status >= 500 else _OPENAI_ERRORS.get(failure.status, "invalid_request_error")
    code = failure.code or ("rate_limit_exceeded" if failure.status == 429 else kind)
    return {"message": failure.message, "type": kind, "param": None, "code": code}


def _openai_failure(failure: Failure) -> _Response:
    return _json(failure.status, {"error": _openai_error(failure)}, ("x-should-retry", str(failure.retry).lower()))


def _openai_tool_calls(calls: list[ToolCall]) -> list[dict]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.args)}} for c in calls
    ]


class _OpenAIChat(_Protocol):
    """``POST /v1/chat/completions`` (OpenAI) and ``/openai/deployments/<d>/chat/completions`` (Azure)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def view(self, path: str, body: Any) -> View:
        model = body.get("model", "")
        if self.name == "azure_openai":
            model = unquote(urlsplit(path).path.split("/openai/deployments/", 1)[1].split("/", 1)[0])
        tools = [t["function"]["name"] for t in body.get("tools") or []]
        return _openai_messages_view(self.name, model, bool(body.get("stream")), body.get("messages") or [], tools)

    def reply(self, view: View, reply: Reply, ids: _Ids) -> _Response:
        calls = _calls(reply, ids, "call_")
        prompt, completion = _usage(view, reply)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        finish = "tool_calls" if calls else "stop"
        head = {"id": ids("chatcmpl-"), "created": _CREATED, "model": view.model, "system_fingerprint": None}
        if not view.stream:
            message: dict[str, Any] = {"role": "assistant", "content": reply.text or None, "refusal": None}
            if calls:
                message["tool_calls"] = _openai_tool_calls(calls)
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            return _json(200, {**head, "object": "chat.completion", "choices": [choice], "usage": usage})

        def chunk(delta: dict, finish_reason: str | None = None) -> tuple[None, dict]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return None, {**head, "object": "chat.completion.chunk", "choices": [choice]}

        events = [chunk({"role": "assistant", "content": "", "refusal": None})]
        events += [chunk({"content": piece}) for piece in _pieces(reply.text)]
        for index, call in enumerate(calls):
            opening = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name}}
            events.append(chunk({"tool_calls": [{**opening, "function": {"name": call.name, "arguments": ""}}]}))
            for piece in _pieces(json.dumps(call.args)):
                events.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
        events.append(chunk({}, finish))
        events.append((None, {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}))
        return _sse(events, done=True)

    def failure(self, view: View, failure: Failure) -> _Response:
        if not (failure.midstream and view.stream):
            return _openai_failure(failure)
        head = {"id": "chatcmpl-failed", "object": "chat.completion.chunk", "created": _CREATED, "model": view.model}
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return _sse([(None, {**head, "choices": [choice]}), (None, {"error": _openai_error(failure)})])


class _OpenAIResponses(_Protocol):
    """``POST /v1/responses``: the OpenAI Responses API, JSON or typed SSE events."""

    name = "openai_responses"

    def view(self, path: str, body: Any) -> View:
        items = body.get("input") or []
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items
        names = {i.get("call_id"): i.get("name") for i in items if i.get("type") == "function_call"}
        last = items[-1] if items else {}
        result = _text(last.get("output")) if last.get("type") == "function_call_output" else None
        users = [_text(i.get("content")) for i in items if i.get("role") == "user"]
        systems = [_text(i.get("content")) for i in items if i.get("role") in ("system", "developer")]
        return View(
            protocol=self.name,
            model=body.get("model", ""),
            stream=bool(body.get("stream")),
            system="\n".join(([body["instructions"]] if body.get("instructions") else []) + systems),
            user_text=next((t for t in reversed(users) if t), ""),
            tool_result=result,
            tool_name=names.get(last.get("call_id")) if result is not None else None,
            tools=tuple(t.get("name", "") for t in body.get("tools") or []),
            summary=False,
        )

    def reply(self, view: View, reply: Reply, ids: _Ids) -> _Response:
        calls = _calls(reply, ids, "call_")
        prompt, completion = _usage(view, reply)
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        }
        output: list[dict] = []
        if reply.text:
            part = {"type": "output_text", "text": reply.text, "annotations": [], "logprobs": []}
            output.append(
                {"type": "message", "id": ids("msg_"), "status": "completed", "role": "assistant", "content": [part]}
            )
        for call in calls:
            output.append(
                {
                    "type": "function_call",
                    "id": ids("fc_"),
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": json.dumps(call.args),
                    "status": "completed",
                }
            )
        response = {
            "id": ids("resp_"),
            "object": "response",
            "created_at": _CREATED,
            "status": "completed",
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "model": view.model,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "temperature": 1.0,
            "top_p": 1.0,
            "metadata": {},
            "usage": usage,
        }
        if not view.stream:
            return _json(200, response)

        sequence = itertools.count()
        events: list[tuple[str | None, Any]] = []

        def event(kind: str, **data: Any) -> None:
            events.append((kind, {"type": kind, "sequence_number": next(sequence), **data}))

        opening = {**response, "status": "in_progress", "output": [], "usage": None}
        event("response.created", response=opening)
        event("response.in_progress", response=opening)
        for index, item in enumerate(output):
            if item["type"] == "message":
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "content": []},
                )
                event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=part)
                for piece in _pieces(reply.text):
                    event(
                        "response.output_text.delta",
                        item_id=item["id"],
                        output_index=index,
                        content_index=0,
                        delta=piece,
                        logprobs=[],
                    )
                where = {"item_id": item["id"], "output_index": index, "content_index": 0}
                event("response.output_text.done", **where, text=reply.text, logprobs=[])
                event("response.content_part.done", **where, part=item["content"][0])
            else:
                event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "arguments": "", "status": "in_progress"},
                )
                for piece in _pieces(item["arguments"]):
                    event("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=piece)
                event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            event("response.output_item.done", output_index=index, item=item)
        event("response.completed", response=response)
        return _sse(events)

    def failure(self, view: View, failure: Failure) -> _Response:
        if not (failure.midstream and view.stream):
            return _openai_failure(failure)
        response = {
            "id": "resp_failed",
            "object": "response",
            "created_at": _CREATED,
            "model": view.model,
            "output": [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
        error = {"code": failure.code or "server_error", "message": failure.message}
        return _sse(
            [
                ("response.created", {"type": "response.created", "sequence_number": 0, "response": response}),
                (
                    "response.failed",
                    {
                        "type": "response.failed",
                        "sequence_number": 1,
                        "response": {**response, "status": "failed", "error": error},
                    },
                ),
            ]
        )


def _anthropic_view(protocol: str, model: str, body: Any) -> View:
    messages = body.get("messages") or []
    names = {
        b.get("id"): b.get("name")
        for m in messages
        if isinstance(m.get("content"), list)
        for b in m["content"]
        if b.get("type") == "tool_use"
    }
    last = messages[-1] if messages else {}
    blocks = last.get("content") if isinstance(last.get("content"), list) else []
    results = [b for b in blocks if b.get("type") == "tool_result"]
    result = results[-1] if last.get("role") == "user" and results and blocks[-1] is results[-1] else None
    users = [
        _text([b for b in m["content"] if b.get("type") == "text"] if isinstance(m["content"], list) else m["content"])
        for m in messages
        if m.get("role") == "user"
    ]
    return View(
        protocol=protocol,
        model=model,
        stream=bool(body.get("stream")),
        system=_text(body.get("system")),
        user_text=next((t for t in reversed(users) if t), ""),
        tool_result=_text(result.get("content")) if result is not None else None,
        tool_name=names.get(result.get("tool_use_id")) if result is not None else None,
        tools=tuple(t.get("name", "") for t in body.get("tools") or []),
        summary=False,
    )


def _anthropic_reply(view: View, reply: Reply, ids: _Ids) -> _Response:
    calls = _calls(reply, ids, "toolu_loopback_")
    prompt, completion = _usage(view, reply)
    blocks: list[dict] = [{"type": "text", "text": reply.text}] if reply.text else []
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": dict(c.args)} for c in calls]
    stop = "tool_use" if calls else "end_turn"
    message = {"id": ids("msg_loopback_"), "type": "message", "role": "assistant", "model": view.model}
    if not view.stream:
        usage = {"input_tokens": prompt, "output_tokens": completion}
        body = {**message, "content": blocks, "stop_reason": stop, "stop_sequence": None, "usage": usage}
        return _json(200, body)
    opening = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    events: list[tuple[str | None, Any]] = [
        (
            "message_start",
            {"type": "message_start", "message": {**opening, "usage": {"input_tokens": prompt, "output_tokens": 1}}},
        ),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in _pieces(block["text"])]
        else:
            start = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in _pieces(json.dumps(block["input"]))]
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}))
        events += [("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}) for d in deltas]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta = {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}}
    events.append(("message_delta", {**delta, "usage": {"output_tokens": completion}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return _sse(events)


_ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


class _Anthropic(_Protocol):
    """``POST /v1/messages``: Anthropic messages, JSON or SSE events."""

    name = "anthropic"

    def view(self, path: str, body: Any) -> View:
        return _anthropic_view(self.name, body.get("model", ""), body)

    def reply(self, view: View, reply: Reply, ids: _Ids) -> _Response:
        return _anthropic_reply(view, reply, ids)

    def failure(self, view: View, failure: Failure) -> _Response:
        if failure.midstream and view.stream:
            return _anthropic_broken_stream(view, failure)
        kind = failure.code or _ANTHROPIC_ERRORS.get(failure.status, "api_error")
        body = {"type": "error", "error": {"type": kind, "message": failure.message}, "request_id": "req_loopback"}
        return _json(failure.status, body, ("x-should-retry", str(failure.retry).lower()))


def _anthropic_broken_stream(view: View, failure: Failure) -> _Response:
    """An opened message stream, then an ``error`` event (how Anthropic reports overload mid-stream)."""
    message = {"id": "msg_failed", "type": "message", "role": "assistant", "model": view.model, "content": []}
    usage = {"input_tokens": 1, "output_tokens": 1}
    opening = {**message, "stop_reason": None, "stop_sequence": None, "usage": usage}
    error = {"type": failure.code or _ANTHROPIC_ERRORS.get(failure.status, "api_error"), "message": failure.message}
    return _sse(
        [
            ("message_start", {"type": "message_start", "message": opening}),
            ("error", {"type": "error", "error": error}),
        ]
    )


_GOOGLE_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def _google_error(failure: Failure) -> dict[str, Any]:
    status = failure.code or _GOOGLE_STATUSES.get(failure.status, "UNKNOWN")
    return {"error": {"code": failure.status, "message": failure.message, "status": status}}


def _google_failure(failure: Failure, *headers: tuple[str, str]) -> _Response:
    return _json(failure.status, _google_error(failure), *headers)


class _AnthropicVertex(_Protocol):
    """``POST .../publishers/anthropic/models/<m>:rawPredict`` or ``:streamRawPredict``: Claude on Vertex AI."""

    name = "anthropic_vertex"

    def view(self, path: str, body: Any) -> View:
        model = urlsplit(path).path.rsplit("/models/", 1)[1].split(":", 1)[0]
        return _anthropic_view(self.name, unquote(model), body)

    def reply(self, view: View, reply: Reply, ids: _Ids) -> _Response:
        return _anthropic_reply(view, reply, ids)

    def failure(self, view: View, failure: Failure) -> _Response:
        if failure.midstream and view.stream:
            return _anthropic_broken_stream(view, failure)
        return _google_failure(failure, ("x-should-retry", str(failure.retry).lower()))


class _Ollama(_Protocol):
    """``POST /api/chat``: Ollama, JSON or newline-delimited JSON."""

    name = "ollama"

    def view(self, path: str, body: Any) -> View:
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        result = _text(last.get("content")) if last.get("role") == "tool" else None
        users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
        return View(
            protocol=self.name,
            model=body.get("model", ""),
            stream=body.get("stream", True) is not False,
            system="\n".join(_text(m.get("content")) for m in messages if m.get("role") == "system"),
            user_text=next((t for t in reversed(users) if t), ""),
            tool_result=result,
            tool_name=(last.get("tool_name") or None) if result is not None else None,
            tools=tuple(t["function"]["name"] for t in body.get("tools") or []),
            summary=False,
        )

    def reply(self, view: View, reply: Reply, ids: _Ids) -> _Response:
        prompt, completion = _usage(view, reply)
        head = {"model": view.model, "created_at": "2026-01-01T00:00:00.000000Z"}
        calls = [
            {"function": {"index": i, "name": c.name, "arguments": dict(c.args)}} for i, c in enumerate(reply.calls)
        ]
        counts = {
            "done_reason": "stop",
            "total_duration": 1_000_000,
            "load_duration": 1_000,
            "prompt_eval_count": prompt,
            "prompt_eval_duration": 1_000,
            "eval_count": completion,
            "eval_duration": 1_000,
        }
        if not view.stream:
            message: dict[str, Any] = {"role": "assistant", "content": reply.text}
            if calls:
                message["tool_calls"] = calls
            return _json(200, {**head, "message": message, "done": True, **counts})
        lines = [{**head, "message": {"role": "assistant", "content": p}, "done": False} for p in _pieces(reply.text)]
        if calls:
            lines.append({**head, "message": {"role": "assistant", "content": "", "tool_calls": calls}, "done": False})
        lines.append({**head, "message": {"role": "assistant", "content": ""}, "done": True, **counts})
        chunks = tuple(json.dumps(line).encode() + b"\n" for line in lines)
        return _Response(200, "application/x-ndjson", chunks, stream=True)

    def failure(self, view: View, failure: Failure) -> _Response:
        if not (failure.midstream and view.stream):
            return _json(failure.status, {"error": failure.message})
        opening = {"model": view.model, "created_at": "2026-01-01T00:00:00.000000Z", "done": False}
        lines = [{**opening, "message": {"role": "assistant", "content": ""}}, {"error": failure.message}]
        return _Response(200, "application/x-ndjson", tuple(json.dumps(x).encode() + b"\n" for x in lines), stream=True)


def _gemini_view(protocol: str, path: str, body: Any) -> View:
    model = unquote(urlsplit(path).path.rsplit("/models/", 1)[1].split(":", 1)[0])
    contents = body.get("contents") or []
    last_parts = contents[-1].get("parts") or [] if contents else []
    responses = [p["functionResponse"] for p in last_parts if "functionResponse" in p]
    result = responses[-1] if responses else None
    users = [
        "\n".join(p["text"] for p in c.get("parts") or [] if isinstance(p.get("text"), str))
        for c in contents
        if c.get("role", "user") == "user"
    ]
    system = body.get("systemInstruction") or {}
    declarations = [d for t in body.get("tools") or [] for d in t.get("functionDeclarations") or []]
    return View(
        protocol=protocol,
        model=model,
        stream=":streamGenerateContent" in path,
        system="\n".join(p["text"] for p in system.get("parts") or [] if "text" in p),
        user_text=next((t for t in reversed(users) if t), ""),
        tool_result=json.dumps(result.get("response"), separators=(",", ":")) if result is not None else None,
        tool_name=result.get("name") if result is not None else None,
        tools=tuple(d.get("name", "") for d in declarations),
        summary=False,
    )


class _Gemini(_Protocol):
    """``POST .../models/<m>:generateContent`` and ``:streamGenerateContent?alt=sse``: the Gemini API and
    Gemini on Vertex AI."""

    def __init__(self, name: str) -> None:
        self.name = name

    def view(self, path: str, body: Any) -> View:
        return _gemini_view(self.name, path, body)

    def reply(self, view: View, reply: Reply, ids: _Ids) -> _Response:
        prompt, completion = _usage(view, reply)
        usage = {"promptTokenCount": prompt, "candidatesTokenCount": completion, "totalTokenCount": prompt + completion}
        calls = [
            {"functionCall": {**({"id": c.id} if c.id else {}), "name": c.name, "args": dict(c.args)}}
            for c in reply.calls
        ]
        head = {"modelVersion": view.model, "responseId": ids("loopback-")}

        def candidate(parts: list[dict], finish: bool) -> dict:
            content = {"role": "model", "parts": parts}
            return {"content": content, "index": 0, **({"finishReason": "STOP"} if finish else {})}

        if not view.stream:
            parts = ([{"text": reply.text}] if reply.text else []) + calls
            return _json(200, {"candidates": [candidate(parts, True)], "usageMetadata": usage, **head})
        chunks: list[tuple[str | None, Any]] = [
            (None, {"candidates": [candidate([{"text": p}], False)], **head}) for p in _pieces(reply.text)
        ]
        if calls:
            chunks.append((None, {"candidates": [candidate(calls, False)], **head}))
        last = chunks.pop()[1] if chunks else {"candidates": [candidate([{"text": ""}], False)], **head}
        chunks.append(
            (None, {**last, "candidates": [{**last["candidates"][0], "finishReason": "STOP"}], "usageMetadata": usage})
        )
        return _sse(chunks, separator="\r\n\r\n")

    def failure(self, view: View, failure: Failure) -> _Response:
        if failure.midstream and view.stream:
            return _sse([(None, _google_error(failure))], separator="\r\n\r\n")
        return _google_failure(failure)


def _eventstream_message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One AWS event-stream message: prelude (total and headers lengths, CRC32), string headers, payload,
    CRC32 of the whole message."""
    encoded = b"".join(
        len(name.encode()).to_bytes(1, "big")
        + name.encode()
        + b"\x07"
        + len(value.encode()).to_bytes(2, "big")
        + value.encode()
        for name, value in headers.items()
    )
    prelude = (12 + len(encoded) + len(payload) + 4).to_bytes(4, "big") + len(encoded).to_bytes(4, "big")
    message = prelude + zlib.crc32(prelude).to_bytes(4, "big") + encoded + payload
    return message + zlib.crc32(message).to_bytes(4, "big")


_BEDROCK_ERRORS = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    503: "ServiceUnavailableException",
}


class _BedrockConverse(_Protocol):
    """``POST /model/<id>/converse`` and ``/model/<id>/converse-stream``: Bedrock Converse, JSON or AWS
    event-stream binary frames."""

    name = "bedrock"

    def view(self, path: str, body: Any) -> View:
        route = urlsplit(path).path
        messages = body.get("messages") or []
        names = {
            b["toolUse"].get("toolUseId"): b["toolUse"].get("name")
            for m in messages
            for b in m.get("content") or []
            if "toolUse" in b
        }
        last_blocks = messages[-1].get("content") or [] if messages else []
        results = [b["toolResult"] for b in last_blocks if "toolResult" in b]
        result = results[-1] if results and "toolResult" in last_blocks[-1] else None
        users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
        tools = (body.get("toolConfig") or {}).get("tools") or []
        return View(
            protocol=self.name,
            model=unquote(route.split("/model/", 1)[1].rsplit("/", 1)[0]),
            stream=route.endswith("/converse-stream"),
            system=_text(body.get("system")),
            user_text=next((t for t in reversed(users) if t), ""),
            tool_result=(
                "\n".join(c["text"] if "text" in c else json.dumps(c.get("json")) for c in result.get("content") or [])
                if result is not None
                else None
            ),
            tool_name=names.get(result.get("toolUseId")) if result is not None else None,
            tools=tuple(t["toolSpec"]["name"] for t in tools if "toolSpec" in t),
            summary=False,
        )

    def reply(self, view: View, reply: Reply, ids: _Ids) -> _Response:
        calls = _calls(reply, ids, "tooluse_loopback_")
        prompt, completion = _usage(view, reply)
        usage = {"inputTokens": prompt, "outputTokens": completion, "totalTokens": prompt + completion}
        stop = "tool_use" if calls else "end_turn"
        request_id = ("x-amzn-RequestId", ids("loopback-request-"))
        if not view.stream:
            blocks: list[dict] = [{"text": reply.text}] if reply.text else []
            blocks += [{"toolUse": {"toolUseId": c.id, "name": c.name, "input": dict(c.args)}} for c in calls]
            body = {
                "output": {"message": {"role": "assistant", "content": blocks}},
                "stopReason": stop,
                "usage": usage,
                "metrics": {"latencyMs": 1},
            }
            return _json(200, body, request_id)
        events: list[tuple[str, dict]] = [("messageStart", {"role": "assistant"})]
        index = 0
        if reply.text:
            events += [
                ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": p}}) for p in _pieces(reply.text)
            ]
            events.append(("contentBlockStop", {"contentBlockIndex": 0}))
            index = 1
        for offset, call in enumerate(calls, start=index):
            start = {"toolUse": {"toolUseId": call.id, "name": call.name}}
            events.append(("contentBlockStart", {"contentBlockIndex": offset, "start": start}))
            for piece in _pieces(json.dumps(call.args)):
                events.append(
                    ("contentBlockDelta", {"contentBlockIndex": offset, "delta": {"toolUse": {"input": piece}}})
                )
            events.append(("contentBlockStop", {"contentBlockIndex": offset}))
        events.append(("messageStop", {"stopReason": stop}))
        events.append(("metadata", {"usage": usage, "metrics": {"latencyMs": 1}}))
        chunks = tuple(
            _eventstream_message(
                {":event-type": kind, ":content-type": "application/json", ":message-type": "event"},
                json.dumps(payload).encode(),
            )
            for kind, payload in events
        )
        return _Response(200, "application/vnd.amazon.eventstream", chunks, (request_id,), stream=True)

    def failure(self, view: View, failure: Failure) -> _Response:
        code = failure.code or _BEDROCK_ERRORS.get(failure.status, "InternalServerException")
        payload = json.dumps({"message": failure.message}).encode()
        if failure.midstream and view.stream:  # the stream's exception member, e.g. throttlingException
            start = {":event-type": "messageStart", ":content-type": "application/json", ":message-type": "event"}
            exception = {
                ":exception-type": code[0].lower() + code[1:],
                ":content-type": "application/json",
                ":message-type": "exception",
            }
            chunks = (_eventstream_message(start, b'{"role":"assistant"}'), _eventstream_message(exception, payload))
            return _Response(200, "application/vnd.amazon.eventstream", chunks, stream=True)
        error_type = ("x-amzn-ErrorType", f"{code}:http://internal.amazon.com/coral/com.amazon.bedrock/")
        return _Response(
            failure.status, "application/json", (payload,), (error_type, ("x-amzn-RequestId", "loopback-error"))
        )


class _SAPOrchestration(_Protocol):
    """``POST <deploymentUrl>/v2/completion``: SAP AI Core's orchestration service, JSON or SSE."""

    name = "sap_ai_core"

    def view(self, path: str, body: Any) -> View:
        templating = body["config"]["modules"]["prompt_templating"]
        prompt = templating.get("prompt") or {}
        tools = [t["function"]["name"] for t in prompt.get("tools") or []]
        stream = bool((body["config"].get("stream") or {}).get("enabled"))
        return _openai_messages_view(
            self.name, templating["model"]["name"], stream, prompt.get("template") or [], tools
        )

    def reply(self, view: View, reply: Reply, ids: _Ids) -> _Response:
        chat = _OpenAIChat("openai").reply(view, reply, ids)
        request_id = ids("loopback-request-")
        if not view.stream:
            final = json.loads(chat.chunks[0])
            return _json(200, {"request_id": request_id, "intermediate_results": {}, "final_result": final})
        events = []
        for chunk in chat.chunks:
            data = chunk.decode().removeprefix("data: ").strip()
            if data != "[DONE]":
                events.append(
                    (None, {"request_id": request_id, "intermediate_results": {}, "final_result": json.loads(data)})
                )
        return _sse(events, done=True)

    def failure(self, view: View, failure: Failure) -> _Response:
        error = {
            "request_id": "loopback-error",
            "code": failure.status,
            "message": failure.message,
            "location": failure.code or "LLM Module",
            "intermediate_results": {},
        }
        if failure.midstream and view.stream:
            return _sse([(None, {"error": error})])
        return _json(failure.status, {"error": error})


_PROTOCOLS: dict[str, _Protocol] = {
    p.name: p
    for p in (
        _OpenAIChat("openai"),
        _OpenAIChat("azure_openai"),
        _OpenAIResponses(),
        _Anthropic(),
        _AnthropicVertex(),
        _Ollama(),
        _Gemini("gemini"),
        _Gemini("gemini_vertex"),
        _BedrockConverse(),
        _SAPOrchestration(),
    )
}


def _route(method: str, path: str) -> str | None:
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


# ---------------------------------------------------------------------------------------------------------
# The server


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # an idle keep-alive connection's thread ends by itself
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.server.provider._handle(self)

    def do_POST(self) -> None:  # noqa: N802
        self.server.provider._handle(self)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return body
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def send(self, response: _Response) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        # One connection a request. The adapters' clients are never closed: a pooled keep-alive connection is
        # closed later by the garbage collector (asyncio's transport __del__), which closes the socket without
        # leaving the event loop's selector, and a later socket given the same descriptor can then wait forever.
        self.send_header("Connection", "close")
        for name, value in response.headers:
            self.send_header(name, value)
        if not response.stream:
            body = b"".join(response.chunks)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        for chunk in response.chunks:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.write(b"0\r\n\r\n")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, provider: Provider) -> None:
        self.provider = provider
        super().__init__(("127.0.0.1", 0), _Handler)


@functools.cache
def _signing_key() -> str:
    """An RSA key for the service-account file of the Vertex adapters (made once a process: it is slow)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


class Provider:
    """A model provider on ``127.0.0.1`` (a free port), served from a background thread while the context is
    open. ``script`` answers each model request (``default_script`` when none); it may be replaced at any
    time. A script that raises, and any request to a route no protocol knows, fail the test when the
    context closes."""

    def __init__(self, script: Script | None = None, *, summary_marker: str = SUMMARY_MARKER) -> None:
        self.script: Script = script or default_script
        self.summary_marker = summary_marker
        self._requests: list[Request] = []
        self._errors: list[BaseException | str] = []
        self._lock = threading.Lock()
        self._ids = _Ids()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._directory: str | None = None

    # lifecycle

    def __enter__(self) -> Provider:
        self._server = _Server(self)
        # a short poll: closing waits for the serving loop to look up from its select
        serve = functools.partial(self._server.serve_forever, poll_interval=0.02)
        self._thread = threading.Thread(target=serve, name="loopback-provider", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
        if exc_info[0] is None and self._errors:
            error = self._errors[0]
            raise AssertionError(f"the loopback provider failed: {error!r}") from (
                error if isinstance(error, BaseException) else None
            )

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, no trailing slash."""
        assert self._server is not None, "the provider is not running"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # what was received

    @property
    def requests(self) -> list[Request]:
        """Every request so far, in arrival order (a copy)."""
        with self._lock:
            return list(self._requests)

    def of(self, kind: str | None = "chat") -> list[Request]:
        """The requests of one ``kind`` (``chat``, ``summary``, ``token``, ``deployments``); all with None."""
        return [r for r in self.requests if kind is None or r.kind == kind]

    def bodies(self, kind: str | None = "chat") -> list[bytes]:
        """The raw bodies of the requests of one ``kind``."""
        return [r.body for r in self.of(kind)]

    def views(self, kind: str | None = "chat") -> list[View]:
        return [r.view for r in self.of(kind) if r.view is not None]

    def received(self, text: str, kind: str | None = None) -> bool:
        """Whether ``text`` is in the raw body of any request of ``kind`` (every request with None): as is, or
        JSON-escaped once or twice (a tool result serialized into a JSON string inside a JSON body)."""
        forms = _forms(text)
        return any(form in body for body in self.bodies(kind) for form in forms)

    def clear(self) -> None:
        """Forget the requests received so far."""
        with self._lock:
            self._requests.clear()

    # environment

    def service_account_file(self) -> str:
        """A Google service-account key file whose ``token_uri`` is this provider's ``/token``: google-auth
        signs a JWT with it and fetches its access token here."""
        if self._directory is None:
            self._directory = tempfile.mkdtemp(prefix="loopback-provider-")
        path = os.path.join(self._directory, "service-account.json")
        info = {
            "type": "service_account",
            "project_id": "loopback-project",
            "private_key_id": "loopback",
            "private_key": _signing_key(),
            "client_email": "agent@loopback-project.iam.gserviceaccount.com",
            "client_id": "1",
            "token_uri": f"{self.url}/token",
        }
        with open(path, "w") as file:
            json.dump(info, file)
        return path

    # serving

    def _handle(self, handler: _Handler) -> None:
        request = Request(handler.command, handler.path, tuple(handler.headers.items()), handler.read_body(), "unknown")
        try:
            request, response = self._answer(request)
        except Exception as error:  # a body its protocol could not parse: answer 500, fail the test at close
            self._errors.append(error)
            response = _json(500, {"error": {"message": f"loopback provider: {error!r}"}})
        with self._lock:
            self._requests.append(request)
        handler.send(response)

    def _answer(self, request: Request) -> tuple[Request, _Response]:
        route = _route(request.method, request.path)
        if route is None:
            self._errors.append(f"no protocol serves {request.method} {request.path}")
            return request, _json(404, {"error": "no protocol serves this route"})
        if route == "token":
            token = {"access_token": f"loopback-token-{self._ids('')}", "token_type": "Bearer", "expires_in": 3600}
            return replace(request, kind="token"), _json(200, token)
        if route == "deployments":
            return replace(request, kind="deployments"), self._deployments(request.path)
        if route == "embeddings":  # OpenAI's embeddings API, for the Agent's memory.embedding
            texts = request.json()["input"]
            data = [{"object": "embedding", "index": i, "embedding": embed(t)} for i, t in enumerate(texts)]
            usage = {"prompt_tokens": 0, "total_tokens": 0}
            return replace(request, kind="embedding"), _json(200, {"object": "list", "data": data, "usage": usage})
        protocol = _PROTOCOLS[route]
        view = protocol.view(request.path, request.json())
        view = replace(view, summary=self.summary_marker in view.user_text)
        request = replace(request, kind="summary" if view.summary else "chat", view=view)
        try:
            answer = _reply(self.script(view))
        except Exception as error:
            self._errors.append(error)
            return request, _json(500, {"error": {"message": f"loopback provider script: {error!r}"}})
        if isinstance(answer, Failure):
            return request, protocol.failure(view, answer)
        return request, protocol.reply(view, answer, self._ids)

    def _deployments(self, path: str) -> _Response:
        base = urlsplit(path).path.removesuffix("/v2/lm/deployments")
        deployment = {
            "id": "dloopback",
            "deploymentUrl": f"{self.url}{base}/v2/inference/deployments/dloopback",
            "configurationId": "loopback",
            "scenarioId": "orchestration",
            "status": "RUNNING",
            "createdAt": "2026-01-01T00:00:00Z",
        }
        return _json(200, {"count": 1, "resources": [deployment]})


def _forms(text: str) -> set[bytes]:
    """``text`` as is, and JSON-escaped once and twice, with and without ``\\uXXXX`` escapes."""
    forms = {text}
    for outer, inner in itertools.product((True, False), repeat=2):
        once = json.dumps(text, ensure_ascii=inner)[1:-1]
        forms |= {once, json.dumps(once, ensure_ascii=outer)[1:-1]}
    return {form.encode() for form in forms}


@pytest.fixture(name="provider")
def provider_fixture() -> Iterator[Provider]:
    """``provider``: a running :class:`Provider` with the default script, for one test (import this name)."""
    with Provider() as running:
        yield running


# ---------------------------------------------------------------------------------------------------------
# The adapters: how kagent is configured to reach the provider


@dataclass(frozen=True)
class Adapter:
    """One of kagent-adk's model adapters, configured for a :class:`Provider`.

    ``model(provider)`` is the ``model`` dict of kagent's ``AgentConfig`` (``type``, ``model`` and the
    ``settings`` that point it at the provider); ``environment(provider)`` the variables the adapter's client
    reads (None: must be unset); ``apply`` sets them with a monkeypatch, before kagent builds the agent.
    ``errors`` says how a provider error reaches kagent from the adapter: ``response`` (an ``LlmResponse``
    with ``error_code``/``error_message``) or ``exception`` (raised out of ``generate_content_async``)."""

    name: str
    type: str
    protocol: str
    releases: tuple[str, ...]
    errors: str
    model_name: str
    streams: bool = True
    settings: Callable[[Provider], dict[str, Any]] = field(default=lambda provider: {}, repr=False)
    variables: Callable[[Provider], dict[str, str | None]] = field(default=lambda provider: {}, repr=False)

    def model(self, provider: Provider) -> dict[str, Any]:
        return {"type": self.type, "model": self.model_name, **self.settings(provider)}

    def environment(self, provider: Provider) -> dict[str, str | None]:
        return {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", **self.variables(provider)}

    def apply(self, provider: Provider, monkeypatch: pytest.MonkeyPatch) -> None:
        for name, value in self.environment(provider).items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)

    @property
    def available(self) -> bool:
        """Whether the running kagent-adk release has this adapter."""
        return RELEASE in self.releases


_BOTH = ("0.9.11", "0.10.4")

_GOOGLE_UNSET: dict[str, str | None] = {
    "GOOGLE_GENAI_USE_VERTEXAI": None,
    "GOOGLE_GENAI_USE_ENTERPRISE": None,
    "GOOGLE_CLOUD_PROJECT": None,
    "GOOGLE_CLOUD_LOCATION": None,
    "GOOGLE_API_KEY": None,
    "GEMINI_API_KEY": None,
    "GOOGLE_GEMINI_BASE_URL": None,
    "GOOGLE_VERTEX_BASE_URL": None,
    "GOOGLE_APPLICATION_CREDENTIALS": None,
}

ADAPTERS: dict[str, Adapter] = {
    adapter.name: adapter
    for adapter in (
        Adapter(
            name="openai",
            type="openai",
            protocol="openai",
            releases=_BOTH,
            errors="response",
            model_name="gpt-4o-mini",
            settings=lambda p: {"base_url": f"{p.url}/v1"},
            variables=lambda p: {"OPENAI_API_KEY": "sk-loopback"},
        ),
        Adapter(
            name="openai_responses",
            type="openai",
            protocol="openai_responses",
            releases=("0.10.4",),
            errors="response",
            model_name="gpt-4o-mini",
            settings=lambda p: {"base_url": f"{p.url}/v1", "api_format": "responses"},
            variables=lambda p: {"OPENAI_API_KEY": "sk-loopback"},
        ),
        Adapter(
            name="azure_openai",
            type="azure_openai",
            protocol="azure_openai",
            releases=_BOTH,
            errors="response",
            model_name="loopback-deployment",
            variables=lambda p: {
                "AZURE_OPENAI_ENDPOINT": p.url,
                "AZURE_OPENAI_API_KEY": "loopback",
                "OPENAI_API_VERSION": "2024-10-21",
                "AZURE_OPENAI_AD_TOKEN": None,
            },
        ),
        Adapter(
            name="anthropic",
            type="anthropic",
            protocol="anthropic",
            releases=_BOTH,
            errors="exception",
            model_name="claude-sonnet-4-6",
            settings=lambda p: {"base_url": p.url},
            variables=lambda p: {"ANTHROPIC_API_KEY": "sk-ant-loopback", "ANTHROPIC_AUTH_TOKEN": None},
        ),
        Adapter(
            name="ollama",
            type="ollama",
            protocol="ollama",
            releases=_BOTH,
            errors="response",
            model_name="llama3.2",
            variables=lambda p: {"OLLAMA_API_BASE": p.url},
        ),
        Adapter(
            name="gemini",
            type="gemini",
            protocol="gemini",
            releases=_BOTH,
            errors="exception",
            model_name="gemini-2.5-flash",
            variables=lambda p: {**_GOOGLE_UNSET, "GOOGLE_API_KEY": "loopback", "GOOGLE_GEMINI_BASE_URL": p.url},
        ),
        Adapter(
            # Vertex AI express mode (an API key, no project): google-genai drops the project, the location and
            # every credential when a custom base URL meets a project and location from the environment (its
            # API-gateway mode, posting every call to the bare base URL), so the service-account path cannot
            # be driven; the body is built by the same Vertex code either way. google-adk does not pass
            # ``vertexai`` to the client, so the client reads the Gemini base URL variable, not the Vertex one.
            name="gemini_vertex_ai",
            type="gemini_vertex_ai",
            protocol="gemini_vertex",
            releases=_BOTH,
            errors="exception",
            model_name="gemini-2.5-flash",
            variables=lambda p: {
                **_GOOGLE_UNSET,
                "GOOGLE_GENAI_USE_VERTEXAI": "true",
                "GOOGLE_API_KEY": "loopback",
                "GOOGLE_GEMINI_BASE_URL": p.url,
            },
        ),
        Adapter(
            name="gemini_anthropic",
            type="gemini_anthropic",
            protocol="anthropic_vertex",
            releases=_BOTH,
            errors="exception",
            model_name="claude-sonnet-4-6@default",
            variables=lambda p: {
                **_GOOGLE_UNSET,
                "GOOGLE_CLOUD_PROJECT": "loopback-project",
                "GOOGLE_CLOUD_LOCATION": "us-east5",
                "GOOGLE_APPLICATION_CREDENTIALS": p.service_account_file(),
                "ANTHROPIC_VERTEX_BASE_URL": f"{p.url}/v1",
                "ANTHROPIC_VERTEX_PROJECT_ID": None,
                "CLOUD_ML_REGION": None,
            },
        ),
        Adapter(
            name="bedrock",
            type="bedrock",
            protocol="bedrock",
            releases=_BOTH,
            errors="response",
            model_name="anthropic.claude-3-5-haiku-20241022-v1:0",
            variables=lambda p: {
                "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": p.url,
                "AWS_ENDPOINT_URL": None,
                "AWS_ACCESS_KEY_ID": "AKIALOOPBACK",
                "AWS_SECRET_ACCESS_KEY": "loopback",
                "AWS_SESSION_TOKEN": None,
                "AWS_PROFILE": None,
                "AWS_REGION": "us-east-1",
                "AWS_DEFAULT_REGION": "us-east-1",
                # botocore retries throttling and 5xx with backoff; one failure is one request here
                "AWS_MAX_ATTEMPTS": "1",
                "AWS_CONFIG_FILE": os.devnull,
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                "AWS_EC2_METADATA_DISABLED": "true",
            },
        ),
        Adapter(
            name="sap_ai_core",
            type="sap_ai_core",
            protocol="sap_ai_core",
            releases=_BOTH,
            errors="response",
            model_name="gpt-4o",
            settings=lambda p: {
                "base_url": f"{p.url}/sap",
                "auth_url": f"{p.url}/sap-auth",
                "resource_group": "default",
            },
            variables=lambda p: {"SAP_AI_CORE_CLIENT_ID": "loopback", "SAP_AI_CORE_CLIENT_SECRET": "loopback"},
        ),
    )
}
"""Every adapter this module drives, by name (``ADAPTERS[name].available`` for the running release)."""


def available() -> list[Adapter]:
    """The adapters the running kagent-adk release has."""
    return [adapter for adapter in ADAPTERS.values() if adapter.available]
