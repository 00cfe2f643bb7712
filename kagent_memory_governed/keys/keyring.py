"""A scope's keyring and what every key store answers for (``KeyStore``): the values and rules the stores share."""

from __future__ import annotations

import asyncio
import base64
import struct
import uuid
from collections.abc import Callable, Collection, Mapping
from typing import NamedTuple, ParamSpec, Protocol, TypeVar

from asyncpg.pgproto.pgproto import UUID as _UUID

from kagent_memory_governed.errors import Cause, GovernedMemoryError, Reason

P = ParamSpec("P")
T = TypeVar("T")
SETTING = "KAGENT_GOVERNED_MEMORY_KEY_STORE"  # what refusals name: the setting, never its value
KEY_BYTES = 32  # AES-256-GCM
TOKEN_BYTES = 16
_PACKED = f"q{KEY_BYTES}s{TOKEN_BYTES}s"  # generation, key, token
_KEY = struct.Struct(">" + _PACKED)
_SLOT = struct.Struct(">16s" + _PACKED)  # the entry id, then its key
SLOT = _SLOT.size


class EntryKey(NamedTuple):
    """The key of one entry: ``key`` seals it and nothing else; ``token`` says which fact it holds (a digest,
    compared when a fact is saved again); ``generation`` is the consent generation it was written under, so an
    erasure fenced at a later generation destroys it and no key written after that fence. A named tuple: a
    keyring of 100 is unpacked on every search whose keyring is not kept."""

    key: bytes
    token: bytes
    generation: int

    def pack(self) -> bytes:
        return _KEY.pack(self.generation, self.key, self.token)

    @classmethod
    def unpack(cls, raw: bytes) -> EntryKey:
        if len(raw) != _KEY.size:
            raise ValueError("not an entry key")
        generation, key, token = _KEY.unpack(raw)
        return cls(key, token, generation)


Keyring = dict[uuid.UUID, EntryKey]

# Not an entry (entry ids are random, never nil): the slot where a keyring records the last erasure it saw
# (``Fence``). A slot like any other, so every release reads and writes a keyring holding it; it opens nothing. Its
# generation is the largest there is, so no erasure of an earlier release (which knows no such slot) covers it; the
# erasure's generation is in its key bytes.
FENCE = uuid.UUID(int=0)
_RECORD = 2**63 - 1


class Fence(NamedTuple):
    """The last erasure of a scope the key store saw: the consent generation its fence advanced the scope to, and
    whether the scope stays disabled after it (``off``, ``offboard``, any erasure of a disabled scope) or is
    enabled again once it is verified (``forget``, ``forget-all`` of an enabled scope). Kept
    in the scope's keyring, outside the database, so a database that comes back from before the erasure (a
    failover to an asynchronous standby, a restore) is recognized as behind it (``store/reconcile.py``)."""

    generation: int
    withdrawn: bool

    def slot(self) -> EntryKey:
        recorded = bytes([self.withdrawn]) + self.generation.to_bytes(8, "big")
        return EntryKey(recorded + bytes(KEY_BYTES - len(recorded)), bytes(TOKEN_BYTES), _RECORD)


def fence_of(keyring: Mapping[uuid.UUID, EntryKey]) -> Fence | None:
    """The last erasure ``keyring`` records, if any."""
    slot = keyring.get(FENCE)
    return None if slot is None else Fence(int.from_bytes(slot.key[1:9], "big"), bool(slot.key[0]))


def fenced(keyring: Keyring, fence: Fence | None) -> Keyring:
    """``keyring`` recording ``fence``, unless it records a later erasure already (concurrent erasures of a scope
    may reach the key store out of order: the record only moves forward). Two erasures at one generation (one of
    them on a database behind the other) record withdrawn if either was: never re-enabled by the record."""
    recorded = fence_of(keyring)
    if fence is None or (recorded is not None and recorded.generation > fence.generation):
        return keyring
    if recorded is not None and recorded.generation == fence.generation:
        fence = Fence(fence.generation, fence.withdrawn or recorded.withdrawn)
        if fence == recorded:
            return keyring
    return keyring | {FENCE: fence.slot()}


def entry_keys(keyring: Mapping[uuid.UUID, EntryKey]) -> dict[uuid.UUID, EntryKey]:
    """The keys of entries a keyring holds: all but its record of the last erasure."""
    return {entry: key for entry, key in keyring.items() if entry != FENCE}


class Binding(NamedTuple):
    """Which key store this is and which memory database it serves: both recorded once, in the key store and in
    the database (``store/binding.py`` compares them), so a key store never "verifies" erasures of keys it never
    held."""

    key_store: uuid.UUID
    database: uuid.UUID


def entry_id(value: bytes | str) -> uuid.UUID:
    """An entry id read back from a key store, from its 16 bytes or its text: asyncpg's ``uuid.UUID`` (the class
    every uuid column is read as), built in C in a twentieth of ``uuid.UUID``'s time; a keyring of 100 is read on
    every search whose keyring is not kept. ``ValueError`` if it is not one."""
    return _UUID(value)  # type: ignore[no-any-return]


def pack_keyring(keyring: Keyring) -> bytes:
    """A keyring as consecutive slots (entry id, then ``EntryKey.pack``)."""
    return b"".join(_SLOT.pack(entry.bytes, key.generation, key.key, key.token) for entry, key in keyring.items())


def unpack_keyring(raw: bytes) -> Keyring:
    """``pack_keyring``'s inverse; ``ValueError`` if ``raw`` is not whole slots."""
    if len(raw) % SLOT:
        raise ValueError("not a keyring")
    return {
        entry_id(entry): EntryKey(key, token, generation) for entry, generation, key, token in _SLOT.iter_unpack(raw)
    }


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
        self,
        scope: uuid.UUID,
        *,
        entries: Collection[uuid.UUID] = (),
        before: int | None = None,
        fence: Fence | None = None,
    ) -> None:
        """Destroy the keys of ``entries``, and every key written under a generation below ``before``, including
        every copy the store keeps of earlier keyrings, and record ``fence`` as the scope's last erasure in the same
        write (``fenced``). Idempotent; keys written since are never touched."""
        ...

    async def destroyed(
        self, scope: uuid.UUID, *, entries: Collection[uuid.UUID] = (), before: int | None = None
    ) -> bool:
        """Whether the store can no longer give back any of those keys, from the keyring or a kept copy of it."""
        ...

    async def check(self) -> None:
        """Refuse (``key_unavailable``) unless the store can serve: reachable, authorized, configured."""
        ...

    async def bound(self) -> Binding | None:
        """The binding this key store recorded (its own id and the memory database it serves), or ``None`` before
        its first ``bind``. Writes nothing."""
        ...

    async def bind(self, database: uuid.UUID) -> Binding:
        """Record that this key store serves ``database``, under a fresh id of its own, unless it already records
        a binding; returns the binding recorded (the first writer's: never overwritten, whatever ``database``)."""
        ...

    async def close(self) -> None: ...


def covered(entry: uuid.UUID, key: EntryKey, entries: Collection[uuid.UUID], before: int | None) -> bool:
    """Whether an erasure of ``entries`` and of what was written below ``before`` covers this key (never the
    keyring's record of its last erasure, which is no key)."""
    return entry != FENCE and (entry in entries or (before is not None and key.generation < before))


def unavailable(cause: Cause) -> GovernedMemoryError:
    return GovernedMemoryError(Reason.KEY_UNAVAILABLE, cause=cause)


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


async def off_loop(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Blocking I/O (files, the HTTP client) in a worker thread; an ``OSError`` is ``key_unavailable``."""
    try:
        return await asyncio.to_thread(function, *args, **kwargs)
    except GovernedMemoryError:
        raise
    except (OSError, ValueError, KeyError) as error:
        raise unavailable(Cause.UNREACHABLE if not isinstance(error, OSError) else Cause.IO_ERROR) from None
