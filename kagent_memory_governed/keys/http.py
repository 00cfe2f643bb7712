"""HTTP/1.1 to a key store's server (OpenBao): h11 on the event loop with kept connections. Every answer is
bounded (``MAX_ANSWER``, refused from its announced length or as soon as it grows past it, without reading
on) and read as one JSON object; anything else, and every failure, is ``key_unavailable`` with a content-free
cause. No text of the server's ever reaches a cause."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import h11

from kagent_memory_governed.errors import Cause, ConfigurationError, http_cause
from kagent_memory_governed.keys.keyring import SETTING, unavailable

MAX_ANSWER = 4 * 1024 * 1024  # a keyring of 10 000 keys is under 1 MiB
TIMEOUT = 10.0  # seconds, one exchange
_TOKEN = re.compile(r"[\x21-\x7e]+")  # visible ASCII: what one header carries


class _Refused(Exception):
    """An answer this client does not read: larger than ``MAX_ANSWER``, or not HTTP/1.1."""


class Client:
    """Requests to ``address`` with the token ``token`` (or ``@/path``: a file, read again whenever the server
    refuses the token, so an agent that renews it needs no restart). The constructor refuses, content-free, a
    token file or a CA file (``ca_file``, for https) it cannot use."""

    def __init__(self, address: str, token: str, *, ca_file: Path | None = None, pool: int = 8) -> None:
        parts = urlsplit(address)
        self._tls = parts.scheme == "https"
        self._host, self._port = parts.hostname or "", parts.port or (443 if self._tls else 80)
        self._token_setting = token
        self._token = _read_token(token)
        self._context = _tls_context(ca_file) if self._tls else None
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, h11.Connection]] = []
        self._pool = pool

    # HTTP/1.1 with keep-alive on the event loop (h11): no thread to wake per call, and a third of an HTTP
    # library's cost per request

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, h11.Connection]:
        if self._idle:
            return self._idle.pop()
        reader, writer = await asyncio.open_connection(
            self._host, self._port, ssl=self._context, server_hostname=self._host if self._tls else None
        )
        return reader, writer, h11.Connection(h11.CLIENT)

    async def _exchange(self, method: str, path: str, payload: bytes | None, content_type: str) -> tuple[int, bytes]:
        reader, writer, state = await self._open()
        try:
            headers = [("Host", self._host), ("X-Vault-Token", self._token), ("Content-Type", content_type)]
            headers.append(("Content-Length", str(len(payload or b""))))
            wire = state.send(h11.Request(method=method, target=path, headers=headers))
            wire += state.send(h11.Data(data=payload)) if payload else b""
            wire += state.send(h11.EndOfMessage())
            writer.write(wire)
            await writer.drain()
            status, body = 0, bytearray()
            while True:
                event = state.next_event()
                if event is h11.NEED_DATA:
                    state.receive_data(await reader.read(65536))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    if any(name == b"content-length" and int(value) > MAX_ANSWER for name, value in event.headers):
                        raise _Refused  # announced too large: not one byte of it is read
                elif isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > MAX_ANSWER:
                        raise _Refused
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    raise ConnectionResetError
        except BaseException:
            writer.close()
            raise
        if state.our_state is h11.DONE and state.their_state is h11.DONE and len(self._idle) < self._pool:
            state.start_next_cycle()
            self._idle.append((reader, writer, state))
        else:
            writer.close()
        return status, bytes(body)

    async def call(
        self, method: str, path: str, body: object | None = None, *, merge: bool = False
    ) -> tuple[int, dict[str, Any]]:
        """The status and the JSON object of the answer (``{}`` when empty). Refuses ``permission_denied`` (403),
        ``sealed`` (503), ``status_<code>`` (401, 429, 5xx) and ``bad_response``: not JSON, not an object, too
        large, not HTTP/1.1."""
        content_type = "application/merge-patch+json" if merge else "application/json"
        payload = None if body is None else json.dumps(body).encode()
        for attempt in (1, 2, 3):
            try:
                status, raw = await asyncio.wait_for(self._exchange(method, path, payload, content_type), TIMEOUT)
            except ssl.SSLCertVerificationError:
                raise unavailable(Cause.TLS_UNTRUSTED_CERTIFICATE) from None
            except (_Refused, h11.RemoteProtocolError):
                raise unavailable(Cause.BAD_RESPONSE) from None
            except (OSError, h11.ProtocolError, TimeoutError) as error:
                if attempt == 3:
                    raise unavailable(_transport_cause(error)) from None
                continue  # a kept connection the server closed meanwhile: again on a new one
            if status == 403 and attempt == 1 and self._token_setting.startswith("@"):
                self._token = _read_token(self._token_setting)  # a renewed token file
                continue
            break
        if status == 403:
            raise unavailable(Cause.PERMISSION_DENIED)
        if status >= 500 or status in (401, 429):
            raise unavailable(Cause.SEALED if status == 503 else http_cause("status_", status))
        try:
            answer = _parsed(raw) if raw else {}
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
            raise unavailable(Cause.BAD_RESPONSE) from None
        if not isinstance(answer, dict):
            raise unavailable(Cause.BAD_RESPONSE)
        return status, answer

    async def close(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()


def _read_token(setting: str) -> str:
    """The token itself, or read from the file ``@/path`` names; ``token_unreadable`` if that file cannot be
    read, ``token_malformed`` if the token is empty or not printable ASCII (it goes in a header)."""
    token = setting
    if setting.startswith("@"):
        try:
            token = Path(setting[1:]).read_text("utf-8").strip()
        except (OSError, ValueError):
            raise unavailable(Cause.TOKEN_UNREADABLE) from None
    if not token or not all(33 <= ord(c) < 127 for c in token):
        raise unavailable(Cause.TOKEN_MALFORMED)
    return token


def _tls_context(ca_file: Path | None) -> ssl.SSLContext:
    """The system's roots, or those of ``ca_file``: ``ca_unreadable`` if it cannot be read, ``ca_not_a_certificate``
    if it holds no certificate."""
    try:
        return ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    except ssl.SSLError:  # before OSError: an ``SSLError`` is one
        raise unavailable(Cause.CA_NOT_A_CERTIFICATE) from None
    except (OSError, ValueError):
        raise unavailable(Cause.CA_UNREADABLE) from None


def _transport_cause(error: BaseException) -> Cause:
    if isinstance(error, ssl.SSLCertVerificationError):
        return Cause.TLS_UNTRUSTED_CERTIFICATE
    if isinstance(error, ssl.SSLError):
        return Cause.TLS_HANDSHAKE_FAILED
    if isinstance(error, ConnectionRefusedError):
        return Cause.CONNECTION_REFUSED
    if isinstance(error, TimeoutError):  # asyncio.TimeoutError is TimeoutError since Python 3.11
        return Cause.TIMEOUT
    if isinstance(error, h11.ProtocolError):
        return Cause.BAD_REQUEST
    return Cause.UNREACHABLE


def check_token(setting: str) -> None:
    """A token setting fit for the ``X-Vault-Token`` header: given, and (``@/path``) a readable file holding one."""
    name = f"{SETTING}_TOKEN"
    if not setting:
        raise ConfigurationError(f"governed memory needs {name}", code="missing")
    token = setting
    if setting.startswith("@"):
        try:
            token = Path(setting[1:]).read_text("utf-8").strip()
        except (OSError, UnicodeDecodeError):
            raise ConfigurationError(f"{name}: the token file is not readable", code="token_unreadable") from None
        if not token:
            raise ConfigurationError(f"{name}: the token file holds no token", code="token_empty")
    if not _TOKEN.fullmatch(token):  # a newline or a space would break (or split) the request's header
        raise ConfigurationError(f"{name}: not a token (visible ASCII, no spaces)", code="token_invalid")


def check_ca(path: Path) -> None:
    """A CA bundle the client can load: a readable file holding a PEM certificate."""
    name = f"{SETTING}_CA"
    if not path.is_file() or not os.access(path, os.R_OK):
        raise ConfigurationError(f"{name}: not a readable file", code="ca_unreadable")
    try:
        ssl.create_default_context(cafile=str(path))  # as the store loads it
    except (ssl.SSLError, ValueError):  # before OSError: SSLError is one
        raise ConfigurationError(f"{name}: holds no PEM certificate", code="ca_not_a_certificate") from None
    except OSError:
        raise ConfigurationError(f"{name}: not a readable file", code="ca_unreadable") from None


def _parsed(raw: bytes) -> Any:
    """``json.loads``, with no collection while it runs: an answer nested past the parser's depth ends in a
    ``RecursionError`` at the recursion limit, where a finalizer the collector happened to run would fail too."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return json.loads(raw)
    finally:
        if collecting:
            gc.enable()
