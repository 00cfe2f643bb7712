"""The Anthropic Messages protocol, served directly (``/v1/messages``) and as Claude on Vertex AI (``rawPredict``
and ``streamRawPredict``, the same body with Google's error envelope)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote, urlsplit

from ._google import google_failure
from ._script import Failure, Reply, View
from ._wire import (
    Ids,
    Response,
    WireProtocol,
    content_text,
    identified_calls,
    json_response,
    pieces,
    sse_response,
    token_counts,
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
    last: dict[str, Any] = messages[-1] if messages else {}
    content = last.get("content")
    blocks: list[Any] = content if isinstance(content, list) else []
    results = [b for b in blocks if b.get("type") == "tool_result"]
    result = results[-1] if last.get("role") == "user" and results and blocks[-1] is results[-1] else None
    users = [
        content_text(
            [b for b in m["content"] if b.get("type") == "text"] if isinstance(m["content"], list) else m["content"]
        )
        for m in messages
        if m.get("role") == "user"
    ]
    return View(
        protocol=protocol,
        model=model,
        stream=bool(body.get("stream")),
        system=content_text(body.get("system")),
        user_text=next((t for t in reversed(users) if t), ""),
        tool_result=content_text(result.get("content")) if result is not None else None,
        tool_name=names.get(result.get("tool_use_id")) if result is not None else None,
        tools=tuple(t.get("name", "") for t in body.get("tools") or []),
        summary=False,
    )


def _anthropic_reply(view: View, reply: Reply, ids: Ids) -> Response:
    calls = identified_calls(reply, ids, "toolu_loopback_")
    prompt, completion = token_counts(view, reply)
    blocks: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": dict(c.args)} for c in calls]
    stop = "tool_use" if calls else "end_turn"
    message = {"id": ids("msg_loopback_"), "type": "message", "role": "assistant", "model": view.model}
    if not view.stream:
        usage = {"input_tokens": prompt, "output_tokens": completion}
        body = {**message, "content": blocks, "stop_reason": stop, "stop_sequence": None, "usage": usage}
        return json_response(200, body)
    opening: dict[str, Any] = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    events: list[tuple[str | None, Any]] = [
        (
            "message_start",
            {"type": "message_start", "message": {**opening, "usage": {"input_tokens": prompt, "output_tokens": 1}}},
        ),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(blocks):
        start: dict[str, Any]
        if block["type"] == "text":
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"])]
        else:
            start = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces(json.dumps(block["input"]))]
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}))
        events += [("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}) for d in deltas]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta = {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}}
    events.append(("message_delta", {**delta, "usage": {"output_tokens": completion}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return sse_response(events)


_ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


class Anthropic(WireProtocol):
    """``POST /v1/messages``: Anthropic messages, JSON or SSE events."""

    name = "anthropic"

    def view(self, path: str, body: Any) -> View:
        return _anthropic_view(self.name, body.get("model", ""), body)

    def reply(self, view: View, reply: Reply, ids: Ids) -> Response:
        return _anthropic_reply(view, reply, ids)

    def failure(self, view: View, failure: Failure) -> Response:
        if failure.midstream and view.stream:
            return _anthropic_broken_stream(view, failure)
        kind = failure.code or _ANTHROPIC_ERRORS.get(failure.status, "api_error")
        body = {"type": "error", "error": {"type": kind, "message": failure.message}, "request_id": "req_loopback"}
        return json_response(failure.status, body, ("x-should-retry", str(failure.retry).lower()))


def _anthropic_broken_stream(view: View, failure: Failure) -> Response:
    """An opened message stream, then an ``error`` event (how Anthropic reports overload mid-stream)."""
    message = {"id": "msg_failed", "type": "message", "role": "assistant", "model": view.model, "content": []}
    usage = {"input_tokens": 1, "output_tokens": 1}
    opening = {**message, "stop_reason": None, "stop_sequence": None, "usage": usage}
    error = {"type": failure.code or _ANTHROPIC_ERRORS.get(failure.status, "api_error"), "message": failure.message}
    return sse_response(
        [
            ("message_start", {"type": "message_start", "message": opening}),
            ("error", {"type": "error", "error": error}),
        ]
    )


class AnthropicVertex(WireProtocol):
    """``POST .../publishers/anthropic/models/<m>:rawPredict`` or ``:streamRawPredict``: Claude on Vertex AI."""

    name = "anthropic_vertex"

    def view(self, path: str, body: Any) -> View:
        model = urlsplit(path).path.rsplit("/models/", 1)[1].split(":", 1)[0]
        return _anthropic_view(self.name, unquote(model), body)

    def reply(self, view: View, reply: Reply, ids: Ids) -> Response:
        return _anthropic_reply(view, reply, ids)

    def failure(self, view: View, failure: Failure) -> Response:
        if failure.midstream and view.stream:
            return _anthropic_broken_stream(view, failure)
        return google_failure(failure, ("x-should-retry", str(failure.retry).lower()))
