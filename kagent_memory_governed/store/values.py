"""What the store takes and returns: frozen values, no I/O."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from kagent_memory_governed.consent import Erasure
from kagent_memory_governed.limits import MAX_PAGE as MAX_PAGE  # its home is limits, light for the clients
from kagent_memory_governed.service.values import Embedding as Embedding
from kagent_memory_governed.service.values import Hit as Hit  # one class for the store and its remote clients
from kagent_memory_governed.service.values import Turn as Turn

_TURN_NAMESPACE = uuid.UUID("5b0c7e1e-3f2a-4c55-9d7e-6b6d67000001")


@dataclass(frozen=True, slots=True)
class NewFact:
    text: str
    embedding: Embedding


@dataclass(frozen=True, slots=True)
class Grant:
    generation: int
    max_expiry_seconds: int
    entry_cap: int


@dataclass(frozen=True, slots=True)
class ErasureRecord:
    at: datetime
    result: Erasure


@dataclass(frozen=True, slots=True)
class Status:
    enabled: bool
    generation: int
    purpose: str | None
    policy_version: str | None
    max_expiry_seconds: int
    entry_cap: int
    entries: int
    last_erasure: ErasureRecord | None


@dataclass(frozen=True, slots=True)
class Entry:
    entry_id: uuid.UUID
    text: str
    source_scope: str
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Page:
    entries: list[Entry]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class Erased:
    generation: int
    erased: int


@dataclass(frozen=True, slots=True)
class Offboarded:
    scopes: int
    erased: int


def turn_ref(identifier: str) -> uuid.UUID:
    """The content-free reference under which a session or invocation id is recorded."""
    return uuid.uuid5(_TURN_NAMESPACE, identifier)
