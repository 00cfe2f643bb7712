"""The runtime's side of ``DataPlane.Exchange``: the data-plane calls of one channel multiplexed over one long-lived
stream (ADR 0001). A message on an open stream costs a third of a unary call's round trip on loopback, and an
operation makes two calls (admission before the embedding, R21).

Each call is a ``Call`` with its own credentials and an id; the stream's ``Answer`` with that id is its answer, in
whatever order the service finishes them. Calls are written one at a time; one reader matches the answers. A stream
that fails (the replica went away, a status, an answer not of the wire) fails every call pending on it with
``service_unavailable`` and a content-free cause, and the next call opens a new stream on the same channel, which
reconnects by itself. No call is sent again: a call whose stream failed may or may not have been done, as a unary
call that lost its connection. Imports nothing of the server or the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc

from kagent_memory_governed.errors import Cause, ConfigurationError, GovernedMemoryError, Reason, grpc_cause
from kagent_memory_governed.service import data_plane_pb2 as pb
from kagent_memory_governed.service import wire

URL_SETTING = "KAGENT_GOVERNED_MEMORY_SERVICE_URL"


def channel(url: str, ca_file: Path | None) -> Callable[[], grpc.aio.Channel]:
    """What opens a channel to the service at ``url``: ``https://host:port``, verified against the PEM ``ca_file``
    (the certificate must name ``host``), or ``http://host:port`` to a loopback address only. A bad setting is a
    ``ConfigurationError`` naming it, never its value."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname
    if parts.scheme not in ("https", "http") or not host or port is None or parts.path not in ("", "/"):
        raise ConfigurationError(f"{URL_SETTING} must be https://host:port (or http:// to a loopback address)")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ConfigurationError(f"{URL_SETTING} must be https://host:port (or http:// to a loopback address)")
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    options = [
        ("grpc.max_receive_message_length", wire.MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", wire.MAX_MESSAGE_BYTES),
        ("grpc.initial_reconnect_backoff_ms", wire.RECONNECT_BACKOFF_MS[0]),
        ("grpc.min_reconnect_backoff_ms", wire.RECONNECT_BACKOFF_MS[0]),
        ("grpc.max_reconnect_backoff_ms", wire.RECONNECT_BACKOFF_MS[1]),
    ]
    if parts.scheme == "http":
        if not wire.is_loopback(host):
            raise ConfigurationError(f"{URL_SETTING}: plaintext (http://) only to a loopback address; use https://")
        return lambda: grpc.aio.insecure_channel(target, options)
    if ca_file is None:
        raise ConfigurationError("KAGENT_GOVERNED_MEMORY_SERVICE_CA is required for https://")
    try:
        roots = ca_file.read_bytes()
    except OSError:
        raise ConfigurationError("KAGENT_GOVERNED_MEMORY_SERVICE_CA cannot be read") from None
    verified = grpc.ssl_channel_credentials(root_certificates=roots)
    return lambda: grpc.aio.secure_channel(target, verified, options)


def unavailable(cause: Cause) -> GovernedMemoryError:
    return GovernedMemoryError(Reason.SERVICE_UNAVAILABLE, cause=cause)


class Exchange:
    """One open ``Exchange`` stream over ``stub``'s channel, started in the running event loop; ``failed`` once it
    cannot carry calls (then open another)."""

    def __init__(self, stub: Any) -> None:
        self._stream: Any = stub.Exchange()  # grpc.aio's StreamStreamCall; generated, untyped
        self._pending: dict[int, asyncio.Future[pb.Answer]] = {}
        self._last_id = 0
        self._writing = asyncio.Lock()
        self._failure: Cause | None = None  # the cause every later call fails with
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @property
    def failed(self) -> bool:
        return self._failure is not None

    async def ask(self, call: pb.Call) -> pb.Answer:
        """Send ``call`` (its ``id`` is set here) and wait for its answer, unbounded: the caller bounds the wait
        (a call given up on stays answered into nothing; the stream goes on)."""
        if self._failure is not None:
            raise unavailable(self._failure)
        self._last_id += 1
        call.id = self._last_id
        answer: asyncio.Future[pb.Answer] = asyncio.get_running_loop().create_future()
        self._pending[call.id] = answer
        try:
            async with self._writing:
                try:
                    await self._stream.write(call)
                except asyncio.CancelledError:
                    raise
                except Exception:  # the stream ended under the write: its status says why
                    await asyncio.shield(self._reader)
                    raise unavailable(self._failure or Cause.TRANSPORT) from None
            return await answer
        finally:
            self._pending.pop(call.id, None)
            if answer.done() and not answer.cancelled():
                answer.exception()  # retrieved: a failure set while this call raised another is not reported twice

    async def close(self) -> None:
        """Cancel the stream; calls pending on it fail ``service_unavailable``."""
        self._stream.cancel()
        await asyncio.shield(self._reader)

    async def _read(self) -> None:
        try:
            while True:
                answer = await self._stream.read()
                if answer is grpc.aio.EOF:  # the service ended the stream
                    failure = Cause.TRANSPORT
                    break
                if not isinstance(answer, pb.Answer):  # grpc.aio logs a message that does not parse, reads None
                    failure = Cause.BAD_ANSWER
                    break
                waiting = self._pending.pop(answer.id, None)
                if waiting is not None and not waiting.done():
                    waiting.set_result(answer)
        except grpc.aio.AioRpcError as error:
            code = error.code()
            failure = grpc_cause(code.name) if isinstance(code, grpc.StatusCode) else Cause.BAD_ANSWER
        except asyncio.CancelledError:  # closed here
            failure = Cause.CANCELLED
        except Exception:  # the channel's own failure: no text of it passes
            failure = Cause.TRANSPORT
        self._failure = failure
        self._stream.cancel()  # a stream that answered what it should not carries nothing more
        for waiting in self._pending.values():
            if not waiting.done():
                waiting.set_exception(unavailable(failure))
        self._pending.clear()
