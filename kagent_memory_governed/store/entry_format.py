"""The entry format: an entry as the database holds it, sealed under a key of its own that lives in the key store
(R42).

An entry's text and embedding are one AES-256-GCM ciphertext, ``nonce (12) || ciphertext || tag (16)``, whose
plaintext is ``text length (2, big-endian) || text (UTF-8) || embedding (768 little-endian float32)``. The
associated data is the format's label (``kagent-memory-governed/entry/1``: ``VERSION``), the scope id and the
entry id, so a sealed entry opens only as the entry of the scope it was written for, under the format it was
written in. Its key is used for that entry only. What reaches the database is the ciphertext, its ids and its
times: never the text, the embedding, a digest of either, or a query vector.

The ciphertext carries no version byte: the label in the associated data is the version, so an entry under another
format fails to authenticate rather than open as this one. Entries written by every release since sealing open
here, and what this one writes opens in the previous release (a rolling upgrade reads both ways).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

import numpy
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from kagent_memory_governed.keys import EntryKey, Keyring
from kagent_memory_governed.keys.keyring import KEY_BYTES
from kagent_memory_governed.policy import EMBEDDING_DIMENSIONS

VERSION = 1  # stored in no byte: only in the label, which every release reading these rows must agree on
_ENTRY = b"kagent-memory-governed/entry/%d" % VERSION
# the token's own derivation, versioned apart: a new entry format keeps recognizing the facts saved before it
_FACT = b"kagent-memory-governed/fact/1"
_VECTOR_BYTES = 4 * EMBEDDING_DIMENSIONS
OVERHEAD = 12 + 2 + 16  # nonce, text length, tag
SEALED_MIN = OVERHEAD + 1 + _VECTOR_BYTES  # a fact of one byte (the schema's ``entries_sealed_size``)
SEALED_MAX = OVERHEAD + 512 + _VECTOR_BYTES  # a fact at the 512-byte ceiling


def new_key(fact: str, scope: uuid.UUID, generation: int) -> EntryKey:
    """A fresh key for one entry holding ``fact``, written under ``generation``."""
    return EntryKey(AESGCM.generate_key(8 * KEY_BYTES), token(scope, fact), generation)


def token(scope: uuid.UUID, fact: str) -> bytes:
    """Which fact an entry holds, for recognizing a fact saved again; kept in the key store only."""
    return hashlib.sha256(_FACT + scope.bytes + fact.encode("utf-8")).digest()[:16]


def seal(key: EntryKey, scope: uuid.UUID, entry: uuid.UUID, fact: str, embedding: numpy.ndarray) -> bytes:
    """The ciphertext of ``entry`` of ``scope`` holding ``fact`` and ``embedding`` (as single precision), under
    ``key`` and a fresh nonce: between ``SEALED_MIN`` and ``SEALED_MAX`` bytes for an admitted fact."""
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
