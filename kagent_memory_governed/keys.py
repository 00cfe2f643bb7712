"""Where the keys of memory content live: outside the memory database, one keyring a scope (R42).

Every entry is sealed under a key of its own (``store/sealing.py``): its text and its embedding are stored in
PostgreSQL only as authenticated ciphertext. The entry's key lives here, in the scope's keyring, never in the
memory database nor in its WAL, replicas, dumps or backups. Erasing destroys keys: one entry's for ``forget``,
every key written before the erasure's fence for ``forget-all``, ``off`` and ``offboard``, an expired entry's
for ``sweep``. A copy of the database taken at any time is then ciphertext without a key.

    KeyStore                   what the store needs from a key store (a Protocol)
     ├── LocalKeyStore          the embedded default: a directory beside the embedded database, for local runs
     │                          and tests; keyrings sealed under a local key-encryption key that ``rotate`` replaces
     └── OpenBaoKeyStore        OpenBao (or HashiCorp Vault) KV version 2: one secret a scope, older versions
                                destroyed by every erasure; the server's barrier key is the key-encryption key

A keyring slot also holds the fact's digest (``EntryKey.token``), so that a fact equal to a live entry is
recognized without any fact-derived value in the memory database. A lost key store is a loss of memory, never a
leak: without it, nothing in the database can be read back.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import ipaddress
import json
import os
import secrets
import ssl
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar
from urllib.parse import quote, urlsplit

import h11
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from kagent_memory_governed.errors import ConfigurationError, GovernedMemoryError, Reason

if TYPE_CHECKING:
    from kagent_memory_governed.settings import Settings

P = ParamSpec("P")
T = TypeVar("T")
KEY_BYTES = 32  # AES-256-GCM
TOKEN_BYTES = 16
_SLOT = 16 + 8 + KEY_BYTES + TOKEN_BYTES  # entry id, generation, key, token


@dataclass(frozen=True, slots=True)
class EntryKey:
    """The key of one entry: ``key`` seals it and nothing else; ``token`` says which fact it holds (a digest,
    compared when a fact is saved again); ``generation`` is the consent generation it was written under, so an
    erasure fenced at a later generation destroys it and no key written after that fence."""

    key: bytes
    token: bytes
    generation: int

    def pack(self) -> bytes:
        return self.generation.to_bytes(8, "big", signed=True) + self.key + self.token

    @classmethod
    def unpack(cls, raw: bytes) -> EntryKey:
        if len(raw) != 8 + KEY_BYTES + TOKEN_BYTES:
            raise ValueError("not an entry key")
        return cls(raw[8 : 8 + KEY_BYTES], raw[8 + KEY_BYTES :], int.from_bytes(raw[:8], "big", signed=True))


Keyring = dict[uuid.UUID, EntryKey]


class KeyStore(Protocol):
    """A store of keyrings outside the memory database. Every method refuses ``key_unavailable`` (with a
    content-free cause) when the store cannot answer; none returns or logs key material except ``fetch``."""

    async def fetch(self, scope: uuid.UUID) -> Keyring:
        """The scope's keyring as it stands now (empty when it has none)."""
        ...

    async def store(self, scope: uuid.UUID, keys: Mapping[uuid.UUID, EntryKey]) -> None:
        """Add ``keys`` to the scope's keyring, durably, before returning. Concurrent calls never lose a key."""
        ...

    async def destroy(
        self, scope: uuid.UUID, *, entries: Collection[uuid.UUID] = (), before: int | None = None
    ) -> None:
        """Destroy the keys of ``entries``, and every key written under a generation below ``before``, including
        every copy the store keeps of earlier keyrings. Idempotent; keys written since are never touched."""
        ...

    async def destroyed(
        self, scope: uuid.UUID, *, entries: Collection[uuid.UUID] = (), before: int | None = None
    ) -> bool:
        """Whether the store can no longer give back any of those keys, from the keyring or a kept copy of it."""
        ...

    async def check(self) -> None:
        """Refuse (``key_unavailable``) unless the store can serve: reachable, authorized, configured."""
        ...

    async def close(self) -> None: ...


def _covered(entry: uuid.UUID, key: EntryKey, entries: Collection[uuid.UUID], before: int | None) -> bool:
    return entry in entries or (before is not None and key.generation < before)


def _unavailable(cause: str) -> GovernedMemoryError:
    return GovernedMemoryError(Reason.KEY_UNAVAILABLE, cause=cause)


# -- the embedded default ------------------------------------------------------------------------------------


class LocalKeyStore:
    """Keyrings as files under ``root`` (never inside the database's data directory): ``kek`` holds the
    key-encryption keys, ``scopes/<scope id>`` each scope's keyring sealed under the current one, with the scope
    id as associated data. Writes are atomic (a new file renamed over the old, both flushed) and serialized by a
    lock file, so several processes on one machine may share it. For local runs, the demo and tests: a file
    system may keep the blocks of a replaced file, readable only with a key-encryption key that ``rotate`` has
    not yet dropped."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._kept_keks: tuple[tuple[int, int, int], int, dict[int, bytes]] | None = None

    # the files

    def _path(self, scope: uuid.UUID) -> Path:
        return self.root / "scopes" / str(scope)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        (self.root / "scopes").mkdir(exist_ok=True, mode=0o700)
        with open(self.root / "lock", "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _write(self, path: Path, data: bytes, *, lasting: bool = True) -> None:
        """Replace ``path`` atomically (a crashed process leaves the old file or the new one). ``lasting``: flushed
        to disk, file and rename, before returning, so a destroyed key cannot come back after a power loss. Adding
        a key is not flushed (the system writes it back within seconds): a power loss right after may lose that
        key, and its entry becomes unreadable, never readable by anyone else. For local runs, the demo and tests."""
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(descriptor, data)
            if lasting:
                os.fdatasync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, path)
        if lasting:
            directory = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)

    def _keks(self) -> tuple[int, dict[int, bytes]]:
        """The key-encryption keys by version, and the current version; created on first use."""
        path = self.root / "kek"
        if not path.exists():
            self._write(path, json.dumps({"current": 1, "keys": {"1": _b64(AESGCM.generate_key(256))}}).encode())
        stamp = path.stat()
        seen = (stamp.st_ino, stamp.st_mtime_ns, stamp.st_size)
        if self._kept_keks is None or self._kept_keks[0] != seen:  # replaced by rename on every change
            recorded = json.loads(path.read_bytes())
            keks = {int(v): _unb64(k) for v, k in recorded["keys"].items()}
            self._kept_keks = (seen, int(recorded["current"]), keks)
        return self._kept_keks[1], self._kept_keks[2]

    def _read(self, scope: uuid.UUID, keks: dict[int, bytes]) -> Keyring:
        try:
            raw = self._path(scope).read_bytes()
        except FileNotFoundError:
            return {}
        version, nonce, sealed = int.from_bytes(raw[5:9], "big"), raw[9:21], raw[21:]
        if raw[:5] != b"KMGK1" or version not in keks:
            raise _unavailable("keyring_unreadable")
        try:
            plain = AESGCM(keks[version]).decrypt(nonce, sealed, scope.bytes)
        except InvalidTag:
            raise _unavailable("keyring_unreadable") from None
        slots = (plain[i : i + _SLOT] for i in range(0, len(plain), _SLOT))
        return {uuid.UUID(bytes=slot[:16]): EntryKey.unpack(slot[16:]) for slot in slots}

    def _save(self, scope: uuid.UUID, keyring: Keyring, version: int, kek: bytes, *, lasting: bool = True) -> None:
        plain = b"".join(entry.bytes + key.pack() for entry, key in keyring.items())
        nonce = os.urandom(12)
        sealed = AESGCM(kek).encrypt(nonce, plain, scope.bytes)
        self._write(self._path(scope), b"KMGK1" + version.to_bytes(4, "big") + nonce + sealed, lasting=lasting)

    def _change(self, scope: uuid.UUID, change: Callable[[Keyring], Keyring], *, lasting: bool = True) -> None:
        with self._locked():
            current, keks = self._keks()
            keyring = self._read(scope, keks)
            changed = change(dict(keyring))
            if changed != keyring:
                self._save(scope, changed, current, keks[current], lasting=lasting)

    # the protocol

    async def fetch(self, scope: uuid.UUID) -> Keyring:
        # on the event loop: a few kilobytes from the page cache cost less than a worker thread contending for
        # the interpreter with the loop; files are replaced by rename, so a read needs no lock
        return self._fetch(scope)

    def _fetch(self, scope: uuid.UUID) -> Keyring:
        try:
            if not os.path.lexists(self.root):  # never used: no keys
                return {}
            if not self.root.is_dir():
                raise _unavailable("io_error")
            if not (self.root / "kek").is_file():
                return {}
            return self._read(scope, self._keks()[1])
        except OSError:
            raise _unavailable("io_error") from None

    async def store(self, scope: uuid.UUID, keys: Mapping[uuid.UUID, EntryKey]) -> None:
        await _off_loop(partial(self._change, scope, lambda keyring: keyring | dict(keys), lasting=False))

    async def destroy(
        self, scope: uuid.UUID, *, entries: Collection[uuid.UUID] = (), before: int | None = None
    ) -> None:
        def keep(keyring: Keyring) -> Keyring:
            return {e: k for e, k in keyring.items() if not _covered(e, k, entries, before)}

        await _off_loop(self._change, scope, keep)

    async def destroyed(
        self, scope: uuid.UUID, *, entries: Collection[uuid.UUID] = (), before: int | None = None
    ) -> bool:
        keyring = await self.fetch(scope)
        return not any(_covered(e, k, entries, before) for e, k in keyring.items())

    async def check(self) -> None:
        def probe() -> None:
            with self._locked():
                self._keks()

        await _off_loop(probe)

    async def close(self) -> None:
        return None

    async def rotate(self) -> int:
        """Rotate the key-encryption key: a new one seals every keyring again, then the old ones are dropped.
        The memory database is not touched: no entry is rewritten. Returns the new version."""

        def rotate() -> int:
            with self._locked():
                current, keks = self._keks()
                fresh, new = current + 1, AESGCM.generate_key(256)
                self._write(
                    self.root / "kek",
                    json.dumps(
                        {
                            "current": fresh,
                            "keys": {**{str(v): _b64(k) for v, k in keks.items()}, str(fresh): _b64(new)},
                        }
                    ).encode(),
                )
                for path in (self.root / "scopes").iterdir():
                    if path.name.startswith("."):
                        continue
                    scope = uuid.UUID(path.name)
                    self._save(scope, self._read(scope, keks), fresh, new)
                self._write(self.root / "kek", json.dumps({"current": fresh, "keys": {str(fresh): _b64(new)}}).encode())
                return fresh

        return await _off_loop(rotate)


# -- OpenBao / Vault KV version 2 ----------------------------------------------------------------------------


class OpenBaoKeyStore:
    """Keyrings in an OpenBao (or HashiCorp Vault) KV version 2 mount: the secret ``<mount>/data/<scope id>`` has
    one field a key (the entry id, hex: its generation, key and token, base64url). A key is added with a JSON merge
    patch (the server serializes patches of one secret, so concurrent saves never lose one); an erasure writes the
    keyring without the erased keys and then **destroys every earlier version** of the secret, so the server keeps
    no copy from which they could be read (``destroyed`` checks both). The server stores secrets sealed under its
    barrier key: that is the key-encryption key, rotated with ``bao operator rotate`` (``sys/rotate``) without
    rewriting any secret or entry.

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
                raise _unavailable("tls_untrusted_certificate") from None
            except (OSError, h11.ProtocolError, TimeoutError) as error:
                if attempt == 3:
                    raise _unavailable(_transport_cause(error)) from None
                continue  # a kept connection the server closed meanwhile: again on a new one
            if status == 403 and attempt == 1 and self._token_setting.startswith("@"):
                self._token = _read_token(self._token_setting)  # a renewed token file
                continue
            break
        if status == 403:
            raise _unavailable("permission_denied")
        if status >= 500 or status in (401, 429):
            raise _unavailable("sealed" if status == 503 else f"status_{status}")
        try:
            return status, (json.loads(raw) if raw else {})
        except ValueError:
            raise _unavailable("bad_response") from None

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
            raise _unavailable(f"status_{status}")
        data = answer["data"]
        try:
            keyring = {uuid.UUID(hex=name): EntryKey.unpack(_unb64(value)) for name, value in data["data"].items()}
        except (ValueError, TypeError, AttributeError):
            raise _unavailable("keyring_unreadable") from None
        return int(data["metadata"]["version"]), keyring

    async def fetch(self, scope: uuid.UUID) -> Keyring:
        return (await self._read(scope))[1]

    async def store(self, scope: uuid.UUID, keys: Mapping[uuid.UUID, EntryKey]) -> None:
        fields = {entry.hex: _b64(key.pack()) for entry, key in keys.items()}
        for _ in range(8):
            status, _answer = await self._call("PATCH", self._at("data", scope), {"data": fields}, merge=True)
            if status in (200, 204):
                return
            if status != 404:
                raise _unavailable(f"status_{status}")
            # no secret yet (or only destroyed versions): create it, unless another writer just did
            version, _ = await self._read(scope)
            status, _answer = await self._call(
                "POST", self._at("data", scope), {"options": {"cas": version}, "data": fields}
            )
            if status in (200, 204):
                return
            if status != 400:  # 400: the check-and-set lost a race; patch what the other writer created
                raise _unavailable(f"status_{status}")
        raise _unavailable("contended")

    async def destroy(
        self, scope: uuid.UUID, *, entries: Collection[uuid.UUID] = (), before: int | None = None
    ) -> None:
        for _ in range(8):
            version, keyring = await self._read(scope)
            kept = {e: k for e, k in keyring.items() if not _covered(e, k, entries, before)}
            if kept != keyring:
                fields = {entry.hex: _b64(key.pack()) for entry, key in kept.items()}
                status, _ = await self._call(
                    "POST", self._at("data", scope), {"options": {"cas": version}, "data": fields}
                )
                if status == 400:
                    continue  # a key was added meanwhile: read again, keep it
                if status not in (200, 204):
                    raise _unavailable(f"status_{status}")
            await self._destroy_earlier(scope)
            return
        raise _unavailable("contended")

    async def _earlier(self, scope: uuid.UUID) -> list[int]:
        """Versions of the scope's secret, older than the current one, that the server can still give back."""
        status, answer = await self._call("GET", self._at("metadata", scope))
        if status == 404:
            return []
        if status != 200:
            raise _unavailable(f"status_{status}")
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
                raise _unavailable(f"status_{status}")

    async def destroyed(
        self, scope: uuid.UUID, *, entries: Collection[uuid.UUID] = (), before: int | None = None
    ) -> bool:
        keyring = await self.fetch(scope)
        if any(_covered(e, k, entries, before) for e, k in keyring.items()):
            return False
        return not await self._earlier(scope)

    async def check(self) -> None:
        status, answer = await self._call("GET", f"/v1/{quote(self._mount)}/config")
        if status == 404:
            raise _unavailable("mount_missing")
        if status != 200:
            raise _unavailable(f"status_{status}")

    async def close(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()

    async def rotate(self) -> None:
        """Rotate the server's barrier key (``sys/rotate``; the token needs ``sudo`` there): secrets written from
        now on are sealed under the new key, earlier ones stay readable, nothing is rewritten."""
        status, _ = await self._call("POST", "/v1/sys/rotate", {})
        if status not in (200, 204):
            raise _unavailable(f"status_{status}")


# -- configuration -------------------------------------------------------------------------------------------

_SCHEMES = ("file", "openbao+https", "openbao+http")


def check_url(url: str) -> None:
    """Refuse a key store URL this package cannot use, naming the setting, never the value:
    ``file:///absolute/path`` or ``openbao+https://host[:port]/<kv v2 mount>`` (``openbao+http`` to a loopback
    address only)."""
    name = "KAGENT_GOVERNED_MEMORY_KEY_STORE"
    parts = urlsplit(url)
    if parts.scheme not in _SCHEMES:
        raise ValueError(f"{name}: not file:// or openbao+https://")
    if parts.scheme == "file":
        if parts.netloc or not parts.path.startswith("/") or parts.query:
            raise ValueError(f"{name}: file:// needs an absolute path")
        return
    if not parts.hostname or not parts.path.strip("/") or parts.query or parts.username or parts.password:
        raise ValueError(f"{name}: openbao+https://host[:port]/<mount> without credentials or query")
    try:
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError:
        raise ValueError(f"{name}: the port is not a number") from None
    if parts.scheme == "openbao+http" and not _loopback(parts.hostname):
        raise ValueError(f"{name}: plain http only to a loopback address; use openbao+https")


def configured(settings: Settings) -> KeyStore:
    """The key store the settings name (``KAGENT_GOVERNED_MEMORY_KEY_STORE``); unset, the embedded default
    beside the embedded database (``<data dir>/keys``), which inside a Kubernetes pod is refused unless
    ``KAGENT_GOVERNED_MEMORY_EMBEDDED=true``, as the embedded database is. ``ConfigurationError`` names what is
    missing, never a value."""
    from kagent_memory_governed.settings import in_kubernetes_pod

    url = settings.key_store
    if not url:
        if in_kubernetes_pod() and not settings.embedded:
            raise ConfigurationError(
                "KAGENT_GOVERNED_MEMORY_KEY_STORE is not set; inside a Kubernetes pod the embedded key store is"
                " used only with KAGENT_GOVERNED_MEMORY_EMBEDDED=true",
                code="missing",
            )
        return LocalKeyStore(settings.data_dir / "keys")
    parts = urlsplit(url)
    if parts.scheme == "file":
        return LocalKeyStore(Path(parts.path))
    if not settings.key_store_token:
        raise ConfigurationError("governed memory needs KAGENT_GOVERNED_MEMORY_KEY_STORE_TOKEN", code="missing")
    address = f"{parts.scheme.removeprefix('openbao+')}://{parts.netloc}"
    return OpenBaoKeyStore(address, parts.path, settings.key_store_token, ca_file=settings.key_store_ca)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _read_token(setting: str) -> str:
    if not setting.startswith("@"):
        return setting
    try:
        return Path(setting[1:]).read_text("utf-8").strip()
    except OSError:
        raise _unavailable("token_unreadable") from None


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


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


async def _off_loop(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Blocking I/O (files, the HTTP client) in a worker thread; an ``OSError`` is ``key_unavailable``."""
    try:
        return await asyncio.to_thread(function, *args, **kwargs)
    except GovernedMemoryError:
        raise
    except (OSError, ValueError, KeyError) as error:
        raise _unavailable("unreachable" if not isinstance(error, OSError) else "io_error") from None


__all__ = ["EntryKey", "KeyStore", "Keyring", "LocalKeyStore", "OpenBaoKeyStore", "check_url", "configured"]
