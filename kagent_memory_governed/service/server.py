"""The data plane's service side: ``governed_memory.v1.DataPlane`` over a real ``Store`` (ADR 0001).

Every call is verified here, whatever the runtime checked: the caller's workload identity names the agent
(``Identity``), then the ``x-memory-scope`` token is verified with the package's own ``assertion.verify`` for that
agent as its audience (issuer, signature, lifetime, origin, homeserver, room, generation); the call acts on that
token's scope and generation only, and the store fences the generation in the statement that does the work. No
request field names a principal, a room or an agent.

Each call is served unary (its credentials in its metadata) and as a message on ``Exchange`` (in the message's
own fields), verified alike. A refusal is exactly the reason code: a unary call's status details (with
``wire.STATUS``'s code), an ``Answer``'s ``Refusal`` on the stream. Nothing of a request or a
reply reaches a status, a log line or an exception text: each call runs as memory work (``redaction``), and this
module logs method names and reason codes only. Every handler is bounded in time (``handler_seconds``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kagent_memory_governed import clock, redaction
from kagent_memory_governed.assertion import LEEWAY_SECONDS, Trust, verify
from kagent_memory_governed.embedding import Embedders
from kagent_memory_governed.errors import Cause, GovernedMemoryError, Operation, Reason
from kagent_memory_governed.scope import AgentId, ScopeKey
from kagent_memory_governed.service import data_plane_pb2 as pb
from kagent_memory_governed.service import data_plane_pb2_grpc as pb_grpc
from kagent_memory_governed.service import messages, wire
from kagent_memory_governed.service.plane import EXPLICIT, SEARCHES, WRITES, RequestScope
from kagent_memory_governed.store import NewFact, Store
from kagent_memory_governed.store.plane import LocalPlane

logger = logging.getLogger(__name__)
Reply = TypeVar("Reply")
# Recall and Remember admit, embed and work in one call (``LocalPlane``, as in process). Admit admits a summarization
# (the runtime's own model call) and, for runtimes of the previous release, a search or a write before their
# embedding: the Search or Write that follows takes that admission (the same scope, generation, operation and units,
# within SPENT_SECONDS, once), and one that finds none is admitted and recorded there; load and save are explicit.
ADMITTED = SEARCHES | WRITES | {Operation.SUMMARIZE}
SPENT_SECONDS = 330.0  # what Admit spent waits this long for its call: a scope token's life and leeway at most
SPENT_KEPT = 65536  # admissions awaiting their call; past it the oldest go (their call is then admitted again)
CACHED_SCOPE_TOKENS = 4096  # verified scope tokens kept, by digest: a token lives at most 330 s


class Identity(Protocol):
    """Which agent calls, from the call's metadata (lower-case keys, text values; ``authorization: Bearer …``).
    Refuses ``GovernedMemoryError(bad_identity)`` for a missing or unacceptable token and
    ``GovernedMemoryError(identity_unavailable)`` when it cannot be verified now."""

    async def agent(self, metadata: Mapping[str, str]) -> AgentId: ...


class DataPlane:
    """The servicer. ``public_key``, ``issuer`` and ``homeserver`` are the bridge's (``Settings.trust``); the agent a
    scope token must be for is the caller's, named by ``identity`` on each call."""

    def __init__(
        self,
        store: Store,
        identity: Identity,
        *,
        public_key: Ed25519PublicKey,
        issuer: str,
        homeserver: str,
        embedders: Embedders | None = None,
        handler_seconds: float = wire.DEFAULT_HANDLER_SECONDS,
    ) -> None:
        self._store = store
        self._embedders = embedders
        self._identity = identity
        self._public_key, self._issuer, self._homeserver = public_key, issuer, homeserver
        self._handler_seconds = handler_seconds
        # verified scope tokens by sha256(agent, token): the scope and the window verify accepted it in
        self._scopes: dict[bytes, tuple[RequestScope, float, float]] = {}
        # admissions Admit recorded for a search or a write, awaiting it: their deadlines (monotonic), oldest first
        self._spent: dict[tuple[ScopeKey, int, Operation, bool, int], list[float]] = {}
        self._work: dict[str, Callable[[Any, RequestScope], Awaitable[Any]]] = {
            "recall": self._recall,
            "remember": self._remember,
            "admit": self._admit,
            "search": self._search,
            "write": self._write,
            "record_turn": self._record_turn,
            "collect_turns": self._collect_turns,
        }
        redaction.install_log_boundary()

    # -- the calls, unary or on Exchange ---------------------------------------------------------

    async def Recall(self, request: pb.RecallRequest, context: grpc.aio.ServicerContext) -> pb.SearchReply:
        return await self._unary("recall", request, context, pb.SearchReply)

    async def Remember(self, request: pb.RememberRequest, context: grpc.aio.ServicerContext) -> pb.WriteReply:
        return await self._unary("remember", request, context, pb.WriteReply)

    async def Admit(self, request: pb.AdmitRequest, context: grpc.aio.ServicerContext) -> pb.AdmitReply:
        return await self._unary("admit", request, context, pb.AdmitReply)

    async def Search(self, request: pb.SearchRequest, context: grpc.aio.ServicerContext) -> pb.SearchReply:
        return await self._unary("search", request, context, pb.SearchReply)

    async def Write(self, request: pb.WriteRequest, context: grpc.aio.ServicerContext) -> pb.WriteReply:
        return await self._unary("write", request, context, pb.WriteReply)

    async def RecordTurn(self, request: pb.RecordTurnRequest, context: grpc.aio.ServicerContext) -> pb.RecordTurnReply:
        return await self._unary("record_turn", request, context, pb.RecordTurnReply)

    async def CollectTurns(
        self, request: pb.CollectTurnsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CollectTurnsReply:
        return await self._unary("collect_turns", request, context, pb.CollectTurnsReply)

    async def Policy(self, request: pb.PolicyRequest, context: grpc.aio.ServicerContext) -> pb.PolicyReply:
        return await self._unary("policy", request, context, pb.PolicyReply)

    async def Exchange(self, calls: object, context: grpc.aio.ServicerContext) -> None:
        """The calls of one stream, each verified and answered as its unary call is, as each is done: at most
        ``wire.MAX_PENDING_CALLS`` at once (the stream is not read further meanwhile). When the caller ends the stream,
        what it asked is answered first; when the stream fails, its pending work is cancelled."""
        room = asyncio.Semaphore(wire.MAX_PENDING_CALLS)
        writing = asyncio.Lock()  # one write at a time on a stream
        pending: set[asyncio.Task[None]] = set()

        async def answer(call: pb.Call) -> None:
            try:
                reply = await self._answer(call)
                async with writing:
                    await context.write(reply)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the caller went away: nothing to answer to; the type only
                logger.info("data plane exchange: an answer was not delivered: %s", type(error).__name__)
            finally:
                room.release()

        try:
            while True:
                await room.acquire()
                call = await context.read()
                if not isinstance(call, pb.Call):  # grpc.aio.EOF: the caller ended the stream
                    break
                task = asyncio.create_task(answer(call))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.gather(*pending)
        finally:
            for task in pending:
                task.cancel()

    async def _unary(self, method: str, request: Any, context: grpc.aio.ServicerContext, answer: type[Reply]) -> Reply:
        outcome = await self._do(method, request, lambda: messages.metadata(context))
        if isinstance(outcome, answer):
            return outcome
        refused = outcome if isinstance(outcome, GovernedMemoryError) else GovernedMemoryError(Reason.INTERNAL_ERROR)
        await context.abort(wire.status(refused.reason), refused.reason.value)
        raise AssertionError("abort raises")  # pragma: no cover

    async def _answer(self, call: pb.Call) -> pb.Answer:
        method = call.WhichOneof("request")
        if method is None:
            return pb.Answer(id=call.id, refused=pb.Refusal(reason=Reason.BAD_INPUT.value))
        outcome = await self._do(method, getattr(call, method), lambda: messages.credentials(call))
        if isinstance(outcome, GovernedMemoryError):
            return pb.Answer(id=call.id, refused=pb.Refusal(reason=outcome.reason.value))
        answer = pb.Answer(id=call.id)
        getattr(answer, method).CopyFrom(outcome)
        return answer

    async def _do(self, method: str, request: Any, credentials: Callable[[], Mapping[str, str]]) -> Any:
        """One call of ``method``: the caller named by ``credentials``, its scope token verified (but for policy),
        the work bounded in time; its reply, or the refusal to send (logged by reason code only)."""
        token = redaction.enter(True)  # this call's task: memory work, whatever a library logs
        try:
            async with asyncio.timeout(self._handler_seconds):
                metadata = credentials()
                agent = await self._identity.agent(metadata)
                if method == "policy":
                    return pb.PolicyReply(**self._store.policy.model_dump())
                scope = self._verified(metadata, agent)
                return await self._work[method](request, scope)
        except GovernedMemoryError as error:
            refused = error
            logger.info("data plane %s refused: %s", method, error.explained())
        except TimeoutError:
            refused = GovernedMemoryError(Reason.STORE_UNAVAILABLE, cause=Cause.TIMEOUT)
            logger.warning("data plane %s refused: %s", method, refused.explained())
        except Exception as error:  # content-free: the type only
            refused = GovernedMemoryError(Reason.INTERNAL_ERROR)
            logger.warning("data plane %s failed: %s", method, type(error).__name__)
        finally:
            redaction.leave(token)
        return refused

    # -- the work of each call, on its verified scope ---------------------------------------------

    def _plane(self, scope: RequestScope) -> LocalPlane:
        """The data plane of the scope's agent, embedding with its model (none: refused ``embedding_failed
        (not_configured)`` once the input is checked, before anything is admitted, as in process)."""
        embedder = self._embedders.for_agent(str(scope.key.agent)) if self._embedders is not None else None
        return LocalPlane(self._store, embedder)

    async def _recall(self, request: pb.RecallRequest, scope: RequestScope) -> pb.SearchReply:
        operation = messages.operation(request.operation, SEARCHES)
        found = await self._plane(scope).recall(scope, request.queries, operation)
        return pb.SearchReply(results=[pb.Hits(hits=[messages.hit(hit) for hit in hits]) for hits in found])

    async def _remember(self, request: pb.RememberRequest, scope: RequestScope) -> pb.WriteReply:
        operation = messages.operation(request.operation, WRITES)
        expires_in = request.expires_in if request.HasField("expires_in") else None
        ids = await self._plane(scope).remember(scope, request.facts, operation, expires_in=expires_in)
        return pb.WriteReply(entry_ids=[str(entry) for entry in ids])

    async def _admit(self, request: pb.AdmitRequest, scope: RequestScope) -> pb.AdmitReply:
        operation = messages.operation(request.operation, ADMITTED)
        explicit = request.explicit or operation in EXPLICIT
        await self._store.admit(scope.key, scope.generation, operation, units=request.units, explicit=explicit)
        if operation in SEARCHES | WRITES:  # recorded: the call it admits takes it (``_spend``)
            self._keep((scope.key, scope.generation, operation, explicit, request.units))
        return pb.AdmitReply()

    def _keep(self, admitted: tuple[ScopeKey, int, Operation, bool, int]) -> None:
        if admitted not in self._spent and len(self._spent) >= SPENT_KEPT:
            del self._spent[next(iter(self._spent))]
        self._spent.setdefault(admitted, []).append(time.monotonic() + SPENT_SECONDS)

    def _take(self, admitted: tuple[ScopeKey, int, Operation, bool, int]) -> bool:
        """Whether an admission Admit recorded for this call awaits it (taken once)."""
        deadlines = self._spent.get(admitted, [])
        now = time.monotonic()
        while deadlines and deadlines[0] <= now:  # lapsed: their call is admitted again
            deadlines.pop(0)
        taken = bool(deadlines)
        if taken:
            deadlines.pop(0)
        if not deadlines:
            self._spent.pop(admitted, None)
        return taken

    async def _spend(
        self, scope: RequestScope, name: str, allowed: frozenset[Operation], units: int, explicit: bool
    ) -> None:
        """Admit a search or a write: the admission ``Admit`` recorded for it, else admitted and recorded here, by
        the same rules."""
        operation = messages.operation(name, allowed)
        explicit = explicit or operation in EXPLICIT
        if self._take((scope.key, scope.generation, operation, explicit, units)):
            return
        await self._store.admit(scope.key, scope.generation, operation, units=units, explicit=explicit)

    async def _search(self, request: pb.SearchRequest, scope: RequestScope) -> pb.SearchReply:
        await self._spend(scope, request.operation, SEARCHES, len(request.embeddings), request.explicit)
        vectors = [messages.embedding(vector) for vector in request.embeddings]
        found = await self._store.search_many(
            scope.key, scope.generation, vectors, top_k=wire.SEARCH_TOP_K, min_score=wire.SEARCH_MIN_SCORE
        )
        return pb.SearchReply(results=[pb.Hits(hits=[messages.hit(hit) for hit in hits]) for hits in found])

    async def _write(self, request: pb.WriteRequest, scope: RequestScope) -> pb.WriteReply:
        await self._spend(scope, request.operation, WRITES, len(request.facts), request.explicit)
        facts = [NewFact(fact.text, messages.embedding(fact.embedding)) for fact in request.facts]
        expires_in = request.expires_in if request.HasField("expires_in") else None
        ids = await self._store.write(scope.key, scope.generation, facts, expires_in=expires_in)
        return pb.WriteReply(entry_ids=[str(entry) for entry in ids])

    async def _record_turn(self, request: pb.RecordTurnRequest, scope: RequestScope) -> pb.RecordTurnReply:
        session, invocation = messages.identifier(request.session_id), messages.identifier(request.invocation_id)
        waiting = await self._store.record_turn(
            scope.key, scope.generation, session, invocation, recalled=request.recalled
        )
        return pb.RecordTurnReply(waiting=waiting)

    async def _collect_turns(self, request: pb.CollectTurnsRequest, scope: RequestScope) -> pb.CollectTurnsReply:
        if len(request.candidates) > wire.MAX_CANDIDATES:
            raise GovernedMemoryError(Reason.BAD_INPUT)
        candidates = [messages.identifier(candidate) for candidate in request.candidates]
        turns = await self._store.collect_turns(
            scope.key, scope.generation, messages.identifier(request.session_id), candidates
        )
        return pb.CollectTurnsReply(turns=[pb.Turn(invocation_id=t.invocation_id, recalled=t.recalled) for t in turns])

    # -- verification -----------------------------------------------------------------------------

    def _verified(self, metadata: Mapping[str, str], agent: AgentId) -> RequestScope:
        """The scope the call's token names for ``agent``, verified in full the first time this service sees that
        token for that agent, then kept by its digest for the window ``verify`` accepts it in (from its ``iat`` and
        ``nbf`` less the leeway to its ``exp`` plus the leeway): the same answer, without the signature again."""
        token = metadata.get(wire.SCOPE)
        moment = clock.now()
        digest = hashlib.sha256(f"{agent}\n{token}".encode()).digest() if isinstance(token, str) else None
        kept = self._scopes.get(digest) if digest is not None else None
        if kept is not None and kept[1] <= moment.timestamp() < kept[2]:
            return kept[0]
        trust = Trust(self._public_key, self._issuer, agent, self._homeserver)
        claims = wire.claims_unverified(token) or {}
        # the token's own subject: the service has no X-User-Id to hold it to (the runtime does, R28)
        assertion = verify(token, trust, now=moment, purpose="scope", user_id=claims.get("sub"))
        if assertion.key is None or assertion.generation is None:  # a scope header names both
            raise GovernedMemoryError(Reason.BAD_ASSERTION)
        scope = RequestScope(assertion.key, assertion.generation)
        if digest is not None:
            starts = [value for value in (claims.get("iat"), claims.get("nbf")) if isinstance(value, int)]
            if len(self._scopes) >= CACHED_SCOPE_TOKENS:  # the oldest first: lifetimes are alike
                del self._scopes[next(iter(self._scopes))]
            self._scopes[digest] = (
                scope,
                max(starts) - LEEWAY_SECONDS,
                assertion.expires_at.timestamp() + LEEWAY_SECONDS,
            )
        return scope


@dataclass(frozen=True, slots=True)
class ServerTLS:
    """The serving certificate chain and its private key, PEM (the operator's Secret)."""

    certificate_chain: bytes
    private_key: bytes


def build(plane: DataPlane, address: str, *, tls: ServerTLS | None) -> tuple[grpc.aio.Server, int]:
    """A ``grpc.aio`` server of ``plane`` listening on ``address`` (``host:port``; port 0 picks one), not started;
    returns it and its port. Plaintext only on a loopback address (``ValueError`` otherwise); messages are bounded
    both ways by ``wire.MAX_MESSAGE_BYTES``."""
    options = [
        ("grpc.max_receive_message_length", wire.MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", wire.MAX_MESSAGE_BYTES),
    ]
    server = grpc.aio.server(options=options)
    pb_grpc.add_DataPlaneServicer_to_server(plane, server)
    if tls is None:
        if not wire.is_loopback(address.rsplit(":", 1)[0]):
            raise ValueError("the data plane serves plaintext on a loopback address only")
        port = server.add_insecure_port(address)
    else:
        credentials = grpc.ssl_server_credentials([(tls.private_key, tls.certificate_chain)])
        port = server.add_secure_port(address, credentials)
    return server, int(port)
