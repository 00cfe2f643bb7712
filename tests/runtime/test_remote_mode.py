"""Remote mode (#35, R43): with ``KAGENT_GOVERNED_MEMORY_SERVICE_URL`` an agent runtime reaches memory through the
memory service only and holds no database or key-store setting; inside a pod the in-process store needs its opt-in.

Real parts: the activation switch and the console script as processes, ``doctor``, and the suite's memory service
(``serve``, a process of its own over the suite's PostgreSQL and key store)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from controller import FakeController, listening
from providers import Provider, ToolCall, View
from service import Service, environment, start, stop
from support import pod_environment, serve, wait_for_health

from kagent_memory_governed.adk import request
from kagent_memory_governed.adk.service import AUTOSAVE_MIN_TOKEN_SECONDS, GovernedMemoryService
from kagent_memory_governed.service.remote import RemoteStore
from kagent_memory_governed.service.wire import RECONNECT_BACKOFF_MS
from kagent_memory_governed.testing import CONFIG, Bridge, ScriptedModel, new_context
from kagent_memory_governed.testing.bridge import HOMESERVER

if TYPE_CHECKING:
    from cluster import Cluster, Key
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from kagent_memory_governed.store import Store

PREFIX = "KAGENT_GOVERNED_MEMORY_"
ALICE = f"@alice:{HOMESERVER}"
SENTINEL = "SENTINEL-c0ffee"
PROBE = "import kagent_memory_governed.adk.runtime as r; print(r.active().remote)"


def remote_pod(tmp_path: Path, bridge: Bridge, service: str, token: Path, **extra: str) -> dict[str, str]:
    """An agent pod's environment in remote mode, as the overlays give it: the service and its token, no credential."""
    env = pod_environment(tmp_path, bridge, "postgresql+asyncpg://unused@127.0.0.1:1/unused")
    for held in ("DATABASE_URL", "KEY_STORE"):
        del env[PREFIX + held]
    return env | {PREFIX + "SERVICE_URL": service, PREFIX + "SERVICE_TOKEN": str(token)} | extra


@pytest.mark.parametrize(
    "held",
    [
        {PREFIX + "DATABASE_URL": f"postgresql+asyncpg://governed:{SENTINEL}@db.example:5432/memory"},
        {PREFIX + "KEY_STORE": f"openbao+https://{SENTINEL}.example:8200/keys"},
        {PREFIX + "KEY_STORE_TOKEN": SENTINEL},
        {PREFIX + "KEY_STORE_CA": f"/etc/{SENTINEL}/ca.pem"},
        {PREFIX + "IN_PROCESS": "true"},
    ],
    ids=["database-url", "key-store", "key-store-token", "key-store-ca", "in-process"],
)
def test_with_the_service_url_a_credential_stops_start_up_naming_the_setting_only(
    tmp_path: Path, bridge: Bridge, held: dict[str, str]
) -> None:
    env = remote_pod(tmp_path, bridge, "http://127.0.0.1:1", tmp_path / "token")
    result = subprocess.run([sys.executable, "-c", PROBE], env=env | held, capture_output=True, text=True, timeout=120)
    [name] = held
    assert result.returncode == 78 and result.stdout == ""
    assert result.stderr == (
        "kagent-memory-governed: activation failed: invalid settings: "
        f"{PREFIX}SERVICE_URL is set: the runtime holds no {name}\n"
    )


@pytest.mark.long
def test_inside_a_pod_the_in_process_store_needs_its_opt_in(
    tmp_path: Path, bridge: Bridge, database_url: str, store: Store
) -> None:
    env = pod_environment(tmp_path, bridge, database_url, KUBERNETES_SERVICE_HOST="10.0.0.1")
    refused = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 78 and refused.stdout == ""
    assert refused.stderr == (
        f"kagent-memory-governed: activation failed: {PREFIX}SERVICE_URL is not set; inside a Kubernetes pod the"
        f" in-process store, which holds every scope's credentials, is used only with {PREFIX}IN_PROCESS=true\n"
    )
    env[PREFIX + "IN_PROCESS"] = "true"
    opted = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert (opted.returncode, opted.stdout) == (0, "False\n"), opted.stderr


@pytest.mark.long
def test_remote_activation_holds_no_credential_and_doctor_names_the_mode(
    tmp_path: Path, bridge: Bridge, memory_service: Service, pod_token: Path
) -> None:
    env = remote_pod(tmp_path, bridge, memory_service.data, pod_token, KUBERNETES_SERVICE_HOST="10.0.0.1")
    active = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert (active.returncode, active.stdout) == (0, "True\n"), active.stderr
    command = [sys.executable, "-m", "kagent_memory_governed.doctor"]
    report = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stdout + report.stderr
    lines = [line.split(None, 1) for line in report.stdout.splitlines()]
    assert [name for name, _ in lines] == [
        "settings",
        "mode",
        "policy",
        "bridge_key",
        "bridge_issuer",
        "homeserver",
        "agent_identity",
        "service",
        "governed_memory_active",
    ]
    assert dict(lines)["mode"] == "ok memory service (this process holds no database or key-store credential)"
    # the service gone: its line fails with the reason, the mode line still names the mode
    unreachable = env | {PREFIX + "SERVICE_URL": "http://127.0.0.1:1"}
    report = subprocess.run(command, env=unreachable, capture_output=True, text=True, timeout=120)
    assert report.returncode == 1
    assert dict(line.split(None, 1) for line in report.stdout.splitlines())["service"].startswith(
        "FAILED service_unavailable"
    )


@pytest.mark.long
def test_a_remote_agent_serves_no_control_api_and_its_readiness_is_the_services(
    tmp_path: Path, bridge: Bridge, memory_service: Service, pod_token: Path
) -> None:
    env = remote_pod(tmp_path, bridge, memory_service.data, pod_token)
    env.pop("KAGENT_GOVERNED_MEMORY")  # the console script installs governed memory itself
    server, url = serve(tmp_path, env, log=tmp_path / "server.log")
    try:
        assert wait_for_health(server, url) is not None, (tmp_path / "server.log").read_text()
        token = {"Authorization": f"Bearer {bridge.sign(time.time(), 'control', op='status')}"}
        assert httpx.get(f"{url}/memory/v1/status", headers=token).status_code == 404  # upstream's: no such route
        assert httpx.get(f"{url}/memory/ready").json() == {"ready": True}
        assert httpx.get(f"{memory_service.control}/memory/v1/status", headers=token).status_code == 200
    finally:
        server.terminate()
        server.wait(timeout=60)
    log = (tmp_path / "server.log").read_text()
    assert "memory through the governed memory service; this process holds no database or key-store credential" in log


@pytest.mark.parametrize(("left", "scheduled"), [(AUTOSAVE_MIN_TOKEN_SECONDS - 10, False), (120, True)])
async def test_an_auto_save_through_the_service_starts_only_with_a_minute_of_its_token_left(
    bridge: Bridge, tmp_path: Path, left: int, scheduled: bool
) -> None:
    from google.adk.sessions import Session

    (tmp_path / "token").write_text("unused\n")
    service = GovernedMemoryService(RemoteStore.connect("http://127.0.0.1:1", token_file=tmp_path / "token"))
    now = time.time()
    scope = request.bind({"x-memory-scope": bridge.sign(now, exp=int(now) + left), "x-user-id": ALICE}, bridge.trust())
    assert scope is not None
    model = ScriptedModel()
    session = Session(id=new_context(), app_name="helper", user_id=ALICE)
    await service.add_session_to_memory(session, model)
    assert bool(service._background) is scheduled  # refused before any work: no task, no model call
    await service.drain()  # the scheduled one fails closed against the unreachable service
    assert model.chats == []


def _recalling(view: View) -> str | ToolCall:
    if view.tool_result is not None:
        return f"tool said: {view.tool_result}"
    return ToolCall("load_memory", {"query": "anything I told you"})


def _message(text: str) -> dict[str, Any]:
    parts = [{"kind": "text", "text": text}]
    payload = {
        "kind": "message",
        "role": "user",
        "messageId": uuid.uuid4().hex,
        "contextId": new_context(),
        "parts": parts,
    }
    return {"jsonrpc": "2.0", "id": uuid.uuid4().hex, "method": "message/send", "params": {"message": payload}}


@pytest.mark.long
def test_the_service_gone_mid_run_the_turn_answers_memory_free_and_readiness_says_why(
    tmp_path: Path,
    bridge: Bridge,
    database_url: str,
    store: Store,
    kube: tuple[Cluster, Key],
    pod_token: Path,
    governed_private_key: Ed25519PrivateKey,
) -> None:
    """A service killed while the agent serves: the next turn still answers (its recall refused with a reason code,
    nothing half-written), ``/memory/ready`` answers 503 ``service_unavailable``; the service back on the same
    address, memory is back without restarting the agent."""
    (tmp_path / "service").mkdir()
    env = environment(tmp_path / "service", Bridge(private_key=governed_private_key), database_url, kube[0])
    served = start(env, tmp_path / "service" / "serve.log")
    fake = FakeController()
    try:
        with Provider(_recalling) as provider, listening(fake) as controller_url:
            model = {"type": "openai", "model": "gpt-4o-mini", "base_url": f"{provider.url}/v1"}
            pod = remote_pod(tmp_path, bridge, served.data, pod_token, KAGENT_URL=controller_url, OPENAI_API_KEY="k")
            pod.pop("KAGENT_GOVERNED_MEMORY")
            server, url = serve(tmp_path, pod, config={**CONFIG, "model": model}, log=tmp_path / "server.log")
            try:
                assert wait_for_health(server, url) is not None, (tmp_path / "server.log").read_text()
                control = {"Authorization": f"Bearer {bridge.sign(time.time(), 'control', op='consent')}"}
                body = {"purpose": "assist", "policy_version": "v1"}
                granted = httpx.post(f"{served.control}/memory/v1/consent", headers=control, json=body).json()
                headers = {"X-User-Id": ALICE, "X-Memory-Scope": bridge.sign(time.time(), gen=granted["generation"])}
                with httpx.Client(base_url=url, timeout=60) as http:
                    assert http.get("/memory/ready").json() == {"ready": True}
                    served.process.kill()  # SIGKILL: no goodbye to the agent
                    served.process.wait(timeout=30)
                    reply = http.post("/", json=_message("what did I tell you?"), headers=headers)
                    assert reply.status_code == 200 and "service_unavailable" in reply.text  # the tool's refusal
                    ready = http.get("/memory/ready")
                    assert ready.status_code == 503 and ready.json()["error"] == "service_unavailable"
                    served = start(env, tmp_path / "service" / "serve-again.log")  # the same addresses
                    # the channel tries again at most 2 s apart (gRPC's own backoff would have grown past that)
                    deadline = time.monotonic() + RECONNECT_BACKOFF_MS[1] / 1000 + 1
                    while http.get("/memory/ready").status_code != 200:
                        assert time.monotonic() < deadline, "the agent never reached the service again"
                        time.sleep(0.2)  # polling a connection coming back: no clock-dependent behaviour
                    reply = http.post("/", json=_message("and now?"), headers=headers)
                    assert reply.status_code == 200 and "service_unavailable" not in reply.text
            finally:
                server.terminate()
                server.wait(timeout=60)
    finally:
        if served.process.poll() is None:
            stop(served)
    log = (tmp_path / "server.log").read_text()
    assert "Traceback" not in log and "what did I tell you" not in log
