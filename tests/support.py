"""Helpers the tests share: keys, facts, refusals, private directories, a pod's environment and a served agent."""

from __future__ import annotations

import atexit
import importlib.util
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.keys import LocalKeyStore
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import AgentId, ControlRoom, Origin, Principal, ScopeKey
from kagent_memory_governed.store import NewFact, Store
from kagent_memory_governed.testing import HOMESERVER, ISSUER, Bridge, embed

ROOT = Path(__file__).resolve().parent.parent  # the repository
_serial = itertools.count()


COMMAND = str(Path(sys.executable).parent / "kagent-memory-governed")
KEY_STORE = "KAGENT_GOVERNED_MEMORY_KEY_STORE"


def run_command(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``kagent-memory-governed ARGS`` in a process of its own: only ``env`` of this package's settings reach it."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KAGENT_GOVERNED_MEMORY")}
    url = env.get("KAGENT_GOVERNED_MEMORY_DATABASE_URL")
    keys = {KEY_STORE: f"file://{key_store_of(url)}"} if url else {}  # that database's; else the embedded default's
    return subprocess.run([COMMAND, *args], env={**clean, **keys, **env}, capture_output=True, text=True, timeout=300)


def private_directory(prefix: str) -> Path:
    """A directory outside pytest's temporary tree, which other pytest sessions of this user may clean up
    while a server still runs in it; removed when this process exits."""
    path = Path(tempfile.mkdtemp(prefix=f"kagent-memory-governed-{prefix}-"))
    atexit.register(shutil.rmtree, path, True)
    return path


_KEY_STORES: dict[str, Path] = {}


def key_store_of(url: str) -> Path:
    """The directory of the embedded key store of the database ``url`` names (one for each database this process
    makes, whoever connects to it): a key store serves the one database it is bound to (``store/binding.py``)."""
    name = _database_of(url)
    if name not in _KEY_STORES:
        _KEY_STORES[name] = private_directory("keys")
    return _KEY_STORES[name]


def bound_to(url: str, directory: Path) -> None:
    """The database ``url`` names keeps its keys in the embedded key store at ``directory``."""
    _KEY_STORES[_database_of(url)] = directory


def dropped(url: str) -> None:
    """The database ``url`` names was dropped: one made again under its name is another database."""
    _KEY_STORES.pop(_database_of(url), None)


def _database_of(url: str) -> str:
    from sqlalchemy.engine import make_url

    database = make_url(url)
    return f"{database.host or database.query.get('host')}/{database.port}/{database.database}"


def keys_of(url: str) -> LocalKeyStore:
    """``key_store_of(url)``'s key store, for ``Store.connect(url, ..., keys=keys_of(url))``."""
    return LocalKeyStore(key_store_of(url))


async def migrate(url: str) -> None:
    """Migrate the database at ``url`` to head, with its own key store."""
    store = Store.connect(url, Policy(), keys=keys_of(url))
    try:
        await store.migrate()
    finally:
        await store.close()


def make_key(
    user: str = "alice", *, origin: Origin = Origin.NATIVE, agent: str = "kagent/helper", room: str | None = None
) -> ScopeKey:
    return ScopeKey(
        Principal.parse(f"@{user}:example.org", origin.value),
        AgentId.parse(agent),
        ControlRoom.parse(room or f"!room{next(_serial)}:example.org"),
    )


def facts(*texts: str) -> list[NewFact]:
    return [NewFact(text, embed(text)) for text in texts]


async def refusal(work: Awaitable[object]) -> Reason:
    """The reason code ``work`` was refused with; fails the test if it was admitted."""
    with pytest.raises(GovernedMemoryError) as refused:
        await work
    assert str(refused.value) == refused.value.reason.value  # the code is the whole message
    return refused.value.reason


def pod_environment(tmp_path: Path, bridge: Bridge, database_url: str, **extra: str) -> dict[str, str]:
    """The environment of an agent pod trusting ``bridge``: activation on, the key mounted as a file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAGENT_GOVERNED_MEMORY")}
    key = tmp_path / "bridge.pem"
    key.write_text(bridge.public_pem)
    env.update(
        KAGENT_GOVERNED_MEMORY="on",
        KAGENT_GOVERNED_MEMORY_DATABASE_URL=database_url,
        KAGENT_GOVERNED_MEMORY_BRIDGE_PUBLIC_KEY=f"@{key}",
        KAGENT_GOVERNED_MEMORY_KEY_STORE=f"file://{key_store_of(database_url)}",  # a pod names its database's
        KAGENT_GOVERNED_MEMORY_BRIDGE_ISSUER=ISSUER,
        KAGENT_GOVERNED_MEMORY_HOMESERVER=HOMESERVER,
        KAGENT_URL="http://controller.invalid",
        KAGENT_NAMESPACE="kagent",
        KAGENT_NAME="helper",
    )
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]  # an AF_INET address: (host, port)
        return port


def serve(
    tmp_path: Path,
    env: dict[str, str],
    *,
    config: dict[str, Any] | None = None,
    card: dict[str, Any] | None = None,
    log: Path | None = None,
) -> tuple[subprocess.Popen[str], str]:
    """``kagent-memory-governed static`` (upstream's server, governed) on a free loopback port, serving the
    agent of ``config`` (default ``CONFIG``); its stdout and stderr go to a pipe, or to the file ``log``
    (a pipe that nobody reads would stall a server that logs much)."""
    from kagent_memory_governed.testing import CARD, CONFIG  # with kagent-adk: only where an agent is served

    directory = tmp_path / "config"
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config or CONFIG))
    (directory / "agent-card.json").write_text(json.dumps(card or CARD))
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "kagent-memory-governed"),
        "static",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--filepath",
        str(directory),
    ]
    output = log.open("w") if log is not None else subprocess.PIPE
    server = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, text=True)
    return server, f"http://127.0.0.1:{port}"


def wait_for_health(server: subprocess.Popen[str], url: str) -> httpx.Response | None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and server.poll() is None:
        try:
            return httpx.get(f"{url}/health", timeout=1)
        except httpx.TransportError:
            time.sleep(0.2)  # waiting for a real server to listen; no clock-dependent behaviour is tested
    return None


def benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module, loaded once (dataclasses resolve annotations through sys.modules)."""
    module_name = f"benchmarks_{name}"
    if module_name not in sys.modules:
        path = ROOT / "benchmarks" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None, path
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]
