"""The bridge's client when no answer comes (#35): the control API's server unreachable, gone mid-call, silent past
the client's timeout, or answering what is not the call's answer. Each is ``service_unavailable`` with a content-free
cause, never httpx's exception (whose text names the address), in both clients. Real sockets on loopback."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from support import free_port

from kagent_memory_governed.bridge import AsyncControlClient, ControlClient, ScopeSigner, Subject
from kagent_memory_governed.errors import GovernedMemoryError, Reason

SUBJECT = Subject("@alice:example.org", "!room:example.org")


@contextmanager
def listening(behaviour: str) -> Iterator[str]:
    """A loopback server that accepts and then ``closes`` at once, stays ``silent``, or answers ``garbage``: a 200
    whose JSON is not the call's answer."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    done = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        server.settimeout(0.1)
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            if behaviour == "closes":
                conn.recv(65536)
                conn.close()
            elif behaviour == "silent":
                held.append(conn)
            else:
                conn.recv(65536)
                body = b'{"enabled": "maybe"}'
                head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                conn.sendall(head.encode() + body)
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        done.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


CASES = [("unreachable", "unreachable"), ("closes", "transport"), ("silent", "timeout"), ("garbage", "bad_answer")]


@pytest.mark.parametrize(("behaviour", "cause"), CASES, ids=[case[0] for case in CASES])
def test_no_answer_is_service_unavailable_with_its_cause_in_both_clients(behaviour: str, cause: str) -> None:
    signer = ScopeSigner(Ed25519PrivateKey.generate(), "matrix-bridge.example", "kagent/helper")

    def refused(url: str) -> list[GovernedMemoryError]:
        found = []
        with httpx.Client(base_url=url, timeout=0.5) as http:
            with pytest.raises(GovernedMemoryError) as sync:
                ControlClient(http, signer, SUBJECT).status()
            found.append(sync.value)

        async def asynchronous() -> None:
            async with httpx.AsyncClient(base_url=url, timeout=0.5) as http:
                with pytest.raises(GovernedMemoryError) as awaited:
                    await AsyncControlClient(http, signer, SUBJECT).status()
                found.append(awaited.value)

        asyncio.run(asynchronous())
        return found

    if behaviour == "unreachable":
        errors = refused(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    else:
        with listening(behaviour) as url:
            errors = refused(url)
    assert [(error.reason, error.cause) for error in errors] == [(Reason.SERVICE_UNAVAILABLE, cause)] * 2
    assert all("127.0.0.1" not in f"{error} {error!r} {error.explained()}" for error in errors)
