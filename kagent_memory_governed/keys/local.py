"""The embedded key store: keyrings as files beside the embedded database, for local runs, the demo and tests."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from kagent_memory_governed.errors import Cause
from kagent_memory_governed.keys.keyring import (
    SETTING,
    Binding,
    EntryKey,
    Fence,
    Keyring,
    b64,
    covered,
    fenced,
    off_loop,
    pack_keyring,
    unavailable,
    unb64,
    unpack_keyring,
)


class LocalKeyStore:
    """Keyrings as files under ``root`` (never inside the database's data directory): ``kek`` holds the
    key-encryption keys, ``scopes/<scope id>`` each scope's keyring sealed under the current one, with the scope
    id as associated data, and ``binding`` the database this store serves. Writes are atomic (a new file renamed
    over the old, both flushed) and serialized by a lock file, so several processes on one machine may share it.
    A process that dies between writing a new file and renaming it leaves that file (``.<name>.<hex>``): the
    next change under the lock removes it, and until then ``destroyed`` counts it as holding every key it may.
    For local runs, the demo and tests: a file system may keep the blocks of a replaced file, readable only with
    a key-encryption key that ``rotate`` has not yet dropped."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._kept_keks: tuple[tuple[int, int, int], int, dict[int, bytes]] | None = None

    @classmethod
    def from_url(cls, url: str) -> LocalKeyStore:
        """The store at ``file:///absolute/path``; anything else is a ``ValueError`` naming the setting."""
        parts = urlsplit(url)
        if parts.scheme != "file" or parts.netloc or not parts.path.startswith("/") or parts.query:
            raise ValueError(f"{SETTING}: file:// needs an absolute path")
        return cls(Path(parts.path))

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
            self._write(path, json.dumps({"current": 1, "keys": {"1": b64(AESGCM.generate_key(256))}}).encode())
        stamp = path.stat()
        seen = (stamp.st_ino, stamp.st_mtime_ns, stamp.st_size)
        if self._kept_keks is None or self._kept_keks[0] != seen:  # replaced by rename on every change
            recorded = json.loads(path.read_bytes())
            keks = {int(v): unb64(k) for v, k in recorded["keys"].items()}
            self._kept_keks = (seen, int(recorded["current"]), keks)
        return self._kept_keks[1], self._kept_keks[2]

    def _read(self, scope: uuid.UUID, keks: dict[int, bytes]) -> Keyring:
        try:
            raw = self._path(scope).read_bytes()
        except FileNotFoundError:
            return {}
        version, nonce, sealed = int.from_bytes(raw[5:9], "big"), raw[9:21], raw[21:]
        if raw[:5] != b"KMGK1" or version not in keks:
            raise unavailable(Cause.KEYRING_UNREADABLE)
        try:
            plain = AESGCM(keks[version]).decrypt(nonce, sealed, scope.bytes)
        except InvalidTag:
            raise unavailable(Cause.KEYRING_UNREADABLE) from None
        return unpack_keyring(plain)

    def _save(self, scope: uuid.UUID, keyring: Keyring, version: int, kek: bytes, *, lasting: bool = True) -> None:
        plain = pack_keyring(keyring)
        nonce = os.urandom(12)
        sealed = AESGCM(kek).encrypt(nonce, plain, scope.bytes)
        self._write(self._path(scope), b"KMGK1" + version.to_bytes(4, "big") + nonce + sealed, lasting=lasting)

    def _stale(self, name: str, directory: Path) -> list[Path]:
        """What writers of ``name`` that died before their rename left in ``directory``. Under the lock every
        such file is stale: a live writer holds the lock from its new file to its rename."""
        return sorted(directory.glob(f".{name}.*"))

    def _remove_stale(self, name: str, directory: Path) -> None:
        stale = self._stale(name, directory)
        for path in stale:
            path.unlink(missing_ok=True)
        if stale:
            handle = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(handle)  # gone for good before a destroyed key is reported so
            finally:
                os.close(handle)

    def _change(self, scope: uuid.UUID, change: Callable[[Keyring], Keyring], *, lasting: bool = True) -> None:
        with self._locked():
            self._remove_stale("kek", self.root)
            self._remove_stale(str(scope), self.root / "scopes")
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
                raise unavailable(Cause.IO_ERROR)
            if not (self.root / "kek").is_file():
                return {}
            return self._read(scope, self._keks()[1])
        except OSError:
            raise unavailable(Cause.IO_ERROR) from None

    async def store(self, scope: uuid.UUID, keys: Mapping[uuid.UUID, EntryKey]) -> None:
        await off_loop(partial(self._change, scope, lambda keyring: keyring | dict(keys), lasting=False))

    async def destroy(
        self,
        scope: uuid.UUID,
        *,
        entries: Collection[uuid.UUID] = (),
        before: int | None = None,
        fence: Fence | None = None,
    ) -> None:
        def keep(keyring: Keyring) -> Keyring:
            return fenced({e: k for e, k in keyring.items() if not covered(e, k, entries, before)}, fence)

        await off_loop(self._change, scope, keep)

    async def destroyed(
        self, scope: uuid.UUID, *, entries: Collection[uuid.UUID] = (), before: int | None = None
    ) -> bool:
        keyring = await self.fetch(scope)
        if any(covered(e, k, entries, before) for e, k in keyring.items()):
            return False

        def left() -> bool:  # under the lock: a live writer's new keyring is renamed before it lets go
            with self._locked():
                return bool(self._stale(str(scope), self.root / "scopes") or self._stale("kek", self.root))

        return not await off_loop(left)  # a new keyring a dead writer never renamed may hold any of them

    async def bound(self) -> Binding | None:
        try:
            raw = (self.root / "binding").read_bytes()
        except FileNotFoundError:
            return None
        except OSError:
            raise unavailable(Cause.IO_ERROR) from None
        try:
            recorded = json.loads(raw)
            return Binding(uuid.UUID(recorded["key_store"]), uuid.UUID(recorded["database"]))
        except (ValueError, TypeError, KeyError):
            raise unavailable(Cause.BAD_RESPONSE) from None

    async def bind(self, database: uuid.UUID) -> Binding:
        def bind() -> None:
            with self._locked():
                self._remove_stale("binding", self.root)
                if not (self.root / "binding").exists():  # the first writer's, never overwritten
                    fresh = {"key_store": uuid.uuid4().hex, "database": database.hex}
                    self._write(self.root / "binding", json.dumps(fresh).encode())

        await off_loop(bind)
        recorded = await self.bound()
        if recorded is None:  # written above, under the lock, never removed
            raise unavailable(Cause.IO_ERROR)
        return recorded

    async def check(self) -> None:
        def probe() -> None:
            with self._locked():
                self._keks()

        await off_loop(probe)

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
                            "keys": {**{str(v): b64(k) for v, k in keks.items()}, str(fresh): b64(new)},
                        }
                    ).encode(),
                )
                for path in (self.root / "scopes").iterdir():
                    if path.name.startswith("."):  # a dead writer's: its keys sealed under a key dropped below
                        path.unlink()
                        continue
                    scope = uuid.UUID(path.name)
                    self._save(scope, self._read(scope, keks), fresh, new)
                self._write(self.root / "kek", json.dumps({"current": fresh, "keys": {str(fresh): b64(new)}}).encode())
                return fresh

        return await off_loop(rotate)
