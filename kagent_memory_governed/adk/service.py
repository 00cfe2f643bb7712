"""``GovernedMemoryService``: google-adk's ``BaseMemoryService`` over the governed store.

Every call acts on the scope verified for the running request (``request.current()``) and never on
the ``app_name``/``user_id`` the caller passes, which are only checked for consistency. Consent is
checked before any model or embedding work; the store fences again when it reads or writes. It never
talks to kagent's ``/api/memories``. The store is the in-process ``Store`` or the memory service's
``RemoteStore`` (``mode.connect``); the same calls, the same answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from google.adk.events import Event
from google.adk.memory import BaseMemoryService
from google.adk.memory.base_memory_service import SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.models.base_llm import BaseLlm
from google.adk.sessions import Session
from google.genai import types
from kagent.adk.models import KAgentEmbedding
from kagent.adk.types import EmbeddingConfig, MemoryConfig

from kagent_memory_governed import clock, metering, redaction
from kagent_memory_governed.adk import conversation
from kagent_memory_governed.adk.request import RequestScope, current
from kagent_memory_governed.errors import GovernedMemoryError, Operation, Reason, Result
from kagent_memory_governed.policy import Policy, admit_fact
from kagent_memory_governed.service.remote import RemoteStore
from kagent_memory_governed.store import Store

Embedder = Callable[[list[str]], Awaitable[list[list[float]]]]
logger = logging.getLogger(__name__)

EXPLICIT = frozenset({Operation.LOAD, Operation.SAVE})  # asked for by the model: also rate limited per sender
SEARCH_TOP_K = 5
SEARCH_MIN_SCORE = 0.3
# an auto-save through the service must finish while the request's scope token is accepted (its expiry plus the
# leeway): one is started only with at least this much of the token's life left (docs/decisions/0001)
AUTOSAVE_MIN_TOKEN_SECONDS = 60


@dataclass(frozen=True, slots=True)
class _Fact:
    """A fact to write, as both stores take it (``store.NewFact``'s fields)."""

    text: str
    embedding: Sequence[float]


def kagent_embedder(config: EmbeddingConfig) -> Embedder:
    """Upstream's ``KAgentEmbedding`` (768-d, normalized) for the Agent's ``memory.embedding``."""
    client = KAgentEmbedding(config)

    async def embed(texts: list[str]) -> list[list[float]]:
        vectors = await client.generate(texts)  # a list in, a list of vectors out
        return [list(vector) for vector in vectors if isinstance(vector, list)]

    return embed


class GovernedMemoryService(BaseMemoryService):
    """Memory for consented scopes only; every other request gets a reason code and no memory."""

    def __init__(self, store: Store | RemoteStore, embedder: Embedder | None) -> None:
        self.store = store
        self._embedder = embedder
        self._background: set[asyncio.Task[None]] = set()

    @property
    def policy(self) -> Policy:
        """The effective policy: the store's, which an Agent's ``ttl_days`` may have lowered (its one owner)."""
        return self.store.policy

    def configure_embedding(self, config: EmbeddingConfig | None) -> None:
        """Embed with upstream's client for the Agent's ``memory.embedding``, unless an embedder was
        given at activation (tests, BYO agents) or one is configured already."""
        if self._embedder is None and config is not None:
            self._embedder = kagent_embedder(config)

    def configure(self, memory: MemoryConfig | None) -> None:
        """Take the Agent's ``memory`` config: its embedding, and its ``ttl_days``, which lowers the expiry
        ceiling where it is stricter than the policy (never raises it past 7 days)."""
        if memory is None:
            return
        self.configure_embedding(memory.embedding)
        if memory.ttl_days:
            self.store.limit_expiry(memory.ttl_days * 24 * 3600)

    # -- google-adk / kagent entry points --------------------------------------------------------

    async def search_memory(self, *, app_name: str, user_id: str, query: str) -> SearchMemoryResponse:
        """Search the request's scope. Raises ``GovernedMemoryError`` when memory is refused."""
        return SearchMemoryResponse(memories=await self.search(self._scope(user_id), [query], Operation.LOAD))

    async def add_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        content: str | None = None,
        metadata: Any = None,
        memories: Sequence[MemoryEntry] | None = None,
        custom_metadata: Any = None,
    ) -> None:
        """Save facts to the request's scope; accepts kagent's ``content=`` and ADK's ``memories=`` forms."""
        texts = [content] if content is not None else [_text(memory.content) for memory in memories or []]
        await self.save(self._scope(user_id), texts, Operation.SAVE)

    async def add_session_to_memory(self, session: Session, model: BaseLlm | None = None) -> None:
        """Schedule an auto-save of ``session`` under the request's scope and generation, captured now.
        It summarizes only the turns admitted under that scope and generation that no auto-save has
        collected yet (R36). Without a scope or a model nothing is scheduled and no model call is made."""
        scope = current()
        if scope is None or scope.key.principal.mxid != session.user_id or model is None:
            metering.count(
                Operation.AUTOSAVE, Result.REFUSED, Reason.NO_ASSERTION if scope is None else Reason.SCOPE_MISMATCH
            )
            return
        if self._token_too_short(scope):  # the service would refuse it before the summary is written
            metering.count(Operation.AUTOSAVE, Result.REFUSED, Reason.ASSERTION_EXPIRING)
            return
        events = list(session.events)  # the conversation as of now; the task must not see later turns
        task = asyncio.create_task(self._autosave(scope, session.id, events, model), name="governed-memory-autosave")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def end_turn(self, session: Session, invocation_id: str, model: BaseLlm | None, *, recalled: bool) -> None:
        """Record that this invocation of ``session`` ran admitted under the request's scope and generation,
        then auto-save once ``autosave_every_user_turns`` such turns await collection. Never raises: the
        chat goes on without memory."""
        scope = current()
        if scope is None or scope.key.principal.mxid != session.user_id:
            return
        try:
            waiting = await self.store.record_turn(
                scope.key, scope.generation, session.id, invocation_id, recalled=recalled
            )
        except GovernedMemoryError as refused:
            metering.count(Operation.TURN, Result.REFUSED, refused.reason)
            return
        if waiting >= self.policy.autosave_every_user_turns:
            await self.add_session_to_memory(session, model)

    async def drain(self) -> None:
        """Wait for scheduled auto-saves (tests and shutdown)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    # -- governed operations -------------------------------------------------------------------------

    async def search(self, scope: RequestScope, queries: list[str], operation: Operation) -> list[MemoryEntry]:
        """Entries of ``scope`` matching any of ``queries``, de-duplicated, best first. Each query is one
        unit of the hourly ceiling; an explicit ``load`` is also rate limited per sender and agent."""
        await self._admit(scope, operation, units=len(queries), explicit=operation in EXPLICIT)
        vectors = await self._embed(queries)
        hits = await self.store.search_many(  # every query in one statement: one fence, one snapshot
            scope.key, scope.generation, vectors, top_k=SEARCH_TOP_K, min_score=SEARCH_MIN_SCORE
        )
        found: dict[str, tuple[float, MemoryEntry]] = {}
        for hit in (hit for each in hits for hit in each):
            entry_id = str(hit.entry_id)
            entry = MemoryEntry(
                id=entry_id,
                content=types.Content(role="user", parts=[types.Part(text=hit.text)]),
                timestamp=hit.created_at.isoformat(),
            )
            if entry_id not in found or found[entry_id][0] < hit.score:
                found[entry_id] = (hit.score, entry)
        metering.count(operation, Result.OK)
        return [entry for _, entry in sorted(found.values(), key=lambda pair: -pair[0])]

    async def save(self, scope: RequestScope, texts: Sequence[object], operation: Operation) -> None:
        """Store ``texts`` in ``scope`` (all or none), admitted before they are embedded: one unit per fact,
        and an explicit ``save`` is also rate limited per sender and agent."""
        try:
            facts = [admit_fact(text, self.policy) for text in texts]
            if not facts:
                raise GovernedMemoryError(Reason.BAD_INPUT)
        except GovernedMemoryError as refused:
            metering.count(operation, Result.REFUSED, refused.reason)
            raise
        await self._admit(scope, operation, units=len(facts), explicit=operation in EXPLICIT)
        vectors = await self._embed(facts)
        await self.store.write(scope.key, scope.generation, [_Fact(t, v) for t, v in zip(facts, vectors, strict=True)])
        metering.count(operation, Result.OK)

    async def _autosave(self, scope: RequestScope, session_id: str, events: list[Event], model: BaseLlm) -> None:
        redaction.enter(True)  # this task's own context: background memory work
        try:
            candidates = list(dict.fromkeys(event.invocation_id for event in events if event.invocation_id))
            turns = await self.store.collect_turns(scope.key, scope.generation, session_id, candidates)
            collected = {turn.invocation_id: turn.recalled for turn in turns}
            tail = conversation.conversation_tail(events, self.policy.autosave_max_input_bytes, collected)
            if not tail:
                return
            await self._admit(scope, Operation.SUMMARIZE, units=1)  # the summarization is one unit
            facts, dropped = conversation.facts_from_summary(await self._summarize(model, tail), self.policy)
            if dropped:
                metering.count(Operation.AUTOSAVE, Result.REFUSED, Reason.FACT_TOO_LARGE, dropped)
            if facts:
                await self.save(scope, facts, Operation.AUTOSAVE)
        except GovernedMemoryError as refused:
            logger.info("auto-save refused: %s", refused.reason.value)
        except Exception as error:  # a background task must fail closed and content-free
            metering.count(Operation.AUTOSAVE, Result.FAILED)
            logger.warning("auto-save failed: %s", type(error).__name__)

    # -- model and embedding calls, admitted first ---------------------------------------------------

    async def _admit(self, scope: RequestScope, operation: Operation, *, units: int, explicit: bool = False) -> None:
        try:
            await self.store.admit(scope.key, scope.generation, operation, units=units, explicit=explicit)
        except GovernedMemoryError as refused:
            metering.count(operation, Result.REFUSED, refused.reason)
            raise

    async def _summarize(self, model: BaseLlm, tail: str) -> str:
        request = conversation.summary_request(tail, self.policy, model.model)
        parts: list[str] = []
        try:
            async for response in model.generate_content_async(request, stream=False):
                if response.error_code and not (response.content and response.content.parts):
                    raise GovernedMemoryError(Reason.MODEL_FAILED)  # kagent's adapters answer errors, not raise
                parts += [
                    part.text for part in (response.content.parts if response.content else None) or [] if part.text
                ]
        except Exception:
            metering.count(Operation.SUMMARIZE, Result.FAILED, Reason.MODEL_FAILED)
            raise GovernedMemoryError(Reason.MODEL_FAILED) from None
        metering.count(Operation.SUMMARIZE, Result.OK)
        return "".join(parts)

    async def _embed(self, texts: list[str]) -> list[list[float]]:
        if self._embedder is None:
            raise GovernedMemoryError(Reason.EMBEDDING_FAILED)
        try:
            vectors = await self._embedder(texts)
        except Exception:
            vectors = []
        if len(vectors) != len(texts):
            metering.count(Operation.EMBED, Result.FAILED, Reason.EMBEDDING_FAILED, len(texts))
            raise GovernedMemoryError(Reason.EMBEDDING_FAILED)
        metering.count(Operation.EMBED, Result.OK, amount=len(texts))
        return vectors

    def _token_too_short(self, scope: RequestScope) -> bool:
        """Through the service, whether the request's token expires before an auto-save could finish."""
        if scope.expires_at is None or not isinstance(self.store, RemoteStore):
            return False
        return (scope.expires_at - clock.now()).total_seconds() < AUTOSAVE_MIN_TOKEN_SECONDS

    @staticmethod
    def _scope(user_id: str) -> RequestScope:
        scope = current()
        if scope is None:
            raise GovernedMemoryError(Reason.NO_ASSERTION)
        if scope.key.principal.mxid != user_id:
            raise GovernedMemoryError(Reason.SCOPE_MISMATCH)
        return scope


def _text(content: types.Content | None) -> str:
    return " ".join(part.text for part in (content.parts if content and content.parts else []) if part.text)
