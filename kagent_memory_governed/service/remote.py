"""``RemoteStore``: the runtime's client of the governed memory service's data plane (ADR 0001).

The data-plane subset of ``Store`` that the runtime calls (``admit``, ``search``, ``search_many``, ``write``,
``record_turn``, ``collect_turns``, ``policy``, ``limit_expiry``), with the same arguments and answers, over
``grpc.aio``: each call a message on one long-lived ``Exchange`` stream per event loop (``exchange``). Each call
presents the request's scope token exactly as the bridge signed it (``carry``) and the workload identity token read
from its file for that call (as kagent reads its projected token); the service verifies both and acts on that token's
scope. A call for a key or generation other than the carried token's is refused here,
``scope_mismatch``, before anything is sent; without a token, ``no_assertion``.

Refusals are the service's reason codes. Anything else (unreachable, past the deadline, a refusal that is not a
reason code, an answer to another call, a stream that failed, anything not of the wire) is ``service_unavailable``
with a content-free cause. TLS verifies the service's certificate and name against a CA file (libpq's
``verify-full``); plaintext only to a loopback address.
Imports nothing of the server or the store.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from contextvars import ContextVar, Token
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from kagent_memory_governed.errors import Cause, GovernedMemoryError, Operation, Reason
from kagent_memory_governed.policy import Policy, admit_int
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.service import data_plane_pb2 as pb
from kagent_memory_governed.service import data_plane_pb2_grpc as pb_grpc
from kagent_memory_governed.service import wire
from kagent_memory_governed.service.exchange import Exchange, channel, unavailable
from kagent_memory_governed.service.plane import SEARCH_MIN_SCORE, SEARCH_TOP_K, RequestScope
from kagent_memory_governed.service.values import Fact, Hit, Turn

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# what admits, embeds and works: the service's bound on it and a second, so the runtime acts on its answer
_WORK_DEADLINE = wire.DEFAULT_HANDLER_SECONDS + 1.0
_scope_token: ContextVar[str | None] = ContextVar("governed_memory_scope_token", default=None)
# the work this context's last ``admit`` checked: the service admits the search or write that follows as that work
_admitted: ContextVar[tuple[str, bool]] = ContextVar("governed_memory_admitted", default=("", False))


def carry(token: str | None) -> Token[str | None]:
    """Present ``token`` (the request's ``X-Memory-Scope``, as received) on every call of this context and of the
    tasks it starts, such as a background auto-save; returns a token for ``contextvars`` reset."""
    return _scope_token.set(token)


class RemoteStore:
    """The data plane of a governed memory service, as the runtime's store. Create with ``RemoteStore.connect``;
    ``close`` when done."""

    def __init__(self, channel: Callable[[], grpc.aio.Channel], *, token_file: Path, deadline: float) -> None:
        self._open = channel
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None  # generated, untyped; answers are checked below
        self._stream: Exchange | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._token_file = token_file
        self._deadline = deadline
        self._policy = Policy()  # the ceilings until ``refresh_policy``; the service enforces its own either way
        self._expiry_ceiling: int | None = None

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        token_file: Path,
        ca_file: Path | None = None,
        deadline: float = wire.DEFAULT_DEADLINE_SECONDS,
    ) -> RemoteStore:
        """A client of the service at ``url``: ``https://host:port``, verified against the PEM ``ca_file`` (the
        certificate must name ``host``), or ``http://host:port`` to a loopback address only. Opened lazily. Each call
        waits at most ``deadline`` seconds. A bad setting is a ``ConfigurationError`` naming it, never its value."""
        return cls(channel(url, ca_file), token_file=token_file, deadline=deadline)

    async def close(self) -> None:
        stream, channel = self._stream, self._channel
        self._stream, self._channel, self._stub = None, None, None
        if stream is not None and self._loop is asyncio.get_running_loop():
            await stream.close()
        if channel is not None:
            await channel.close()

    def _exchange(self) -> Exchange:
        """The open stream of a channel of the running event loop: a ``grpc.aio`` channel belongs to the loop it was
        opened in, and a process may create its store before the loop that serves (kagent-adk's CLI does). A stream
        that failed is replaced on the same channel."""
        loop = asyncio.get_running_loop()
        if self._channel is None or self._loop is not loop:
            self._channel, self._loop = self._open(), loop  # a channel of a loop that ended has nothing to close
            self._stub, self._stream = pb_grpc.DataPlaneStub(self._channel), None
        if self._stream is None or self._stream.failed:
            self._stream = Exchange(self._stub)
        return self._stream

    # -- policy -----------------------------------------------------------------------------------

    @property
    def policy(self) -> Policy:
        """The service's effective policy as last answered (``refresh_policy``), with ``limit_expiry`` applied."""
        if self._expiry_ceiling is None:
            return self._policy
        ceiling = min(self._policy.max_expiry_seconds, self._expiry_ceiling)
        return self._policy.model_copy(update={"max_expiry_seconds": ceiling})

    async def refresh_policy(self) -> Policy:
        """Ask the service for its effective ceilings (workload identity only); returns ``policy``."""
        reply = await self._call("policy", pb.PolicyRequest(), None)
        try:
            self._policy = Policy(**{name: getattr(reply, name) for name in Policy.model_fields})
        except ValueError:  # pydantic's ValidationError: an answer no policy can have
            raise unavailable(Cause.BAD_ANSWER) from None
        return self.policy

    async def check_ready(self) -> None:
        """Whether the service answers this runtime: its policy, for this process's workload identity (refreshed).
        Refuses ``service_unavailable``, ``bad_identity``, ``identity_unavailable`` and the service's own reasons."""
        await self.refresh_policy()

    async def unfinished_erasures(self) -> None:
        """Not the runtime's to count: the service's own gauges report its erasures (``None``: not counted here)."""
        return None

    def limit_expiry(self, seconds: int) -> None:
        """Lower the expiry of every later write (an Agent's ``memory.ttlDays``); it travels as ``Write``'s
        ``expires_in``, which the service bounds again. Never raises the ceiling."""
        value = admit_int(seconds, low=1, high=2**63 - 1)
        self._expiry_ceiling = value if self._expiry_ceiling is None else min(self._expiry_ceiling, value)

    # -- the data plane ---------------------------------------------------------------------------

    async def admit(
        self, key: ScopeKey, generation: int, operation: str, *, units: int = 0, explicit: bool = False
    ) -> None:
        """``Store.admit`` at the service, which records it as used. Refuses as it does, and ``service_unavailable``.
        The ``search_many`` or ``write`` that follows in this context takes that admission at the service."""
        units = admit_int(units, low=0, high=2**32 - 1)
        request = pb.AdmitRequest(operation=str(operation), units=units, explicit=explicit)
        await self._call("admit", request, _presented(key, generation))
        _admitted.set((str(operation), explicit))

    async def write(
        self, key: ScopeKey, generation: int, facts: Sequence[Fact], *, expires_in: int | None = None
    ) -> list[uuid.UUID]:
        """``Store.write`` at the service: all or none; the entry ids in order. The service admits it, recording it
        as used, as the work this context's last ``admit`` checked (``save`` or ``autosave``)."""
        if self._expiry_ceiling is not None:
            expires_in = self._expiry_ceiling if expires_in is None else min(expires_in, self._expiry_ceiling)
        operation, explicit = _admitted.get()
        request = pb.WriteRequest(
            facts=[pb.Fact(text=fact.text, embedding=pb.Vector(values=fact.embedding)) for fact in facts],
            expires_in=expires_in,
            operation=operation,
            explicit=explicit,
        )
        reply = await self._call("write", request, _presented(key, generation))
        ids = [_uuid(entry) for entry in reply.entry_ids]
        if len(ids) != len(facts):
            raise unavailable(Cause.BAD_ANSWER)
        return ids

    async def search(
        self, key: ScopeKey, generation: int, embedding: Sequence[float], *, top_k: int = 5, min_score: float = 0.0
    ) -> list[Hit]:
        """``Store.search`` at the service."""
        [hits] = await self.search_many(key, generation, [embedding], top_k=top_k, min_score=min_score)
        return hits

    async def search_many(
        self,
        key: ScopeKey,
        generation: int,
        embeddings: Sequence[Sequence[float]],
        *,
        top_k: int = 5,
        min_score: float = 0.0,
    ) -> list[list[Hit]]:
        """``Store.search_many`` at the service, which fixes the bounds: at most ``wire.SEARCH_TOP_K`` hits each,
        each scoring at least ``wire.SEARCH_MIN_SCORE``; a stricter ``top_k`` or ``min_score`` narrows them here.
        The service admits it, recording it as used, as the work this context's last ``admit`` checked
        (``prefetch`` or ``load``)."""
        operation, explicit = _admitted.get()
        vectors = [pb.Vector(values=vector) for vector in embeddings]
        request = pb.SearchRequest(embeddings=vectors, operation=operation, explicit=explicit)
        reply = await self._call("search", request, _presented(key, generation))
        if len(reply.results) != len(embeddings):
            raise unavailable(Cause.BAD_ANSWER)
        return [[_hit(hit) for hit in result.hits if hit.score >= min_score][:top_k] for result in reply.results]

    async def record_turn(
        self, key: ScopeKey, generation: int, session_id: str, invocation_id: str, *, recalled: bool
    ) -> int:
        """``Store.record_turn`` at the service: how many admitted turns of the session await auto-save."""
        request = pb.RecordTurnRequest(session_id=session_id, invocation_id=invocation_id, recalled=recalled)
        reply = await self._call("record_turn", request, _presented(key, generation))
        return int(reply.waiting)

    async def collect_turns(
        self, key: ScopeKey, generation: int, session_id: str, candidates: Sequence[str]
    ) -> list[Turn]:
        """``Store.collect_turns`` at the service, for the most recent ``wire.MAX_CANDIDATES`` candidates."""
        recent = list(candidates)[-wire.MAX_CANDIDATES :]
        request = pb.CollectTurnsRequest(session_id=session_id, candidates=recent)
        return _turns(await self._call("collect_turns", request, _presented(key, generation)), recent)

    # -- the data plane, one call an operation (``service.plane.DataPlane``) ------------------------

    token_bound = True  # the service verifies the scope's token on every call: work ends while it is accepted

    def embed_with(self, embedder: object) -> None:
        """Nothing: the service embeds, with the model its operator configured for this agent."""

    def plane(self, embedder: object = None) -> RemoteStore:
        """This client: it is the runtime's data plane through the service."""
        return self

    async def recall(self, scope: RequestScope, queries: Sequence[str], operation: Operation) -> list[list[Hit]]:
        """``DataPlane.recall`` in one call: the service admits, embeds and searches."""
        try:
            request = pb.RecallRequest(queries=list(queries), operation=str(operation))
        except (TypeError, ValueError):  # not text, or not encodable (a lone surrogate): never its text
            raise GovernedMemoryError(Reason.BAD_INPUT) from None
        reply = await self._call("recall", request, _token(scope), deadline=_WORK_DEADLINE)
        if len(reply.results) != len(queries) or any(not _bounded(result.hits) for result in reply.results):
            raise unavailable(Cause.BAD_ANSWER)
        return [[_hit(hit) for hit in result.hits] for result in reply.results]

    async def remember(
        self, scope: RequestScope, facts: Sequence[str], operation: Operation, *, expires_in: int | None = None
    ) -> list[uuid.UUID]:
        """``DataPlane.remember`` in one call: the service admits, embeds and writes."""
        if self._expiry_ceiling is not None:
            expires_in = self._expiry_ceiling if expires_in is None else min(expires_in, self._expiry_ceiling)
        try:
            request = pb.RememberRequest(facts=list(facts), expires_in=expires_in, operation=str(operation))
        except (TypeError, ValueError):  # not text or not encodable; an expiry past int64
            raise GovernedMemoryError(Reason.BAD_INPUT) from None
        reply = await self._call("remember", request, _token(scope), deadline=_WORK_DEADLINE)
        ids = [_uuid(entry) for entry in reply.entry_ids]
        if len(ids) != len(facts):
            raise unavailable(Cause.BAD_ANSWER)
        return ids

    async def admit_summary(self, scope: RequestScope) -> None:
        request = pb.AdmitRequest(operation=str(Operation.SUMMARIZE), units=1)
        await self._call("admit", request, _token(scope))

    async def record(self, scope: RequestScope, session_id: str, invocation_id: str, *, recalled: bool) -> int:
        request = pb.RecordTurnRequest(session_id=session_id, invocation_id=invocation_id, recalled=recalled)
        return int((await self._call("record_turn", request, _token(scope))).waiting)

    async def collect(self, scope: RequestScope, session_id: str, candidates: Sequence[str]) -> list[Turn]:
        recent = list(candidates)[-wire.MAX_CANDIDATES :]
        request = pb.CollectTurnsRequest(session_id=session_id, candidates=recent)
        return _turns(await self._call("collect_turns", request, _token(scope)), recent)

    # -- one call ---------------------------------------------------------------------------------

    async def _call(self, kind: str, request: Any, scope_token: str | None, *, deadline: float | None = None) -> Any:
        """``request`` as the ``kind`` field of a ``Call`` on this loop's stream, presenting ``scope_token``; its
        reply, or its refusal raised, within ``deadline`` seconds (default: the client's)."""
        call = pb.Call(authorization=f"Bearer {self._bearer()}")
        if scope_token is not None:
            call.scope = scope_token
        getattr(call, kind).CopyFrom(request)
        try:
            async with asyncio.timeout(deadline or self._deadline):
                answer = await self._exchange().ask(call)
        except TimeoutError:
            raise unavailable(Cause.DEADLINE_EXCEEDED) from None
        except (GovernedMemoryError, asyncio.CancelledError):
            raise
        except Exception:  # opening a stream failed: its text is not ours to pass on
            raise unavailable(Cause.TRANSPORT) from None
        replied = answer.WhichOneof("reply")
        if replied == "refused":
            try:
                reason = Reason(answer.refused.reason)
            except ValueError:
                raise unavailable(Cause.BAD_ANSWER) from None
            raise GovernedMemoryError(reason)
        if replied != kind:
            raise unavailable(Cause.BAD_ANSWER)
        return getattr(answer, kind)

    def _bearer(self) -> str:
        """The workload identity token, read for each call: the kubelet rotates the file."""
        try:
            token = self._token_file.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            token = ""
        if not token or not token.isprintable():
            raise unavailable(Cause.IDENTITY_TOKEN_UNREADABLE)
        return token


def _presented(key: ScopeKey, generation: int) -> str:
    """The token ``carry`` put in this context, if it is the one for ``key`` and ``generation``."""
    return _matching(_scope_token.get(), key, generation)


def _token(scope: RequestScope) -> str:
    return _matching(scope.token, scope.key, scope.generation)


def _matching(token: str | None, key: ScopeKey, generation: int) -> str:
    """``token``, if it is the one for ``key`` and ``generation`` (its claims read unverified: the service
    verifies); the runtime never acts, through the service, on a scope other than the one it names."""
    claims = wire.claims_unverified(token)
    if token is None or claims is None:
        raise GovernedMemoryError(Reason.NO_ASSERTION)
    named = (claims.get("sub"), claims.get("origin"), claims.get("aud"), claims.get("room"), claims.get("gen"))
    expected = (key.principal.mxid, key.principal.origin.value, str(key.agent), key.room.room_id, generation)
    if named != expected or isinstance(claims.get("gen"), bool):
        raise GovernedMemoryError(Reason.SCOPE_MISMATCH)
    return token


def _turns(reply: pb.CollectTurnsReply, asked: list[str]) -> list[Turn]:
    turns = [Turn(turn.invocation_id, turn.recalled) for turn in reply.turns]
    if any(turn.invocation_id not in set(asked) for turn in turns):
        raise unavailable(Cause.BAD_ANSWER)
    return turns


def _bounded(hits: Sequence[pb.Hit]) -> bool:
    """Whether one query's hits are what the service answers: at most ``SEARCH_TOP_K``, each scoring at least
    ``SEARCH_MIN_SCORE`` (a NaN does not)."""
    return len(hits) <= SEARCH_TOP_K and all(hit.score >= SEARCH_MIN_SCORE for hit in hits)


def _uuid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise unavailable(Cause.BAD_ANSWER) from None


def _hit(hit: pb.Hit) -> Hit:
    if not hit.HasField("created_at") or not hit.HasField("expires_at"):
        raise unavailable(Cause.BAD_ANSWER)
    return Hit(_uuid(hit.entry_id), hit.text, float(hit.score), _time(hit.created_at), _time(hit.expires_at))


def _time(stamp: Timestamp) -> datetime:
    """``Timestamp.ToDatetime(tzinfo=UTC)``'s value and checks, in integer arithmetic: a third of its cost."""
    if not 0 <= stamp.nanos < 1_000_000_000:
        raise unavailable(Cause.BAD_ANSWER)
    try:
        return EPOCH + timedelta(seconds=stamp.seconds, microseconds=stamp.nanos // 1000)
    except OverflowError:
        raise unavailable(Cause.BAD_ANSWER) from None
