"""Activation on an unmodified kagent-adk 0.9.11: never upstream memory, never /api/memories (R31)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING
from unittest import mock

import httpx
import kagent.adk._a2a as a2a
import pytest
from controller import FakeController
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from google.adk.sessions import InMemorySessionService
from kagent.adk import AgentConfig
from support import pod_environment, serve, wait_for_health

import kagent_memory_governed
from kagent_memory_governed.adk.integration import upstream_has_extensions
from kagent_memory_governed.adk.service import GovernedMemoryService
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import (
    CONFIG,
    HOMESERVER,
    A2AClient,
    Bridge,
    ScriptedModel,
    build_app,
    new_context,
    reply_text,
)

if TYPE_CHECKING:
    from kagent_memory_governed import Runtime

ALICE = f"@alice:{HOMESERVER}"
BIN = Path(sys.executable).parent


def test_install_is_idempotent_and_picks_the_mode_kagent_supports(runtime: Runtime) -> None:
    assert kagent_memory_governed.install() is runtime
    assert runtime.mode == ("entry-point" if upstream_has_extensions() else "runtime-patching")
    if runtime.mode == "entry-point":
        extensions = importlib.import_module("kagent.adk.extensions")  # only with upstream patch 0001

        assert os.environ["KAGENT_ADK_EXTENSION"] == "governed"
        context = extensions.ExtensionContext(app_name="x", agent_config=None, local=True)
        service = extensions.load_extension().create_memory_service(context)
    else:
        # the name kagent's module holds once patched: the governed class, whose signature is not upstream's
        service = a2a.KagentMemoryService(embedding_config=None)  # type: ignore[attr-defined, call-arg]
    assert service is runtime.service


async def test_with_a_controller_no_request_reaches_api_memories(
    runtime: Runtime, controller: FakeController, store: Store, bridge: Bridge, monkeypatch: pytest.MonkeyPatch
) -> None:
    def upstream_memory_constructed(*args: object, **kwargs: object) -> None:
        raise AssertionError("upstream KagentMemoryService was constructed")

    monkeypatch.setattr("kagent.adk._memory_service.KagentMemoryService.__init__", upstream_memory_constructed)
    model = ScriptedModel().script(
        on_user=lambda text: (
            [("save_memory", {"content": "likes tea"}), ("load_memory", {"query": "tea"})] if "turn 0" in text else []
        ),
        summary='["the user likes tea"]',
    )
    app = build_app(model, local=False)
    grant_key = bridge.sign(time.time(), "control", op="consent")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
        consent = await http.post(
            "/memory/v1/consent",
            json={"purpose": "assist", "policy_version": "v1"},
            headers={"Authorization": f"Bearer {grant_key}"},
        )
        generation = consent.json()["generation"]
        agent, context = A2AClient(http), new_context()
        for turn in range(5):
            answer = await agent.send(
                f"Hello, turn {turn}; please remember my tea preference for later.",
                context_id=context,
                user=ALICE,
                scope=bridge.sign(time.time(), gen=generation),
            )
            assert turn or "Saved to long-term memory" in reply_text(answer)
        await runtime.service.drain()
    assert controller.memory_requests == []
    assert any(path.startswith("POST /api/sessions") for path in controller.paths)  # the controller was used
    assert len(model.summaries) == 1
    stored = [e for s in controller.sessions.values() for e in s["events"]]
    assert stored and not any("x-memory-scope" in event for event in stored)  # never persisted in a session


PROBE = """
import kagent.adk._a2a as a, kagent.adk.tools.memory_tools as t
import kagent_memory_governed.adk.runtime
runtime = kagent_memory_governed.adk.runtime.active()
if runtime is None:
    print("inactive", a.KagentMemoryService.__name__, t.SaveMemoryTool.__name__, a.Runner.__name__)
elif runtime.mode == "entry-point":
    from kagent.adk.extensions import load_extension
    print(runtime.mode, type(load_extension()).__name__, t.SaveMemoryTool.__name__, a.Runner.__name__)
else:
    print(runtime.mode, a.KagentMemoryService.__name__, t.SaveMemoryTool.__name__, a.Runner.__name__)
"""
ACTIVE = (
    ["entry-point", "GovernedMemoryExtension", "SaveMemoryTool", "Runner"]
    if upstream_has_extensions()
    else ["runtime-patching", "memory_service_factory", "GovernedSaveMemoryTool", "GovernedRunner"]
)


@pytest.mark.long
def test_the_environment_switch_activates_at_interpreter_start(
    tmp_path: Path, bridge: Bridge, database_url: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=pod_environment(tmp_path, bridge, database_url),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ACTIVE


@pytest.mark.long
def test_without_the_switch_nothing_changes(tmp_path: Path, bridge: Bridge, database_url: str) -> None:
    env = pod_environment(tmp_path, bridge, database_url, KAGENT_GOVERNED_MEMORY="off")
    result = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    assert result.stdout.split() == ["inactive", "KagentMemoryService", "SaveMemoryTool", "Runner"]


@pytest.mark.parametrize(
    "broken",
    [
        {"KAGENT_GOVERNED_MEMORY_BRIDGE_PUBLIC_KEY": ""},
        {"KAGENT_GOVERNED_MEMORY_BRIDGE_PUBLIC_KEY": "not a key"},
        {"KAGENT_GOVERNED_MEMORY_HOMESERVER": ""},
        {"KAGENT_GOVERNED_MEMORY": "yes"},
        {"KAGENT_NAME": "Not_Valid"},
    ],
)
def test_a_failed_activation_ends_the_process(
    tmp_path: Path, bridge: Bridge, database_url: str, broken: dict[str, str]
) -> None:
    env = pod_environment(tmp_path, bridge, database_url, **broken)
    result = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    assert result.returncode == 78
    assert result.stdout == "" and "activation failed" in result.stderr


def test_a_small_order_bridge_key_stops_start_up_naming_the_setting_only(
    tmp_path: Path, bridge: Bridge, database_url: str
) -> None:
    identity = Ed25519PublicKey.from_public_bytes(b"\x01" + bytes(31))  # with it, R = identity, S = 0 verifies
    pem = identity.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()
    env = pod_environment(tmp_path, bridge, database_url, KAGENT_GOVERNED_MEMORY_BRIDGE_PUBLIC_KEY=pem)
    result = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    assert result.returncode == 78
    assert result.stdout == ""
    assert result.stderr == (
        "kagent-memory-governed: activation failed: "
        "KAGENT_GOVERNED_MEMORY_BRIDGE_PUBLIC_KEY: not an Ed25519 public key (PEM) of prime order\n"
    )


@pytest.mark.long
def test_the_console_script_serves_the_real_app(
    tmp_path: Path, bridge: Bridge, database_url: str, store: Store
) -> None:
    env = pod_environment(tmp_path, bridge, database_url)
    env.pop("KAGENT_GOVERNED_MEMORY")  # the console script installs governed memory itself
    server, url = serve(tmp_path, env)
    try:
        health = wait_for_health(server, url)
        assert health is not None and health.status_code == 200
        status = httpx.get(f"{url}/memory/v1/status", timeout=5)
        assert (status.status_code, status.json()) == (401, {"error": "no_assertion"})
        token = bridge.sign(time.time(), "control", op="status")
        status = httpx.get(f"{url}/memory/v1/status", headers={"Authorization": f"Bearer {token}"}, timeout=5)
        assert status.status_code == 200 and status.json()["enabled"] is False
        oversized = httpx.post(f"{url}/memory/v1/consent", content=b"{" + b" " * 4096 + b"}", timeout=5)
        assert (oversized.status_code, oversized.json()) == (413, {"error": "body_too_large"})
        unknown = httpx.get(f"{url}/memory/v1/nothing", timeout=5)
        assert (unknown.status_code, unknown.json()) == (404, {"error": "not_found"})
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.long
def test_the_server_refuses_to_start_on_an_unmigrated_database(
    tmp_path: Path, bridge: Bridge, database_url: str, store: Store
) -> None:
    env = pod_environment(tmp_path, bridge, database_url.replace("/postgres?", "/template1?"))
    env.pop("KAGENT_GOVERNED_MEMORY")
    server, url = serve(tmp_path, env)
    try:
        output, _ = server.communicate(timeout=120)
    finally:
        server.kill()
    assert server.returncode == 78
    assert "kagent-memory-governed: not serving: schema_missing\n" in output
    assert "Traceback" not in output and "template1" not in output


def test_a_runner_built_anywhere_in_kagent_gets_the_governed_service(runtime: Runtime) -> None:
    agent = AgentConfig.model_validate(CONFIG).to_agent("helper")
    if runtime.mode == "entry-point":  # no Runner class of its own: kagent's runners get the extension's service
        # kagent's module imports A2aAgentExecutor and Runner without re-exporting them
        upstream_executor = a2a.A2aAgentExecutor  # type: ignore[attr-defined]
        with mock.patch.object(a2a, "A2aAgentExecutor", wraps=upstream_executor) as executor:
            build_app(ScriptedModel())
        runner = executor.call_args.kwargs["runner"]()
    else:
        sessions = InMemorySessionService()  # type: ignore[no-untyped-call]  # google-adk's __init__ has no "-> None"
        runner = a2a.Runner(app_name="helper", agent=agent, session_service=sessions)  # type: ignore[attr-defined]
    assert runner.memory_service is runtime.service
    assert isinstance(runner.memory_service, GovernedMemoryService)


async def test_semantic_erasure_and_offboarding_leave_conversations_alone(
    runtime: Runtime, controller: FakeController, store: Store, bridge: Bridge
) -> None:
    """R30: off, forget-all and offboard touch governed memory only, never the agent's kagent sessions."""
    app = build_app(
        ScriptedModel().script(on_user=lambda text: [("save_memory", {"content": "likes tea"})]), local=False
    )

    def control(op: str) -> dict[str, str]:
        purpose = "offboard" if op == "offboard" else "control"
        return {"Authorization": f"Bearer {bridge.sign(time.time(), purpose, op=op)}"}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
        consent = await http.post(
            "/memory/v1/consent", json={"purpose": "a", "policy_version": "v1"}, headers=control("consent")
        )
        scope = bridge.sign(time.time(), gen=consent.json()["generation"])
        await A2AClient(http).send("remember this", context_id=new_context(), user=ALICE, scope=scope)
        sessions_before = {sid: len(s["events"]) for sid, s in controller.sessions.items()}
        for op in ("forget-all", "off"):
            erased = await http.post(f"/memory/v1/{op}", json={"confirm": True}, headers=control(op))
            assert erased.json()["verified"] is True
        offboard = await http.post("/memory/v1/offboard", json={"confirm": True}, headers=control("offboard"))
        assert offboard.json()["verified"] is True
    assert sessions_before and {sid: len(s["events"]) for sid, s in controller.sessions.items()} == sessions_before
    assert not [path for path in controller.paths if path.startswith("DELETE")]


@pytest.mark.long
def test_an_agents_ttl_days_reaches_the_store_when_kagent_builds_the_app(
    tmp_path: Path, bridge: Bridge, database_url: str, store: Store
) -> None:
    """In a process of its own: the runtime's store is the process's, so the lowered ceiling must not leak."""
    script = (
        "import json, sys, time\n"
        "import kagent_memory_governed\n"
        "from kagent_memory_governed.testing import CONFIG, ScriptedModel, build_app\n"
        "runtime = kagent_memory_governed.install()\n"
        "build_app(ScriptedModel(), config={**CONFIG, 'memory': {**CONFIG['memory'], 'ttl_days': 2}})\n"
        "print(runtime.store.policy.max_expiry_seconds)\n"
    )
    env = pod_environment(tmp_path, bridge, database_url)
    env.pop("KAGENT_GOVERNED_MEMORY")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == str(2 * 24 * 3600)
