"""A real server's log is whole and content-free (R16, R40): ``kagent-memory-governed static`` as a process,
with kagent's own logging set-up and uvicorn's access log, its model and embeddings behind a loopback
provider and its controller on a loopback port, through a governed lifecycle. Its output, as the
formatters wrote it, holds no logging error, one access line per request, and nothing remembered.

In remote mode (``KAGENT_GOVERNED_MEMORY_TEST_SERVICE=on``) the agent server holds no database or key-store
setting and reaches memory through the suite's memory service (``serve``, a process too), which the bridge's
control calls reach; the service's own output is held to the same: nothing remembered, no traceback."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from controller import FakeController, listening
from providers import Provider, ToolCall, View
from service import REMOTE, Service
from support import pod_environment, serve, wait_for_health

from kagent_memory_governed.testing import CARD, CONFIG, HOMESERVER, Bridge

if TYPE_CHECKING:
    from kagent_memory_governed.store import Store

ALICE = f"@alice:{HOMESERVER}"
FACT = "my locker code is SENTINEL-LOCKER-4711"
QUESTION = "What is my locker code, the locker code I told you about?"
ACCESS = re.compile(r'"(GET|POST|DELETE) (\S+) HTTP/1\.1" (\d{3})')


def script(view: View) -> str | ToolCall:
    if view.tool_result is not None:
        return "Done."
    if view.user_text.startswith("remember"):
        return ToolCall("save_memory", {"content": FACT})
    if view.user_text.endswith("?"):
        return ToolCall("load_memory", {"query": "locker code"})
    return "ok"


def message(method: str, text: str, context: str) -> dict[str, Any]:
    parts = [{"kind": "text", "text": text}]
    payload = {"kind": "message", "role": "user", "messageId": uuid.uuid4().hex, "contextId": context, "parts": parts}
    return {"jsonrpc": "2.0", "id": uuid.uuid4().hex, "method": method, "params": {"message": payload}}


def remote_environment(env: dict[str, str], service: Service, token: Path) -> dict[str, str]:
    """An agent pod's environment in remote mode: the service's URL and its projected token, no credential."""
    held = ("DATABASE_URL", "KEY_STORE")
    env = {name: value for name, value in env.items() if name.removeprefix("KAGENT_GOVERNED_MEMORY_") not in held}
    return env | {
        "KAGENT_GOVERNED_MEMORY_SERVICE_URL": service.data,
        "KAGENT_GOVERNED_MEMORY_SERVICE_TOKEN": str(token),
    }


@pytest.mark.long
def test_a_served_lifecycle_logs_one_access_line_a_request_no_logging_error_and_nothing_remembered(
    tmp_path: Path, bridge: Bridge, database_url: str, store: Store, request: pytest.FixtureRequest
) -> None:
    service: Service | None = request.getfixturevalue("memory_service") if REMOTE else None
    fake = FakeController()
    with Provider(script) as provider, listening(fake) as controller_url:
        model = {"type": "openai", "model": "gpt-4o-mini", "base_url": f"{provider.url}/v1"}
        embedding = {"provider": "openai", "model": "text-embedding-3-small", "base_url": f"{provider.url}/v1"}
        config = {**CONFIG, "model": model, "memory": {"ttl_days": 7, "embedding": embedding}}
        env = pod_environment(tmp_path, bridge, database_url, KAGENT_URL=controller_url, OPENAI_API_KEY="test-key")
        env.pop("KAGENT_GOVERNED_MEMORY")  # the console script installs governed memory itself
        if service is not None:
            env = remote_environment(env, service, request.getfixturevalue("pod_token"))
            served_from = service.log.stat().st_size
        log = tmp_path / "server.log"
        server, url = serve(tmp_path, env, config=config, card={**CARD, "capabilities": {"streaming": True}}, log=log)
        sent: list[tuple[str, str, int]] = []
        try:
            assert wait_for_health(server, url) is not None
            control_url = service.control if service is not None else url
            with httpx.Client(base_url=url, timeout=60) as http, httpx.Client(base_url=control_url) as bridged:

                def call(method: str, path: str, expected: int = 200, **kwargs: Any) -> httpx.Response:
                    answer = http.request(method, path, **kwargs)
                    assert answer.status_code == expected, answer.text
                    sent.append((method, path, expected))
                    return answer

                def control(method: str, path: str, op: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
                    headers = {"Authorization": f"Bearer {bridge.sign(time.time(), 'control', op=op)}"}
                    answered: dict[str, Any]
                    if service is None:  # the agent serves the control API: its access log has each call
                        answered = call(method, path, json=body, headers=headers).json()
                        return answered
                    answer = bridged.request(method, path, json=body, headers=headers)  # the service serves it
                    assert answer.status_code == 200, answer.text
                    answered = answer.json()
                    return answered

                def say(text: str, context: str, *, header: bool = True, stream: bool = False) -> str:
                    headers = {"X-User-Id": ALICE}
                    if header:
                        headers["X-Memory-Scope"] = bridge.sign(time.time(), gen=generation)
                    method = "message/stream" if stream else "message/send"
                    return call("POST", "/", json=message(method, text, context), headers=headers).text

                generation = control("POST", "/memory/v1/consent", "consent", {"purpose": "a", "policy_version": "1"})[
                    "generation"
                ]
                first = uuid.uuid4().hex
                say("remember my locker code, please", first)  # the model's save_memory call holds the fact:
                saved = len(fake.bodies)  # the conversation, kept by kagent (docs/privacy.md); recalls are not
                say("hello without a header", first, header=False)
                say(QUESTION, uuid.uuid4().hex)  # a new session: prefetch, then load_memory
                say(QUESTION, uuid.uuid4().hex, stream=True)
                for text in ("a", "b", "c"):
                    say(text, first)  # five admitted turns: auto-save summarizes in the background
                control("GET", "/memory/v1/status", "status")
                [entry] = control("GET", "/memory/v1/entries?limit=5", "entries")["entries"]
                generation = control("DELETE", f"/memory/v1/entries/{entry['id']}", "forget")["generation"]
                call("GET", "/memory/v1/no-such-route", 404)
                call("GET", "/.well-known/agent-card.json")
        finally:
            server.terminate()
            server.wait(timeout=60)
        output = log.read_text()
    assert provider.received("SENTINEL-LOCKER-4711", kind="chat")  # recall reached the model
    assert "--- Logging error ---" not in output and "Traceback" not in output
    access = [(m.group(1), m.group(2), int(m.group(3))) for m in ACCESS.finditer(output)]
    served = [line for line in access if line[1] != "/health"]  # wait_for_health's own polls
    assert served == sent  # one access line per request, in order
    assert "SENTINEL" not in output and "locker" not in output
    assert not fake.received("SENTINEL-LOCKER-4711", since=saved)
    assert json.dumps(FACT) not in output
    if service is not None:  # what the service wrote meanwhile: nothing remembered, no traceback
        with service.log.open() as served_log:
            served_log.seek(served_from)
            theirs = served_log.read()
        assert "SENTINEL" not in theirs and "locker" not in theirs and "Traceback" not in theirs
        # and ``served == sent`` above: none of the bridge's calls reached the agent pod
