"""The data plane's service side: ``governed_memory.v1.DataPlane`` over a real ``Store`` (ADR 0001).

Every call is verified here, whatever the runtime checked: the caller's workload identity names the agent
(``Identity``), then the ``x-memory-scope`` token is verified with the package's own ``assertion.verify`` for that
agent as its audience (issuer, signature, lifetime, origin, homeserver, room, generation); the call acts on that
token's scope and generation only, and the store fences the generation in the statement that does the work. No
request field names a principal, a room or an agent.

A refusal is a status whose details are exactly the reason code (``wire.STATUS``). Nothing of a request or a
reply reaches a status, a log line or an exception text: each call runs as memory work (``redaction``), and this
module logs method names and reason codes only. Every handler is bounded in time (``handler_seconds``).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from google.protobuf.timestamp_pb2 import Timestamp

from kagent_memory_governed import clock, redaction
from kagent_memory_governed.assertion import Trust, verify
from kagent_memory_governed.errors import GovernedMemoryError, Operation, Reason
from kagent_memory_governed.scope import AgentId, ScopeKey
from kagent_memory_governed.service import data_plane_pb2 as pb
from kagent_memory_governed.service import data_plane_pb2_grpc as pb_grpc
from kagent_memory_governed.service import wire
from kagent_memory_governed.store import Hit, NewFact, Store

logger = logging.getLogger(__name__)
Reply = TypeVar("Reply")
# what the runtime admits (adk/service.py); load and save are explicit: rate limited per sender, whatever is asked.
# A search or a write is admitted, and recorded as used, by the Search or Write that does it (Admit only checks it
# beforehand): a caller that skips Admit is held to the limits all the same. A summarization is the runtime's own
# model call: Admit records it.
SEARCHES = frozenset({Operation.PREFETCH, Operation.LOAD})
WRITES = frozenset({Operation.SAVE, Operation.AUTOSAVE})
ADMITTED = SEARCHES | WRITES | {Operation.SUMMARIZE}
EXPLICIT = frozenset({Operation.LOAD, Operation.SAVE})


class Identity(Protocol):
    """Which agent calls, from the call's metadata (lower-case keys, text values; ``authorization: Bearer …``).
    Refuses ``GovernedMemoryError(bad_identity)`` for a missing or unacceptable token and
    ``GovernedMemoryError(identity_unavailable)`` when it cannot be verified now."""

    async def agent(self, metadata: Mapping[str, str]) -> AgentId: ...


@dataclass(frozen=True, slots=True)
class Scope:
    """What one call may act on: the verified token's scope and consent generation."""

    key: ScopeKey
    generation: int


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
        handler_seconds: float = wire.DEFAULT_HANDLER_SECONDS,
    ) -> None:
        self._store = store
        self._identity = identity
        self._public_key, self._issuer, self._homeserver = public_key, issuer, homeserver
        self._handler_seconds = handler_seconds
        redaction.install_log_boundary()

    # -- the calls --------------------------------------------------------------------------------

    async def Admit(self, request: pb.AdmitRequest, context: grpc.aio.ServicerContext) -> pb.AdmitReply:
        async def admit(scope: Scope) -> pb.AdmitReply:
            operation = _operation(request.operation, ADMITTED)
            explicit = request.explicit or operation in EXPLICIT
            spend = operation not in SEARCHES | WRITES  # those are spent by their Search or Write
            await self._store.admit(
                scope.key, scope.generation, operation, units=request.units, explicit=explicit, spend=spend
            )
            return pb.AdmitReply()

        return await self._serve("admit", context, admit)

    async def _spend(self, scope: Scope, name: str, allowed: frozenset[Operation], units: int, explicit: bool) -> None:
        """Admit a search or a write, recording it as used: the same rules ``Admit`` checked."""
        operation = _operation(name, allowed)
        explicit = explicit or operation in EXPLICIT
        await self._store.admit(scope.key, scope.generation, operation, units=units, explicit=explicit)

    async def Search(self, request: pb.SearchRequest, context: grpc.aio.ServicerContext) -> pb.SearchReply:
        async def search(scope: Scope) -> pb.SearchReply:
            await self._spend(scope, request.operation, SEARCHES, len(request.embeddings), request.explicit)
            vectors = [list(vector.values) for vector in request.embeddings]  # the store takes lists, not containers
            found = await self._store.search_many(
                scope.key, scope.generation, vectors, top_k=wire.SEARCH_TOP_K, min_score=wire.SEARCH_MIN_SCORE
            )
            return pb.SearchReply(results=[pb.Hits(hits=[_hit(hit) for hit in hits]) for hits in found])

        return await self._serve("search", context, search)

    async def Write(self, request: pb.WriteRequest, context: grpc.aio.ServicerContext) -> pb.WriteReply:
        async def write(scope: Scope) -> pb.WriteReply:
            await self._spend(scope, request.operation, WRITES, len(request.facts), request.explicit)
            facts = [NewFact(fact.text, list(fact.embedding.values)) for fact in request.facts]
            expires_in = request.expires_in if request.HasField("expires_in") else None
            ids = await self._store.write(scope.key, scope.generation, facts, expires_in=expires_in)
            return pb.WriteReply(entry_ids=[str(entry) for entry in ids])

        return await self._serve("write", context, write)

    async def RecordTurn(self, request: pb.RecordTurnRequest, context: grpc.aio.ServicerContext) -> pb.RecordTurnReply:
        async def record(scope: Scope) -> pb.RecordTurnReply:
            session, invocation = _identifier(request.session_id), _identifier(request.invocation_id)
            waiting = await self._store.record_turn(
                scope.key, scope.generation, session, invocation, recalled=request.recalled
            )
            return pb.RecordTurnReply(waiting=waiting)

        return await self._serve("record_turn", context, record)

    async def CollectTurns(
        self, request: pb.CollectTurnsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CollectTurnsReply:
        async def collect(scope: Scope) -> pb.CollectTurnsReply:
            if len(request.candidates) > wire.MAX_CANDIDATES:
                raise GovernedMemoryError(Reason.BAD_INPUT)
            candidates = [_identifier(candidate) for candidate in request.candidates]
            turns = await self._store.collect_turns(
                scope.key, scope.generation, _identifier(request.session_id), candidates
            )
            return pb.CollectTurnsReply(
                turns=[pb.Turn(invocation_id=t.invocation_id, recalled=t.recalled) for t in turns]
            )

        return await self._serve("collect_turns", context, collect)

    async def Policy(self, request: pb.PolicyRequest, context: grpc.aio.ServicerContext) -> pb.PolicyReply:
        async def policy(scope: Scope | None) -> pb.PolicyReply:
            return pb.PolicyReply(**self._store.policy.model_dump())

        return await self._serve("policy", context, policy, scoped=False)

    # -- verification, bounds, refusals -----------------------------------------------------------

    async def _serve(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        work: Callable[[Any], Awaitable[Reply]],
        *,
        scoped: bool = True,
    ) -> Reply:
        token = redaction.enter(True)  # this call's task: memory work, whatever a library logs
        try:
            async with asyncio.timeout(self._handler_seconds):
                metadata = _metadata(context)
                agent = await self._identity.agent(metadata)
                return await work(self._verified(metadata, agent) if scoped else None)
        except GovernedMemoryError as error:
            refused = error
            logger.info("data plane %s refused: %s", method, error.explained())
        except TimeoutError:
            refused = GovernedMemoryError(Reason.STORE_UNAVAILABLE, cause="timeout")
            logger.warning("data plane %s refused: %s", method, refused.explained())
        except Exception as error:  # content-free: the type only
            refused = GovernedMemoryError(Reason.INTERNAL_ERROR)
            logger.warning("data plane %s failed: %s", method, type(error).__name__)
        finally:
            redaction.leave(token)
        await context.abort(wire.status(refused.reason), refused.reason.value)
        raise AssertionError("abort raises")  # pragma: no cover

    def _verified(self, metadata: Mapping[str, str], agent: AgentId) -> Scope:
        token = metadata.get(wire.SCOPE)
        trust = Trust(self._public_key, self._issuer, agent, self._homeserver)
        # the token's own subject: the service has no X-User-Id to hold it to (the runtime does, R28)
        assertion = verify(
            token, trust, now=clock.now(), purpose="scope", user_id=(wire.claims_unverified(token) or {}).get("sub")
        )
        if assertion.key is None or assertion.generation is None:  # a scope header names both
            raise GovernedMemoryError(Reason.BAD_ASSERTION)
        return Scope(assertion.key, assertion.generation)


def _metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's text metadata; a second ``authorization`` or ``x-memory-scope`` is refused, never chosen among."""
    found: dict[str, str] = {}
    for item in context.invocation_metadata() or ():
        name, value = item[0], item[1]
        if not isinstance(name, str) or not isinstance(value, str):
            continue  # binary (``-bin``) metadata names nothing this service reads
        name = name.lower()
        if name in found and name in (wire.AUTHORIZATION, wire.SCOPE):
            raise GovernedMemoryError(Reason.BAD_IDENTITY if name == wire.AUTHORIZATION else Reason.BAD_ASSERTION)
        found[name] = value
    return found


def _operation(name: str, allowed: frozenset[Operation]) -> Operation:
    try:
        operation = Operation(name)
    except ValueError:
        raise GovernedMemoryError(Reason.BAD_INPUT) from None
    if operation not in allowed:
        raise GovernedMemoryError(Reason.BAD_INPUT)
    return operation


def _identifier(value: str) -> str:
    if not 1 <= len(value) <= wire.MAX_ID_CHARS:
        raise GovernedMemoryError(Reason.BAD_INPUT)
    return value


def _hit(hit: Hit) -> pb.Hit:
    created, expires = Timestamp(), Timestamp()
    created.FromDatetime(hit.created_at)
    expires.FromDatetime(hit.expires_at)
    return pb.Hit(
        entry_id=str(uuid.UUID(str(hit.entry_id))),
        text=hit.text,
        score=hit.score,
        created_at=created,
        expires_at=expires,
    )


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
