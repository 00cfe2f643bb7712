"""Google's protocols: ``generateContent`` and ``streamGenerateContent`` (the Gemini API, and Gemini on
Vertex AI), and Google's error envelope, which Claude on Vertex AI answers with too."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote, urlsplit

from ._script import Failure, Reply, View
from ._wire import Ids, Response, WireProtocol, json_response, pieces, sse_response, token_counts

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


def google_error(failure: Failure) -> dict[str, Any]:
    """The body of a Google API error: the HTTP status, the message, and the canonical status name."""
    status = failure.code or _GOOGLE_STATUSES.get(failure.status, "UNKNOWN")
    return {"error": {"code": failure.status, "message": failure.message, "status": status}}


def google_failure(failure: Failure, *headers: tuple[str, str]) -> Response:
    """A Google API error answered whole, with its HTTP status."""
    return json_response(failure.status, google_error(failure), *headers)


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


class Gemini(WireProtocol):
    """``POST .../models/<m>:generateContent`` and ``:streamGenerateContent?alt=sse``: the Gemini API and
    Gemini on Vertex AI."""

    def __init__(self, name: str) -> None:
        self.name = name

    def view(self, path: str, body: Any) -> View:
        return _gemini_view(self.name, path, body)

    def reply(self, view: View, reply: Reply, ids: Ids) -> Response:
        prompt, completion = token_counts(view, reply)
        usage = {"promptTokenCount": prompt, "candidatesTokenCount": completion, "totalTokenCount": prompt + completion}
        calls = [
            {"functionCall": {**({"id": c.id} if c.id else {}), "name": c.name, "args": dict(c.args)}}
            for c in reply.calls
        ]
        head = {"modelVersion": view.model, "responseId": ids("loopback-")}

        def candidate(parts: list[dict[str, Any]], finish: bool) -> dict[str, Any]:
            content = {"role": "model", "parts": parts}
            return {"content": content, "index": 0, **({"finishReason": "STOP"} if finish else {})}

        if not view.stream:
            parts = ([{"text": reply.text}] if reply.text else []) + calls
            return json_response(200, {"candidates": [candidate(parts, True)], "usageMetadata": usage, **head})
        chunks: list[tuple[str | None, Any]] = [
            (None, {"candidates": [candidate([{"text": p}], False)], **head}) for p in pieces(reply.text)
        ]
        if calls:
            chunks.append((None, {"candidates": [candidate(calls, False)], **head}))
        last: dict[str, Any] = chunks.pop()[1] if chunks else {"candidates": [candidate([{"text": ""}], False)], **head}
        chunks.append(
            (None, {**last, "candidates": [{**last["candidates"][0], "finishReason": "STOP"}], "usageMetadata": usage})
        )
        return sse_response(chunks, separator="\r\n\r\n")

    def failure(self, view: View, failure: Failure) -> Response:
        if failure.midstream and view.stream:
            return sse_response([(None, google_error(failure))], separator="\r\n\r\n")
        return google_failure(failure)
