"""The OpenAI-compatible protocols: Chat Completions (OpenAI, and Azure OpenAI's deployment routes), the
Responses API, and the embeddings API the agent's memory embeds with."""

from __future__ import annotations

import itertools
import json
from typing import Any
from urllib.parse import unquote, urlsplit

from kagent_memory_governed.testing import embed

from ._script import Failure, Reply, ToolCall, View
from ._wire import (
    CREATED,
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


def openai_messages_view(
    protocol: str, model: str, stream: bool, messages: list[dict[str, Any]], tools: list[str]
) -> View:
    """The view of an OpenAI-style ``messages`` list (Chat Completions, and SAP's orchestration templates)."""
    names = {c.get("id"): c["function"]["name"] for m in messages for c in m.get("tool_calls") or []}
    last = messages[-1] if messages else {}
    result = content_text(last.get("content")) if last.get("role") == "tool" else None
    users = [content_text(m.get("content")) for m in messages if m.get("role") == "user"]
    return View(
        protocol=protocol,
        model=model,
        stream=stream,
        system="\n".join(content_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer")),
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


def _openai_failure(failure: Failure) -> Response:
    return json_response(
        failure.status, {"error": _openai_error(failure)}, ("x-should-retry", str(failure.retry).lower())
    )


def _openai_tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.args)}} for c in calls
    ]


class OpenAIChat(WireProtocol):
    """``POST /v1/chat/completions`` (OpenAI) and ``/openai/deployments/<d>/chat/completions`` (Azure)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def view(self, path: str, body: Any) -> View:
        model = body.get("model", "")
        if self.name == "azure_openai":
            model = unquote(urlsplit(path).path.split("/openai/deployments/", 1)[1].split("/", 1)[0])
        tools = [t["function"]["name"] for t in body.get("tools") or []]
        return openai_messages_view(self.name, model, bool(body.get("stream")), body.get("messages") or [], tools)

    def reply(self, view: View, reply: Reply, ids: Ids) -> Response:
        calls = identified_calls(reply, ids, "call_")
        prompt, completion = token_counts(view, reply)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        finish = "tool_calls" if calls else "stop"
        head = {"id": ids("chatcmpl-"), "created": CREATED, "model": view.model, "system_fingerprint": None}
        if not view.stream:
            message: dict[str, Any] = {"role": "assistant", "content": reply.text or None, "refusal": None}
            if calls:
                message["tool_calls"] = _openai_tool_calls(calls)
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            return json_response(200, {**head, "object": "chat.completion", "choices": [choice], "usage": usage})

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> tuple[None, dict[str, Any]]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return None, {**head, "object": "chat.completion.chunk", "choices": [choice]}

        events = [chunk({"role": "assistant", "content": "", "refusal": None})]
        events += [chunk({"content": piece}) for piece in pieces(reply.text)]
        for index, call in enumerate(calls):
            opening = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name}}
            events.append(chunk({"tool_calls": [{**opening, "function": {"name": call.name, "arguments": ""}}]}))
            for piece in pieces(json.dumps(call.args)):
                events.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
        events.append(chunk({}, finish))
        events.append((None, {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}))
        return sse_response(events, done=True)

    def failure(self, view: View, failure: Failure) -> Response:
        if not (failure.midstream and view.stream):
            return _openai_failure(failure)
        head = {"id": "chatcmpl-failed", "object": "chat.completion.chunk", "created": CREATED, "model": view.model}
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return sse_response([(None, {**head, "choices": [choice]}), (None, {"error": _openai_error(failure)})])


class OpenAIResponses(WireProtocol):
    """``POST /v1/responses``: the OpenAI Responses API, JSON or typed SSE events."""

    name = "openai_responses"

    def view(self, path: str, body: Any) -> View:
        items = body.get("input") or []
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items
        names = {i.get("call_id"): i.get("name") for i in items if i.get("type") == "function_call"}
        last = items[-1] if items else {}
        result = content_text(last.get("output")) if last.get("type") == "function_call_output" else None
        users = [content_text(i.get("content")) for i in items if i.get("role") == "user"]
        systems = [content_text(i.get("content")) for i in items if i.get("role") in ("system", "developer")]
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

    def reply(self, view: View, reply: Reply, ids: Ids) -> Response:
        calls = identified_calls(reply, ids, "call_")
        prompt, completion = token_counts(view, reply)
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        }
        output: list[dict[str, Any]] = []
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
            "created_at": CREATED,
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
            return json_response(200, response)

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
                for piece in pieces(reply.text):
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
                for piece in pieces(item["arguments"]):
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
        return sse_response(events)

    def failure(self, view: View, failure: Failure) -> Response:
        if not (failure.midstream and view.stream):
            return _openai_failure(failure)
        response = {
            "id": "resp_failed",
            "object": "response",
            "created_at": CREATED,
            "model": view.model,
            "output": [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
        error = {"code": failure.code or "server_error", "message": failure.message}
        return sse_response(
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


def embeddings_response(body: Any) -> Response:
    """``POST /v1/embeddings``: each input embedded by ``testing.embed``, as the agent's memory embeds."""
    data = [{"object": "embedding", "index": i, "embedding": embed(t)} for i, t in enumerate(body["input"])]
    usage = {"prompt_tokens": 0, "total_tokens": 0}
    return json_response(200, {"object": "list", "data": data, "usage": usage})
