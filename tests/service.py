"""The governed memory service as the tests run it: ``kagent-memory-governed serve`` as a real process over the
suite's PostgreSQL and key store, agents named by projected service-account tokens that ``cluster.py``'s API server
keys sign, as a cluster would (tests/core/test_serve.py, and the runtime suites in remote mode)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from cluster import AUDIENCE, ISSUER, Cluster, Key, claims, token
from support import COMMAND, free_port, key_store_of

from kagent_memory_governed.testing import Bridge, openai_compatible_url
from kagent_memory_governed.testing.bridge import HOMESERVER
from kagent_memory_governed.testing.bridge import ISSUER as BRIDGE

HELPER, OTHER = "kagent/helper", "kagent/other"
MODEL = "local-hash-768"  # the service's embedding model in the tests: testing.embedder's, served over HTTP
PREFIX = "KAGENT_GOVERNED_MEMORY_"
# the switch of the runtime suites' remote mode (tests/conftest.py): the runtime reaches memory through a service
REMOTE = os.environ.get("KAGENT_GOVERNED_MEMORY_TEST_SERVICE", "").lower() == "on"


@dataclass
class Service:
    process: subprocess.Popen[bytes]
    control: str  # the control API's base URL (the bridge's)
    data: str  # the data plane's URL (the runtimes')
    log: Path
    env: dict[str, str]


def environment(directory: Path, bridge: Bridge, database_url: str, kube: Cluster, **extra: str) -> dict[str, str]:
    """The service's environment: the database, its key store, the bridge's key, loopback addresses, the cluster."""
    (directory / "bridge.pem").write_text(bridge.public_pem)
    (directory / "own-token").write_text("SENTINEL-the-services-own-token\n")
    # every agent's embedding model: the deterministic embedder over the OpenAI wire, on loopback
    table = {"*": {"url": openai_compatible_url(), "model": MODEL}}
    (directory / "embeddings.json").write_text(json.dumps(table))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAGENT_GOVERNED_MEMORY") and k != "KAGENT_NAME"}
    settings = {
        "DATABASE_URL": database_url,
        "KEY_STORE": f"file://{key_store_of(database_url)}",
        "BRIDGE_PUBLIC_KEY": f"@{directory / 'bridge.pem'}",
        "BRIDGE_ISSUER": BRIDGE,
        "HOMESERVER": HOMESERVER,
        "DATA_PLANE_ADDRESS": f"127.0.0.1:{free_port()}",
        "CONTROL_ADDRESS": f"127.0.0.1:{free_port()}",
        "IDENTITY_ISSUER": ISSUER,
        "IDENTITY_API_SERVER": kube.url,
        "IDENTITY_CA": str(kube.ca),
        "IDENTITY_TOKEN": str(directory / "own-token"),
        "IDENTITY_AGENTS": f"{HELPER}={HELPER},{OTHER}={OTHER}",
        "EMBEDDINGS": str(directory / "embeddings.json"),
    }
    return env | {PREFIX + name: value for name, value in settings.items()} | extra


def start(env: dict[str, str], log: Path, command: str = COMMAND) -> Service:
    """``serve`` with ``env`` (``command``: this release's console script, or another release's), once its control
    API answers ready (polled, with a deadline)."""
    with log.open("w") as output:
        process = subprocess.Popen([command, "serve"], env=env, stdout=output, stderr=subprocess.STDOUT)
    control = f"http://{env[PREFIX + 'CONTROL_ADDRESS']}"
    deadline = time.monotonic() + 60
    while True:  # a process coming up
        assert process.poll() is None, log.read_text()
        try:
            if httpx.get(f"{control}/memory/ready", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    return Service(process, control, f"http://{env[PREFIX + 'DATA_PLANE_ADDRESS']}", log, env)


def stop(service: Service) -> None:
    service.process.terminate()
    assert service.process.wait(timeout=30) == 0, service.log.read_text()


@contextmanager
def running(directory: Path, bridge: Bridge, database_url: str, kube: Cluster, **extra: str) -> Iterator[Service]:
    service = start(environment(directory, bridge, database_url, kube, **extra), directory / "serve.log")
    try:
        yield service
    finally:
        stop(service)


def projected(directory: Path, key: Key, agent: str = HELPER) -> Path:
    """An agent pod's projected service-account token of the service's audience (``expirationSeconds: 600``)."""
    path = directory / f"projected-{uuid.uuid4().hex}"
    write_projected(path, key, agent)
    return path


def write_projected(path: Path, key: Key, agent: str = HELPER) -> None:
    namespace, account = agent.split("/")
    now = time.time()
    body = claims(namespace, account, aud=[AUDIENCE], iat=int(now), nbf=int(now), exp=int(now) + 600)
    path.write_text(token(key, body) + "\n")


@contextmanager
def rotated(path: Path, key: Key, agent: str = HELPER, every: float = 240.0) -> Iterator[Path]:
    """The token at ``path``, written again every ``every`` seconds of real time, as the kubelet rotates it (at 80%
    of its life; sooner here) while a session outlives one token."""
    write_projected(path, key, agent)
    done = threading.Event()

    def rotate() -> None:
        while not done.wait(every):
            write_projected(path, key, agent)

    thread = threading.Thread(target=rotate, daemon=True, name="kubelet-token-rotation")
    thread.start()
    try:
        yield path
    finally:
        done.set()
        thread.join()
