"""``GovernedMemoryService``: google-adk's ``BaseMemoryService`` over the governed store.

Every call acts on the scope verified for the running request (``request.current()``) and never on
the ``app_name``/``user_id`` the caller passes, which are only checked for consistency. Consent is
checked before any model or embedding work; the store fences again when it reads or writes. It never
talks to kagent's ``/api/memories``. Memory is a ``DataPlane`` (``service.plane``), one call an operation: the
in-process ``LocalPlane`` over the ``Store``, or the memory service's ``RemoteStore``, where the service admits and
embeds; the same calls, the same answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
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
from kagent_memory_governed.embedding import Embedder
from kagent_memory_governed.errors import GovernedMemoryError, Operation, Reason, Result
from kagent_memory_governed.policy import Policy, admit_fact
from kagent_memory_governed.service.plane import DataPlane

logger = logging.getLogger(__name__)
# an auto-save through the service must finish while the request's scope token is accepted (its expiry plus the
# leeway): one is started only with at least this much of the token's life left (docs/decisions/0001)
AUTOSAVE_MIN_TOKEN_SECONDS = 60


def kagent_embedder(config: EmbeddingConfig) -> Embedder:
    """Upstream's ``KAgentEmbedding`` (768-d, normalized) for the Agent's ``memory.embedding``."""
    client = KAgentEmbedding(config)

    async def embed(texts: list[str]) -> list[list[float]]:
        vectors = await client.generate(texts)  # a list in, a list of vectors out ([] on any failure)
        return [list(vector) for vector in vectors if isinstance(vector, list)]

    return embed


class GovernedMemoryService(BaseMemoryService):
    """Memory for consented scopes only; every other request gets a reason code and no memory."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self._background: set[asyncio.Task[None]] = set()

    @property
    def policy(self) -> Policy:
        """The effective policy: the plane's, which an Agent's ``ttl_days`` may have lowered (its one owner)."""
        return self.plane.policy

    def configure_embedding(self, config: EmbeddingConfig | None) -> None:
        """In process, embed with upstream's client for the Agent's ``memory.embedding``, unless an embedder was
        given at activation (tests, BYO agents) or one is configured already; through the service, nothing."""
        if config is not None:
            self.plane.embed_with(kagent_embedder(config))

    def configure(self, memory: MemoryConfig | None) -> None:
        """Take the Agent's ``memory`` config: its embedding, and its ``ttl_days``, which lowers the expiry
        ceiling where it is stricter than the policy (never raises it past 7 days)."""
        if memory is None:
            return
        self.configure_embedding(memory.embedding)
        if memory.ttl_days:
            self.plane.limit_expiry(memory.ttl_days * 24 * 3600)

    # -- google-adk / kagent entry points --------------------------------------------------------

    async def search_memory(self, *, app_name: str, user_id: str, query: str) -> SearchMemoryResponse:
        """Search the request's scope with ``query``, cut to ``prefetch_max_query_bytes`` as ``load_memory`` cuts it.
        Raises ``GovernedMemoryError`` when memory is refused."""
        clipped = conversation.clip_utf8(query, self.policy.prefetch_max_query_bytes)
        return SearchMemoryResponse(memories=await self.search(self._scope(user_id), [clipped], Operation.LOAD))

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
            waiting = await self.plane.record(scope, session.id, invocation_id, recalled=recalled)
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
        """Entries of ``scope`` matching any of ``queries``, de-duplicated, best first, in one call of the plane:
        admitted before the queries are embedded (one unit each; an explicit ``load`` is also rate limited per
        sender and agent)."""
        try:
            hits = await self.plane.recall(scope, queries, operation)
        except GovernedMemoryError as refused:
            metering.count(operation, Result.REFUSED, refused.reason)
            raise
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
        """Store ``texts`` in ``scope`` (all or none) in one call of the plane, admitted before they are embedded:
        one unit per fact, and an explicit ``save`` is also rate limited per sender and agent. A fact past its bound
        is refused here, before any call."""
        try:
            facts = [admit_fact(text, self.policy) for text in texts]
            if not facts:
                raise GovernedMemoryError(Reason.BAD_INPUT)
            await self.plane.remember(scope, facts, operation)
        except GovernedMemoryError as refused:
            metering.count(operation, Result.REFUSED, refused.reason)
            raise
        metering.count(operation, Result.OK)

    async def _autosave(self, scope: RequestScope, session_id: str, events: list[Event], model: BaseLlm) -> None:
        redaction.enter(True)  # this task's own context: background memory work
        try:
            candidates = list(dict.fromkeys(event.invocation_id for event in events if event.invocation_id))
            turns = await self.plane.collect(scope, session_id, candidates)
            collected = {turn.invocation_id: turn.recalled for turn in turns}
            tail = conversation.conversation_tail(events, self.policy.autosave_max_input_bytes, collected)
            if not tail:
                return
            await self._admit_summary(scope)  # the summarization is one unit, admitted before the model runs
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

    async def _admit_summary(self, scope: RequestScope) -> None:
        try:
            await self.plane.admit_summary(scope)
        except GovernedMemoryError as refused:
            metering.count(Operation.SUMMARIZE, Result.REFUSED, refused.reason)
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

    def _token_too_short(self, scope: RequestScope) -> bool:
        """Through the service, whether the request's token expires before an auto-save could finish."""
        if scope.expires_at is None or not self.plane.token_bound:
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
