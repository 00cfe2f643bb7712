"""The Bedrock Converse protocol: ``converse`` answered in JSON, ``converse-stream`` in AWS event-stream binary
frames, errors as botocore reads them (``x-amzn-ErrorType``, or the stream's exception member)."""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from ._script import Failure, Reply, View
from ._wire import Ids, Response, WireProtocol, content_text, identified_calls, json_response, pieces, token_counts


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


class BedrockConverse(WireProtocol):
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
        users = [content_text(m.get("content")) for m in messages if m.get("role") == "user"]
        tools = (body.get("toolConfig") or {}).get("tools") or []
        return View(
            protocol=self.name,
            model=unquote(route.split("/model/", 1)[1].rsplit("/", 1)[0]),
            stream=route.endswith("/converse-stream"),
            system=content_text(body.get("system")),
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

    def reply(self, view: View, reply: Reply, ids: Ids) -> Response:
        calls = identified_calls(reply, ids, "tooluse_loopback_")
        prompt, completion = token_counts(view, reply)
        usage = {"inputTokens": prompt, "outputTokens": completion, "totalTokens": prompt + completion}
        stop = "tool_use" if calls else "end_turn"
        request_id = ("x-amzn-RequestId", ids("loopback-request-"))
        if not view.stream:
            blocks: list[dict[str, Any]] = [{"text": reply.text}] if reply.text else []
            blocks += [{"toolUse": {"toolUseId": c.id, "name": c.name, "input": dict(c.args)}} for c in calls]
            body = {
                "output": {"message": {"role": "assistant", "content": blocks}},
                "stopReason": stop,
                "usage": usage,
                "metrics": {"latencyMs": 1},
            }
            return json_response(200, body, request_id)
        events: list[tuple[str, dict[str, Any]]] = [("messageStart", {"role": "assistant"})]
        index = 0
        if reply.text:
            events += [
                ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": p}}) for p in pieces(reply.text)
            ]
            events.append(("contentBlockStop", {"contentBlockIndex": 0}))
            index = 1
        for offset, call in enumerate(calls, start=index):
            start = {"toolUse": {"toolUseId": call.id, "name": call.name}}
            events.append(("contentBlockStart", {"contentBlockIndex": offset, "start": start}))
            for piece in pieces(json.dumps(call.args)):
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
        return Response(200, "application/vnd.amazon.eventstream", chunks, (request_id,), stream=True)

    def failure(self, view: View, failure: Failure) -> Response:
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
            return Response(200, "application/vnd.amazon.eventstream", chunks, stream=True)
        error_type = ("x-amzn-ErrorType", f"{code}:http://internal.amazon.com/coral/com.amazon.bedrock/")
        return Response(
            failure.status, "application/json", (payload,), (error_type, ("x-amzn-RequestId", "loopback-error"))
        )
