"""Entries as the database holds them: sealed, each under a key of its own that lives in the key store (R42).

An entry's text and embedding are one AES-256-GCM ciphertext (``nonce || ciphertext || tag``) with the scope id
and the entry id as associated data, so a sealed entry cannot be moved to another scope or entry. Its key is
used for that entry only. What reaches the database is the ciphertext, its ids and its times: never the text,
the embedding, a digest of either, or a query vector. Search therefore ranks in the process, after opening the
scope's live entries (at most ``entry_cap``, 100): exact cosine similarity, ties broken by entry id as before.

``Keyrings`` keeps the scopes' keyrings this process fetched, each for the consent generation it was fetched
under. A read is fenced at a generation in the statement that returns its ciphertexts, and every erasure
advances the generation before it settles, so a keyring kept for an earlier generation never opens what a read
returns after an erasure, on any replica; it is fetched again instead. A kept keyring is the only copy of a key
in a process: the replica that erases drops it when the erasure starts, every other replica at most ``ttl``
(60 s) after it fetched it, by a timer on the event loop whether or not the scope is read again, and every
replica drops all it keeps once another database server answers (``Keyrings.serving``: a failover or a restore
may bring back rows whose keys the key store destroyed since). No cipher and no other copy of a key is cached anywhere.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import numpy
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from kagent_memory_governed.keys import EntryKey, Keyring, KeyStore
from kagent_memory_governed.keys.keyring import KEY_BYTES
from kagent_memory_governed.policy import EMBEDDING_DIMENSIONS

_ENTRY = b"kagent-memory-governed/entry/1"
_FACT = b"kagent-memory-governed/fact/1"
_VECTOR_BYTES = 4 * EMBEDDING_DIMENSIONS
OVERHEAD = 12 + 2 + 16  # nonce, text length, tag
SEALED_MIN = OVERHEAD + 1 + _VECTOR_BYTES  # a fact of one byte
SEALED_MAX = OVERHEAD + 512 + _VECTOR_BYTES  # a fact at the 512-byte ceiling


def new_key(fact: str, scope: uuid.UUID, generation: int) -> EntryKey:
    """A fresh key for one entry holding ``fact``, written under ``generation``."""
    return EntryKey(AESGCM.generate_key(8 * KEY_BYTES), token(scope, fact), generation)


def token(scope: uuid.UUID, fact: str) -> bytes:
    """Which fact an entry holds, for recognizing a fact saved again; kept in the key store only."""
    return hashlib.sha256(_FACT + scope.bytes + fact.encode("utf-8")).digest()[:16]


def seal(key: EntryKey, scope: uuid.UUID, entry: uuid.UUID, fact: str, embedding: numpy.ndarray) -> bytes:
    text = fact.encode("utf-8")
    body = len(text).to_bytes(2, "big") + text + embedding.astype("<f4", copy=False).tobytes()
    nonce = os.urandom(12)
    return nonce + AESGCM(key.key).encrypt(nonce, body, _ENTRY + scope.bytes + entry.bytes)


class Opened(NamedTuple):
    entry_id: uuid.UUID
    text: str
    embedding: numpy.ndarray  # a row of the matrix ``open_entries`` fills, single precision
    created_at: datetime
    expires_at: datetime


SealedRow = tuple[uuid.UUID, bytes, datetime, datetime]  # entry id, sealed, created, expires: ``Row`` or a tuple


class Row(NamedTuple):
    """A sealed entry as the database returns it."""

    entry_id: uuid.UUID
    sealed: bytes
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Batch:
    """The entries a keyring opened, in entry-id order: ids, texts (UTF-8, decoded on demand), embeddings as the
    rows of one single-precision matrix, and times."""

    ids: list[uuid.UUID]
    texts: list[bytes]
    matrix: numpy.ndarray
    created_at: list[datetime]
    expires_at: list[datetime]

    def entry(self, i: int) -> Opened:
        return Opened(
            self.ids[i], self.texts[i].decode("utf-8"), self.matrix[i], self.created_at[i], self.expires_at[i]
        )


def open_batch(scope: uuid.UUID, rows: Iterable[SealedRow], keyring: Keyring) -> Batch:
    """The rows (``entry_id``, ``sealed``, ``created_at``, ``expires_at``) that ``keyring`` opens, in entry-id
    order. A row without its key (its erasure or expiry is under way, or the key store lost it) or whose
    ciphertext does not authenticate is left out: never shown, never guessed."""
    prefix = _ENTRY + scope.bytes
    listed = sorted(rows, key=_by_id)
    matrix = numpy.empty((max(len(listed), 1), EMBEDDING_DIMENSIONS), dtype="<f4")
    into = matrix.data.cast("B")  # each opened embedding is copied straight into its row
    ids: list[uuid.UUID] = []
    texts: list[bytes] = []
    created: list[datetime] = []
    expires: list[datetime] = []
    for entry, sealed, created_at, expires_at in listed:
        key = keyring.get(entry)
        if key is None:
            continue
        view = memoryview(sealed)
        try:
            # a cipher a call, never cached: a cache would keep an erased entry's key past its keyring (0.9 us
            # an entry, 0.09 ms a search of 100)
            body = AESGCM(key.key).decrypt(view[:12], view[12:], prefix + entry.bytes)
        except InvalidTag:
            continue
        size = 2 + int.from_bytes(body[:2], "big")
        at = len(ids) * _VECTOR_BYTES
        into[at : at + _VECTOR_BYTES] = memoryview(body)[size:]
        ids.append(entry)
        texts.append(body[2:size])
        created.append(created_at)
        expires.append(expires_at)
    return Batch(ids, texts, matrix[: len(ids)], created, expires)


def open_entries(scope: uuid.UUID, rows: Iterable[SealedRow], keyring: Keyring) -> list[Opened]:
    """``open_batch``, entry by entry."""
    batch = open_batch(scope, rows, keyring)
    return [batch.entry(i) for i in range(len(batch.ids))]


def _by_id(row: SealedRow) -> uuid.UUID:
    return row[0]


# the single-precision pass's error on a cosine distance is below 2e-4 for any two admitted embeddings (768 terms,
# squared norms finite and normal in single precision: ``policy.admit_embedding``; the norms' product is formed in
# double precision); candidates are kept within five times that of the ``top_k``-th nearest
_MARGIN = 1e-3


def rank(
    batch: Batch, queries: Sequence[numpy.ndarray], *, top_k: int, max_distance: float
) -> list[list[tuple[int, float]]]:
    """For each query, the ``top_k`` entries of ``batch`` (by index) nearest by cosine distance (``1 - cos``, as
    pgvector's ``<=>``) within ``max_distance``, nearest first, ties by entry id (the batch is in entry-id order
    and the sort is stable). Exact in double precision: a single-precision pass over the whole batch keeps every
    entry within ``_MARGIN`` of the ``top_k``-th nearest, and only those are ranked in double precision, which
    gives the same entries, order and distances as ranking them all in double precision at a fraction of its
    cost."""
    if not batch.ids:
        return [[] for _ in queries]
    matrix = batch.matrix
    asked = numpy.stack(queries).astype(numpy.float32)
    # einsum, not BLAS: for at most 8 x 100 products a threaded BLAS costs more in waking threads than it saves
    squares = numpy.einsum("nd,nd->n", matrix, matrix)
    norms = numpy.sqrt(numpy.einsum("qd,qd->q", asked, asked)[:, None].astype(numpy.float64) * squares)
    rough = 1.0 - numpy.einsum("qd,nd->qn", asked, matrix) / norms
    found = []
    for query, row in zip(queries, rough, strict=True):
        if len(row) <= top_k:
            candidates = numpy.arange(len(row))
        else:
            candidates = numpy.flatnonzero(row <= numpy.partition(row, top_k - 1)[top_k - 1] + _MARGIN)
        exact = _distances(query, matrix[candidates])
        order = numpy.argsort(exact, kind="stable")[:top_k]
        found.append([(int(candidates[i]), float(exact[i])) for i in order if exact[i] <= max_distance])
    return found


def _distances(query: numpy.ndarray, rows: numpy.ndarray) -> numpy.ndarray:
    """Cosine distances of ``rows`` to ``query`` in double precision."""
    asked = query.astype(numpy.float64)
    wide = rows.astype(numpy.float64)
    dots = numpy.einsum("d,nd->n", asked, wide)
    distances: numpy.ndarray = 1.0 - dots / (
        numpy.sqrt(asked @ asked) * numpy.sqrt(numpy.einsum("nd,nd->n", wide, wide))
    )
    return distances


class Keyrings:
    """The keyrings this process fetched, each kept for the consent generation it was fetched under, for at most
    ``ttl`` seconds (then dropped by a timer, read or not) and at most ``size`` scopes, and only while the same
    database server answers (``serving``). ``ring`` joins a fetch under way; a keyring lacking a key a read needs
    is fetched once more (another replica wrote meanwhile)."""

    def __init__(self, store: KeyStore, *, ttl: float = 60.0, size: int = 4096) -> None:
        self.store = store
        self.ttl = ttl
        self._size = size
        self._kept: OrderedDict[uuid.UUID, tuple[int, float, asyncio.Task[Keyring], Keyring]] = OrderedDict()
        self._server: object = None

    def start(self, scope: uuid.UUID, generation: int) -> asyncio.Task[Keyring]:
        """Begin fetching the scope's keyring for ``generation``, or join the fetch kept for it."""
        kept = self._kept.get(scope)
        loop = asyncio.get_running_loop()
        if kept is not None:
            at_generation, fetched, task, _ = kept
            fresh = time.monotonic() - fetched < self.ttl
            failed = task.done() and (task.cancelled() or task.exception() is not None)
            if at_generation == generation and fresh and not failed and task.get_loop() is loop:
                self._kept.move_to_end(scope)
                return task
        task = loop.create_task(self.store.fetch(scope))
        task.add_done_callback(retrieve)
        fetched = time.monotonic()
        self._kept[scope] = (generation, fetched, task, {})
        # the bound holds on a replica nobody reads from; the timer holds no reference to the keyring
        loop.call_later(self.ttl, self._expire, scope, fetched)
        while len(self._kept) > self._size:
            self._kept.popitem(last=False)
        return task

    def cancel(self, scope: uuid.UUID, task: asyncio.Task[Keyring]) -> None:
        """Keep nothing of a fetch whose work was refused (others awaiting it still get its answer)."""
        kept = self._kept.get(scope)
        if kept is not None and kept[2] is task:
            del self._kept[scope]

    async def ring(
        self,
        scope: uuid.UUID,
        generation: int,
        *,
        needs: Collection[uuid.UUID] = (),
        task: asyncio.Task[Keyring] | None = None,
    ) -> Keyring:
        """The scope's keyring for a read or write fenced at ``generation``; fetched again, once, if it lacks a key
        of ``needs``."""
        held = self._kept.get(scope)
        if task is None or held is None or held[2] is not task:  # dropped meanwhile: it may be from before
            task = self.start(scope, generation)
        kept: Keyring = await asyncio.shield(task)  # shared: a caller's cancellation stays its own
        keyring = kept | self._extra(scope, task)
        if any(entry not in keyring for entry in needs):
            self.drop(scope)
            keyring = await self.start(scope, generation)
        return keyring

    def add(self, scope: uuid.UUID, generation: int, keys: Mapping[uuid.UUID, EntryKey]) -> None:
        """Keys this process stored for ``scope`` under ``generation``: part of the kept keyring from now on."""
        kept = self._kept.get(scope)
        if kept is not None and kept[0] == generation:
            kept[3].update(keys)

    def drop(self, scope: uuid.UUID) -> None:
        self._kept.pop(scope, None)

    def clear(self) -> None:
        """Keep nothing: the database may have gone back in time (``Database``)."""
        self._kept.clear()

    def serving(self, server: object) -> None:
        """The database server that answered a statement of the hot path (its start time: ``functions.SERVER``).
        Another than the one before, or the first, drops every kept keyring, fetches under way included: after a
        failover, a restore or a restart the database may be behind the key store, and a keyring kept from before
        an erasure it lost would open the rows it brought back. Exact, with no wait: the statement that first
        reaches the new server drops them before its rows are opened."""
        if server != self._server:
            self._server = server
            self._kept.clear()

    def _expire(self, scope: uuid.UUID, fetched: float) -> None:
        kept = self._kept.get(scope)
        if kept is not None and kept[1] == fetched:
            del self._kept[scope]

    def kept(self) -> dict[uuid.UUID, Keyring]:
        """What this process keeps now, by scope: the fetched keyrings that have answered, with the keys added
        since (for health checks and tests; a copy)."""
        return {
            scope: task.result() | extra
            for scope, (_, _, task, extra) in self._kept.items()
            if task.done() and not task.cancelled() and task.exception() is None
        }

    def _extra(self, scope: uuid.UUID, task: asyncio.Task[Keyring]) -> Keyring:
        kept = self._kept.get(scope)
        return kept[3] if kept is not None and kept[2] is task else {}


def retrieve(task: asyncio.Future[Any]) -> None:
    """A done callback: a failed fetch is raised where it is awaited, never logged as never retrieved."""
    if not task.cancelled():
        task.exception()
