"""SAP AI Core: its deployment listing (``GET .../v2/lm/deployments``) and its orchestration service
(``POST <deploymentUrl>/v2/completion``), which wraps OpenAI chat messages and completions in its own
envelope."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from ._openai import OpenAIChat, openai_messages_view
from ._script import Failure, Reply, View
from ._wire import Ids, Response, WireProtocol, json_response, sse_response


def deployments_response(url: str, path: str) -> Response:
    """The listing of one running orchestration deployment, served by the provider at ``url``."""
    base = urlsplit(path).path.removesuffix("/v2/lm/deployments")
    deployment = {
        "id": "dloopback",
        "deploymentUrl": f"{url}{base}/v2/inference/deployments/dloopback",
        "configurationId": "loopback",
        "scenarioId": "orchestration",
        "status": "RUNNING",
        "createdAt": "2026-01-01T00:00:00Z",
    }
    return json_response(200, {"count": 1, "resources": [deployment]})


class SAPOrchestration(WireProtocol):
    """``POST <deploymentUrl>/v2/completion``: SAP AI Core's orchestration service, JSON or SSE."""

    name = "sap_ai_core"

    def view(self, path: str, body: Any) -> View:
        templating = body["config"]["modules"]["prompt_templating"]
        prompt = templating.get("prompt") or {}
        tools = [t["function"]["name"] for t in prompt.get("tools") or []]
        stream = bool((body["config"].get("stream") or {}).get("enabled"))
        return openai_messages_view(self.name, templating["model"]["name"], stream, prompt.get("template") or [], tools)

    def reply(self, view: View, reply: Reply, ids: Ids) -> Response:
        chat = OpenAIChat("openai").reply(view, reply, ids)
        request_id = ids("loopback-request-")
        if not view.stream:
            final = json.loads(chat.chunks[0])
            return json_response(200, {"request_id": request_id, "intermediate_results": {}, "final_result": final})
        events: list[tuple[str | None, Any]] = []
        for chunk in chat.chunks:
            data = chunk.decode().removeprefix("data: ").strip()
            if data != "[DONE]":
                events.append(
                    (None, {"request_id": request_id, "intermediate_results": {}, "final_result": json.loads(data)})
                )
        return sse_response(events, done=True)

    def failure(self, view: View, failure: Failure) -> Response:
        error = {
            "request_id": "loopback-error",
            "code": failure.status,
            "message": failure.message,
            "location": failure.code or "LLM Module",
            "intermediate_results": {},
        }
        if failure.midstream and view.stream:
            return sse_response([(None, {"error": error})])
        return json_response(failure.status, {"error": error})
