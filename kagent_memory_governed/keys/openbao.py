"""OpenBao (or HashiCorp Vault) KV version 2 as the key store: one secret a scope, every earlier version destroyed
by each erasure; the server's barrier key is the key-encryption key."""

from __future__ import annotations

import asyncio
import json
import ssl
import uuid
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import h11

from kagent_memory_governed.keys.keyring import EntryKey, Keyring, b64, covered, entry_id, unavailable, unb64


class OpenBaoKeyStore:
    """Keyrings in an OpenBao (or HashiCorp Vault) KV version 2 mount: the secret ``<mount>/data/<scope id>`` has
    one field a key (the entry id, hex: its generation, key and token, base64url). A key is added with a JSON merge
    patch (the server serializes patches of one secret, so concurrent saves never lose one); an erasure writes the
    keyring without the erased keys and then **destroys every earlier version** of the secret, so the server keeps
    no copy from which they could be read (``destroyed`` checks the keyring and every version the server still
    keeps). The server stores secrets sealed under its barrier key: that is the key-encryption key, rotated with
    ``bao operator rotate`` (``sys/rotate``) without rewriting any secret or entry.

    The token needs ``create``, ``read``, ``update`` and ``patch`` on ``<mount>/data/*``, ``read`` on
    ``<mount>/metadata/*`` and ``update`` on ``<mount>/destroy/*``; a token file (``@/path``) is read again
    when the server refuses the token, so an agent that renews it needs no restart."""

    def __init__(self, address: str, mount: str, token: str, *, ca_file: Path | None = None, pool: int = 8) -> None:
        parts = urlsplit(address)
        self._tls = parts.scheme == "https"
        self._host, self._port = parts.hostname or "", parts.port or (443 if self._tls else 80)
        self._mount = mount.strip("/")
        self._token_setting = token
        self._token = _read_token(token)
        self._context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None) if self._tls else None
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
                elif isinstance(event, h11.Data):
                    body += event.data
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

    async def _call(
        self, method: str, path: str, body: object | None = None, *, merge: bool = False
    ) -> tuple[int, dict[str, Any]]:
        content_type = "application/merge-patch+json" if merge else "application/json"
        payload = None if body is None else json.dumps(body).encode()
        for attempt in (1, 2, 3):
            try:
                status, raw = await asyncio.wait_for(self._exchange(method, path, payload, content_type), 10)
            except ssl.SSLCertVerificationError:
                raise unavailable("tls_untrusted_certificate") from None
            except (OSError, h11.ProtocolError, TimeoutError) as error:
                if attempt == 3:
                    raise unavailable(_transport_cause(error)) from None
                continue  # a kept connection the server closed meanwhile: again on a new one
            if status == 403 and attempt == 1 and self._token_setting.startswith("@"):
                self._token = _read_token(self._token_setting)  # a renewed token file
                continue
            break
        if status == 403:
            raise unavailable("permission_denied")
        if status >= 500 or status in (401, 429):
            raise unavailable("sealed" if status == 503 else f"status_{status}")
        try:
            return status, (json.loads(raw) if raw else {})
        except ValueError:
            raise unavailable("bad_response") from None

    def _at(self, kind: str, scope: uuid.UUID) -> str:
        return f"/v1/{quote(self._mount)}/{kind}/{scope}"

    # the keyring

    async def _read(self, scope: uuid.UUID) -> tuple[int, Keyring]:
        """The current version of the scope's secret (0: none) and its keyring."""
        status, answer = await self._call("GET", self._at("data", scope))
        if status == 404:
            version = ((answer.get("data") or {}).get("metadata") or {}).get("version") or 0
            return int(version), {}
        if status != 200:
            raise unavailable(f"status_{status}")
        data = answer["data"]
        return int(data["metadata"]["version"]), _keyring(data)

    async def fetch(self, scope: uuid.UUID) -> Keyring:
        return (await self._read(scope))[1]

    async def store(self, scope: uuid.UUID, keys: Mapping[uuid.UUID, EntryKey]) -> None:
        fields = {entry.hex: b64(key.pack()) for entry, key in keys.items()}
        for _ in range(8):
            status, _answer = await self._call("PATCH", self._at("data", scope), {"data": fields}, merge=True)
            if status in (200, 204):
                return
            if status != 404:
                raise unavailable(f"status_{status}")
            # no secret yet (or only destroyed versions): create it, unless another writer just did
            version, _ = await self._read(scope)
            status, _answer = await self._call(
                "POST", self._at("data", scope), {"options": {"cas": version}, "data": fields}
            )
            if status in (200, 204):
                return
            if status != 400:  # 400: the check-and-set lost a race; patch what the other writer created
                raise unavailable(f"status_{status}")
        raise unavailable("contended")

    async def destroy(
        self, scope: uuid.UUID, *, entries: Collection[uuid.UUID] = (), before: int | None = None
    ) -> None:
        for _ in range(8):
            version, keyring = await self._read(scope)
            kept = {e: k for e, k in keyring.items() if not covered(e, k, entries, before)}
            if kept != keyring:
                fields = {entry.hex: b64(key.pack()) for entry, key in kept.items()}
                status, _ = await self._call(
                    "POST", self._at("data", scope), {"options": {"cas": version}, "data": fields}
                )
                if status == 400:
                    continue  # a key was added meanwhile: read again, keep it
                if status not in (200, 204):
                    raise unavailable(f"status_{status}")
            await self._destroy_earlier(scope)
            return
        raise unavailable("contended")

    async def _earlier(self, scope: uuid.UUID) -> list[int]:
        """Versions of the scope's secret, older than the current one, that the server can still give back."""
        status, answer = await self._call("GET", self._at("metadata", scope))
        if status == 404:
            return []
        if status != 200:
            raise unavailable(f"status_{status}")
        data = answer["data"]
        current = int(data.get("current_version") or 0)
        return sorted(
            int(v)
            for v, state in (data.get("versions") or {}).items()
            if int(v) < current and not state.get("destroyed")
        )

    async def _destroy_earlier(self, scope: uuid.UUID) -> None:
        earlier = await self._earlier(scope)
        if earlier:
            status, _ = await self._call("POST", self._at("destroy", scope), {"versions": earlier})
            if status not in (200, 204):
                raise unavailable(f"status_{status}")

    async def destroyed(
        self, scope: uuid.UUID, *, entries: Collection[uuid.UUID] = (), before: int | None = None
    ) -> bool:
        keyring = await self.fetch(scope)
        if any(covered(e, k, entries, before) for e, k in keyring.items()):
            return False
        for version in await self._earlier(scope):  # a copy the server keeps must hold none of them either
            kept = await self._version(scope, version)
            if kept is None or any(covered(e, k, entries, before) for e, k in kept.items()):
                return False
        return True

    async def _version(self, scope: uuid.UUID, version: int) -> Keyring | None:
        """The keyring an earlier version of the scope's secret holds; ``None`` if the server keeps that version
        but does not show it (deleted, not destroyed: it can be undeleted), so it cannot be said to hold nothing."""
        status, answer = await self._call("GET", self._at("data", scope) + f"?version={version}")
        if status == 404:
            return None
        if status != 200:
            raise unavailable(f"status_{status}")
        return _keyring(answer["data"])

    async def check(self) -> None:
        status, answer = await self._call("GET", f"/v1/{quote(self._mount)}/config")
        if status == 404:
            raise unavailable("mount_missing")
        if status != 200:
            raise unavailable(f"status_{status}")

    async def close(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()

    async def rotate(self) -> None:
        """Rotate the server's barrier key (``sys/rotate``; the token needs ``sudo`` there): secrets written from
        now on are sealed under the new key, earlier ones stay readable, nothing is rewritten."""
        status, _ = await self._call("POST", "/v1/sys/rotate", {})
        if status not in (200, 204):
            raise unavailable(f"status_{status}")


def _keyring(data: dict[str, Any]) -> Keyring:
    """The keyring in a version of a scope's secret as the server returns it (``data``: its fields, ``metadata``)."""
    try:
        return {entry_id(name): EntryKey.unpack(unb64(value)) for name, value in data["data"].items()}
    except (ValueError, TypeError, AttributeError):
        raise unavailable("keyring_unreadable") from None


def _read_token(setting: str) -> str:
    if not setting.startswith("@"):
        return setting
    try:
        return Path(setting[1:]).read_text("utf-8").strip()
    except OSError:
        raise unavailable("token_unreadable") from None


def _transport_cause(error: BaseException) -> str:
    if isinstance(error, asyncio.TimeoutError):
        return "timeout"
    if isinstance(error, ssl.SSLCertVerificationError):
        return "tls_untrusted_certificate"
    if isinstance(error, ssl.SSLError):
        return "tls_handshake_failed"
    if isinstance(error, ConnectionRefusedError):
        return "connection_refused"
    if isinstance(error, TimeoutError):
        return "timeout"
    return "unreachable"
