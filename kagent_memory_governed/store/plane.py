"""``LocalPlane``: the data plane over a ``Store`` (``service.plane.DataPlane``), in the agent's process or behind
the memory service's verification. Each operation is admitted before any embedding work (R21), then embedded, then
searched or written: one path for both modes, so admission is decided where the embedding capacity is spent.

Inputs are checked before admission: a query or fact past its byte bound, too many of them, or no embedder for
the caller, is refused with nothing admitted or embedded."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy
from numpy.typing import NDArray

from kagent_memory_governed import metering
from kagent_memory_governed.embedding import Embedder, fit
from kagent_memory_governed.errors import Cause, GovernedMemoryError, Operation, Reason, Result
from kagent_memory_governed.policy import Policy, admit_fact, admit_int
from kagent_memory_governed.service.plane import (
    EXPLICIT,
    SEARCH_MIN_SCORE,
    SEARCH_TOP_K,
    SEARCHES,
    WRITES,
    RequestScope,
)
from kagent_memory_governed.service.values import Hit, Turn
from kagent_memory_governed.store.values import NewFact

if TYPE_CHECKING:
    from kagent_memory_governed.store import Store


class LocalPlane:
    """The ``DataPlane`` over ``store``, embedding with ``embedder`` (``None``: every recall and remember is refused
    ``embedding_failed (not_configured)`` until ``embed_with``)."""

    token_bound = False  # nothing verifies the scope's token again in process

    def __init__(self, store: Store, embedder: Embedder | None = None) -> None:
        self.store = store
        self._embedder = embedder

    @property
    def policy(self) -> Policy:
        return self.store.policy

    def limit_expiry(self, seconds: int) -> None:
        self.store.limit_expiry(seconds)

    def embed_with(self, embedder: Embedder) -> None:
        if self._embedder is None:
            self._embedder = embedder

    async def recall(self, scope: RequestScope, queries: Sequence[str], operation: Operation) -> list[list[Hit]]:
        _within(operation, SEARCHES)
        policy = self.policy
        if not queries or len(queries) > policy.prefetch_max_subqueries:
            raise GovernedMemoryError(Reason.BAD_INPUT)
        for query in queries:
            if not isinstance(query, str) or not query.strip() or _bytes(query) > policy.prefetch_max_query_bytes:
                raise GovernedMemoryError(Reason.BAD_INPUT)
        embedder = self._configured()
        await self._admit(scope, operation, len(queries))
        vectors = await _embed(embedder, list(queries))
        return await self.store.search_many(  # every query in one statement: one fence, one snapshot
            scope.key, scope.generation, vectors, top_k=SEARCH_TOP_K, min_score=SEARCH_MIN_SCORE
        )

    async def remember(
        self, scope: RequestScope, facts: Sequence[str], operation: Operation, *, expires_in: int | None = None
    ) -> list[uuid.UUID]:
        _within(operation, WRITES)
        texts = [admit_fact(fact, self.policy) for fact in facts]
        if not texts or len(texts) > self.policy.entry_cap:
            raise GovernedMemoryError(Reason.BAD_INPUT)
        if expires_in is not None:
            admit_int(expires_in, low=1, high=2**63 - 1)  # refused here, before anything is admitted
        embedder = self._configured()
        await self._admit(scope, operation, len(texts))
        vectors = await _embed(embedder, texts)
        written = [NewFact(text, vector) for text, vector in zip(texts, vectors, strict=True)]
        return await self.store.write(scope.key, scope.generation, written, expires_in=expires_in)

    async def admit_summary(self, scope: RequestScope) -> None:
        await self.store.admit(scope.key, scope.generation, Operation.SUMMARIZE, units=1)

    async def record(self, scope: RequestScope, session_id: str, invocation_id: str, *, recalled: bool) -> int:
        return await self.store.record_turn(scope.key, scope.generation, session_id, invocation_id, recalled=recalled)

    async def collect(self, scope: RequestScope, session_id: str, candidates: Sequence[str]) -> list[Turn]:
        return await self.store.collect_turns(scope.key, scope.generation, session_id, candidates)

    async def _admit(self, scope: RequestScope, operation: Operation, units: int) -> None:
        explicit = operation in EXPLICIT
        await self.store.admit(scope.key, scope.generation, operation, units=units, explicit=explicit)

    def _configured(self) -> Embedder:
        if self._embedder is None:
            raise GovernedMemoryError(Reason.EMBEDDING_FAILED, cause=Cause.NOT_CONFIGURED)
        return self._embedder


async def _embed(embedder: Embedder, texts: list[str]) -> list[NDArray[numpy.float32]]:
    """``texts`` embedded and fitted to 768 dimensions (``embedding.fit``); ``embedding_failed`` with a content-free
    cause otherwise, whatever the embedder raised (its text is never kept)."""
    try:
        vectors = fit(await embedder(texts), len(texts))
    except GovernedMemoryError as failed:
        metering.count(Operation.EMBED, Result.FAILED, Reason.EMBEDDING_FAILED, len(texts))
        raise GovernedMemoryError(Reason.EMBEDDING_FAILED, cause=failed.cause) from None
    except Exception:
        metering.count(Operation.EMBED, Result.FAILED, Reason.EMBEDDING_FAILED, len(texts))
        raise GovernedMemoryError(Reason.EMBEDDING_FAILED) from None
    metering.count(Operation.EMBED, Result.OK, amount=len(texts))
    return vectors


def _within(operation: Operation, allowed: frozenset[Operation]) -> None:
    if operation not in allowed:
        raise GovernedMemoryError(Reason.BAD_INPUT)


def _bytes(text: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise GovernedMemoryError(Reason.BAD_INPUT) from None
