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
import hashlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import grpc
import numpy
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from google.protobuf.timestamp_pb2 import Timestamp

from kagent_memory_governed import clock, redaction
from kagent_memory_governed.assertion import LEEWAY_SECONDS, Trust, verify
from kagent_memory_governed.errors import GovernedMemoryError, Operation, Reason
from kagent_memory_governed.scope import AgentId, ScopeKey
from kagent_memory_governed.service import data_plane_pb2 as pb
from kagent_memory_governed.service import data_plane_pb2_grpc as pb_grpc
from kagent_memory_governed.service import wire
from kagent_memory_governed.service.values import Embedding
from kagent_memory_governed.store import Hit, NewFact, Store

logger = logging.getLogger(__name__)
Reply = TypeVar("Reply")
# what the runtime admits (adk/service.py); load and save are explicit: rate limited per sender, whatever is asked.
# Admit admits and records a search or a write as the in-process runtime does, before the embedding; the Search or
# Write that follows takes that admission (the same scope, generation, operation and units, within SPENT_SECONDS,
# once), and one that finds none is admitted and recorded there: a caller that skips Admit is held to the limits
# all the same, and no call is admitted without being recorded once. A summarization is the runtime's own model call.
SEARCHES = frozenset({Operation.PREFETCH, Operation.LOAD})
WRITES = frozenset({Operation.SAVE, Operation.AUTOSAVE})
ADMITTED = SEARCHES | WRITES | {Operation.SUMMARIZE}
EXPLICIT = frozenset({Operation.LOAD, Operation.SAVE})
SPENT_SECONDS = 330.0  # what Admit spent waits this long for its call: a scope token's life and leeway at most
SPENT_KEPT = 65536  # admissions awaiting their call; past it the oldest go (their call is then admitted again)
CACHED_SCOPE_TOKENS = 4096  # verified scope tokens kept, by digest: a token lives at most 330 s


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
        # verified scope tokens by sha256(agent, token): the scope and the window verify accepted it in
        self._scopes: dict[bytes, tuple[Scope, float, float]] = {}
        # admissions Admit recorded for a search or a write, awaiting it: their deadlines (monotonic), oldest first
        self._spent: dict[tuple[ScopeKey, int, Operation, bool, int], list[float]] = {}
        redaction.install_log_boundary()

    # -- the calls --------------------------------------------------------------------------------

    async def Admit(self, request: pb.AdmitRequest, context: grpc.aio.ServicerContext) -> pb.AdmitReply:
        async def admit(scope: Scope) -> pb.AdmitReply:
            operation = _operation(request.operation, ADMITTED)
            explicit = request.explicit or operation in EXPLICIT
            await self._store.admit(scope.key, scope.generation, operation, units=request.units, explicit=explicit)
            if operation in SEARCHES | WRITES:  # recorded: the call it admits takes it (``_spend``)
                self._keep((scope.key, scope.generation, operation, explicit, request.units))
            return pb.AdmitReply()

        return await self._serve("admit", context, admit)

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

    async def _spend(self, scope: Scope, name: str, allowed: frozenset[Operation], units: int, explicit: bool) -> None:
        """Admit a search or a write: the admission ``Admit`` recorded for it, else admitted and recorded here, by
        the same rules."""
        operation = _operation(name, allowed)
        explicit = explicit or operation in EXPLICIT
        if self._take((scope.key, scope.generation, operation, explicit, units)):
            return
        await self._store.admit(scope.key, scope.generation, operation, units=units, explicit=explicit)

    async def Search(self, request: pb.SearchRequest, context: grpc.aio.ServicerContext) -> pb.SearchReply:
        async def search(scope: Scope) -> pb.SearchReply:
            await self._spend(scope, request.operation, SEARCHES, len(request.embeddings), request.explicit)
            vectors = [_embedding(vector) for vector in request.embeddings]
            found = await self._store.search_many(
                scope.key, scope.generation, vectors, top_k=wire.SEARCH_TOP_K, min_score=wire.SEARCH_MIN_SCORE
            )
            return pb.SearchReply(results=[pb.Hits(hits=[_hit(hit) for hit in hits]) for hits in found])

        return await self._serve("search", context, search)

    async def Write(self, request: pb.WriteRequest, context: grpc.aio.ServicerContext) -> pb.WriteReply:
        async def write(scope: Scope) -> pb.WriteReply:
            await self._spend(scope, request.operation, WRITES, len(request.facts), request.explicit)
            facts = [NewFact(fact.text, _embedding(fact.embedding)) for fact in request.facts]
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
        scope = Scope(assertion.key, assertion.generation)
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


def _embedding(vector: pb.Vector) -> Embedding:
    """A ``Vector``'s values for the store, which takes arrays and lists, not containers: the single-precision array
    they are on the wire, read from the message's own packed bytes (field 1, a length, little-endian floats) without
    a list of 768 Python floats in between (protobuf writes repeated floats packed); an empty list for none."""
    raw = vector.SerializeToString()
    length, shift, at = 0, 0, 1
    while raw[:1] == b"\x0a" and at < len(raw) and shift < 35:
        byte = raw[at]
        length, shift, at = length | (byte & 0x7F) << shift, shift + 7, at + 1
        if not byte & 0x80:
            if at + length == len(raw) and length % 4 == 0:
                return numpy.frombuffer(raw, dtype="<f4", offset=at)
            break
    return list(vector.values)


def _identifier(value: str) -> str:
    if not 1 <= len(value) <= wire.MAX_ID_CHARS:
        raise GovernedMemoryError(Reason.BAD_INPUT)
    return value


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _timestamp(moment: datetime) -> Timestamp:
    """``Timestamp.FromDatetime``'s value (a naive time taken as UTC), in integer arithmetic: a third of its cost."""
    since = (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)) - _EPOCH
    return Timestamp(seconds=since.days * 86400 + since.seconds, nanos=since.microseconds * 1000)


def _hit(hit: Hit) -> pb.Hit:
    entry = hit.entry_id if isinstance(hit.entry_id, uuid.UUID) else uuid.UUID(str(hit.entry_id))
    return pb.Hit(
        entry_id=str(entry),
        text=hit.text,
        score=hit.score,
        created_at=_timestamp(hit.created_at),
        expires_at=_timestamp(hit.expires_at),
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
