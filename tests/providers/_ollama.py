"""The Ollama protocol: ``POST /api/chat``, answered as one JSON object or as newline-delimited JSON."""

from __future__ import annotations

import json
from typing import Any

from ._script import Failure, Reply, View
from ._wire import Ids, Response, WireProtocol, content_text, json_response, pieces, token_counts


class Ollama(WireProtocol):
    """``POST /api/chat``: Ollama, JSON or newline-delimited JSON."""

    name = "ollama"

    def view(self, path: str, body: Any) -> View:
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        result = content_text(last.get("content")) if last.get("role") == "tool" else None
        users = [content_text(m.get("content")) for m in messages if m.get("role") == "user"]
        return View(
            protocol=self.name,
            model=body.get("model", ""),
            stream=body.get("stream", True) is not False,
            system="\n".join(content_text(m.get("content")) for m in messages if m.get("role") == "system"),
            user_text=next((t for t in reversed(users) if t), ""),
            tool_result=result,
            tool_name=(last.get("tool_name") or None) if result is not None else None,
            tools=tuple(t["function"]["name"] for t in body.get("tools") or []),
            summary=False,
        )

    def reply(self, view: View, reply: Reply, ids: Ids) -> Response:
        prompt, completion = token_counts(view, reply)
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
            return json_response(200, {**head, "message": message, "done": True, **counts})
        lines = [{**head, "message": {"role": "assistant", "content": p}, "done": False} for p in pieces(reply.text)]
        if calls:
            lines.append({**head, "message": {"role": "assistant", "content": "", "tool_calls": calls}, "done": False})
        lines.append({**head, "message": {"role": "assistant", "content": ""}, "done": True, **counts})
        chunks = tuple(json.dumps(line).encode() + b"\n" for line in lines)
        return Response(200, "application/x-ndjson", chunks, stream=True)

    def failure(self, view: View, failure: Failure) -> Response:
        if not (failure.midstream and view.stream):
            return json_response(failure.status, {"error": failure.message})
        opening = {"model": view.model, "created_at": "2026-01-01T00:00:00.000000Z", "done": False}
        lines = [{**opening, "message": {"role": "assistant", "content": ""}}, {"error": failure.message}]
        return Response(200, "application/x-ndjson", tuple(json.dumps(x).encode() + b"\n" for x in lines), stream=True)
