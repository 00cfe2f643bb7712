"""The data plane as the runtime sees it (R46): one ``DataPlane`` protocol, two transports.

``store.plane.LocalPlane`` runs it in the agent's process over the ``Store`` (the embedded default, tests, the
demo); ``service.remote.RemoteStore`` reaches the memory service, which runs the same ``LocalPlane`` behind its
verification. Each operation is one call: the plane admits the work (R21), embeds the texts and then searches or
writes, so through the service every operation is one round trip. A request's scope travels as a value
(``RequestScope``: the key and generation the runtime verified, and the token exactly as the bridge signed it, which
the service verifies again), never through hidden context. Imports nothing of the store or the server.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from kagent_memory_governed.embedding import Embedder
from kagent_memory_governed.errors import Operation
from kagent_memory_governed.policy import Policy
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.service.values import Hit, Turn

SEARCHES = frozenset({Operation.PREFETCH, Operation.LOAD})
WRITES = frozenset({Operation.SAVE, Operation.AUTOSAVE})
EXPLICIT = frozenset({Operation.LOAD, Operation.SAVE})  # asked for by the model: also rate limited per sender
SEARCH_TOP_K = 5  # hits per query, fixed where the search runs (ADR 0001)
SEARCH_MIN_SCORE = 0.3


@dataclass(frozen=True, slots=True)
class RequestScope:
    """The consented scope one request may use: its key, the generation it was admitted under, when its token
    expires (``None``: not known) and the token itself as the bridge signed it (``None`` in process, where nothing
    verifies it again; never shown by ``repr``)."""

    key: ScopeKey
    generation: int
    expires_at: datetime | None = None
    token: str | None = field(default=None, repr=False, compare=False)


class DataPlane(Protocol):
    """What the runtime asks of memory, each call acting on the ``RequestScope`` it is given and refusing with a
    ``GovernedMemoryError`` whose reason code is its only text."""

    # whether work on a scope must end while its token is accepted (the service verifies it on every call)
    token_bound: bool

    @property
    def policy(self) -> Policy: ...

    def limit_expiry(self, seconds: int) -> None:
        """Lower the expiry of every later write (an Agent's ``memory.ttlDays``); never raises the ceiling."""

    def embed_with(self, embedder: Embedder) -> None:
        """Embed with ``embedder`` unless one is set (in process: the Agent's ``memory.embedding``); through the
        service, nothing: the service embeds."""

    async def recall(self, scope: RequestScope, queries: Sequence[str], operation: Operation) -> list[list[Hit]]:
        """Admit ``operation`` (``prefetch`` or ``load``, one unit a query), embed ``queries`` and search: the live
        entries nearest each, at most ``SEARCH_TOP_K`` scoring at least ``SEARCH_MIN_SCORE``, best first."""
        ...

    async def remember(
        self, scope: RequestScope, facts: Sequence[str], operation: Operation, *, expires_in: int | None = None
    ) -> list[uuid.UUID]:
        """Admit ``operation`` (``save`` or ``autosave``, one unit a fact), embed ``facts`` and write them, all or
        none; their entry ids in order (a live equal fact answers its own)."""
        ...

    async def admit_summary(self, scope: RequestScope) -> None:
        """Admit an auto-save's summarization, one unit, before the runtime's model writes it."""

    async def record(self, scope: RequestScope, session_id: str, invocation_id: str, *, recalled: bool) -> int:
        """Record that a turn ran admitted under the scope's generation; how many such turns await auto-save."""
        ...

    async def collect(self, scope: RequestScope, session_id: str, candidates: Sequence[str]) -> list[Turn]:
        """Take, once, the admitted turns among ``candidates`` (invocation ids)."""
        ...
