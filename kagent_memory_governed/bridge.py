"""A client for the Matrix bridge: it signs what the runtime verifies and calls the control API.

``ScopeSigner`` mints the per-request ``X-Memory-Scope`` header and one control token per operation
(EdDSA, the exact claims of docs/bridge.md, ``op`` set, a fresh ``jti``, a lifetime of at most 300 s from
the application clock, so frozen clocks govern tokens too). ``ControlClient`` (httpx, sync) and
``AsyncControlClient`` call every ``/memory/v1`` operation for one subject in one control room, answer the
typed answers of ``contract.CALLS``, raise ``GovernedMemoryError`` with the server's reason code, and
remember the generation consent and erasures return, so the next scope header carries it. A call that gets no
answer (the server unreachable, gone mid-call, past the client's timeout) or an answer not of the contract is
``service_unavailable`` with a content-free cause (``unreachable``, ``timeout``, ``transport``, ``bad_answer``),
never httpx's exception: an unanswered erasure may have happened, so ask ``status``, or retry with a fresh token.
Nothing here logs a token or content.

The control API is served by whoever holds the store (docs/bridge.md, "Where the control API is served"): the
governed memory service (``kagent-memory-governed serve``, HTTPS on its control port, default 8443) when the agent
runs remote (``KAGENT_GOVERNED_MEMORY_SERVICE_URL`` set on it), the agent's own HTTP app when it runs the
in-process store. A2A requests, with their scope header, always go to the agent. One service serves several
agents: each token's audience (``<ns>/<name>#control``, ``#offboard``) names the signer's agent.

    signer = ScopeSigner(private_key, issuer="matrix-bridge", agent="kagent/helper")
    control = httpx.Client(base_url=service_url, verify=ssl.create_default_context(cafile=service_ca_file))
    # in-process: control = httpx.Client(base_url=agent_url)
    memory = ControlClient(control, signer, Subject("@alice:example.org", "!room:example.org"))
    memory.consent("assist", "2026-11")
    httpx.post(agent_url, json=a2a_request, headers=memory.headers())   # X-User-Id and X-Memory-Scope
    memory.forget(memory.entries().entries[0].id)

Importing this module loads nothing of the store, the key stores, the servers or a database driver
(tests/core/test_imports.py).
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import ValidationError

from kagent_memory_governed import clock
from kagent_memory_governed.assertion import MAX_LIFETIME_SECONDS
from kagent_memory_governed.contract import (
    CALLS,
    PREFIX,
    Answer,
    Body,
    Call,
    ConfirmBody,
    Consent,
    ConsentBody,
    ControlOperation,
    Forgotten,
    ForgottenAll,
    LastErasure,
    Memories,
    Memory,
    PageQuery,
    PrincipalOffboarded,
    ScopeStatus,
    SwitchedOff,
)
from kagent_memory_governed.errors import Cause, GovernedMemoryError, Reason
from kagent_memory_governed.limits import MAX_PAGE

Op = Literal["consent", "status", "entries", "forget", "forget-all", "off", "offboard"]
A = TypeVar("A", bound=Answer)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


_HEADER = _b64(json.dumps({"alg": "EdDSA", "typ": "JWT"}).encode())


@dataclass(frozen=True, slots=True)
class Subject:
    """Whose memory, where: a complete Matrix user id, its origin, and the control room of the scope."""

    mxid: str
    room: str
    origin: Literal["native", "appservice"] = "native"


class ScopeSigner:
    """Signs scope headers and control tokens for one agent (``namespace/name``) as one issuer."""

    def __init__(self, private_key: Ed25519PrivateKey, issuer: str, agent: str, *, lifetime_seconds: int = 120) -> None:
        if not 0 < lifetime_seconds <= MAX_LIFETIME_SECONDS:
            raise ValueError(f"a token lives at most {MAX_LIFETIME_SECONDS} seconds")
        self._key, self.issuer, self.agent, self.lifetime = private_key, issuer, agent, lifetime_seconds

    @property
    def public_pem(self) -> str:
        """The key the runtime trusts (``KAGENT_GOVERNED_MEMORY_BRIDGE_PUBLIC_KEY``)."""
        return self._key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()

    def scope(self, subject: Subject, generation: int) -> str:
        """The ``X-Memory-Scope`` header of one A2A request, under consent ``generation``."""
        return self._sign(self.agent, self._room_claims(subject) | {"gen": generation})

    def control(self, subject: Subject, op: Op, *, entry: uuid.UUID | None = None) -> str:
        """A control token for one call of ``op`` on the subject's scope (``offboard``: all of their scopes);
        a ``forget`` token names its ``entry``, so it cannot forget another."""
        if op == "offboard":
            return self._sign(f"{self.agent}#offboard", {"sub": subject.mxid, "origin": subject.origin, "op": op})
        bound = {"entry": str(entry)} if entry is not None else {}
        return self._sign(f"{self.agent}#control", self._room_claims(subject) | {"op": op} | bound)

    @staticmethod
    def _room_claims(subject: Subject) -> dict[str, Any]:
        return {"sub": subject.mxid, "origin": subject.origin, "room": subject.room, "scope": "control-room"}

    def _sign(self, audience: str, claims: dict[str, Any]) -> str:
        issued = int(clock.now().timestamp())
        payload = {"iss": self.issuer, "aud": audience, **claims, "iat": issued, "exp": issued + self.lifetime}
        payload["jti"] = uuid.uuid4().hex
        signing_input = f"{_HEADER}.{_b64(json.dumps(payload).encode())}"
        return f"{signing_input}.{_b64(self._key.sign(signing_input.encode()))}"


def _unanswered(error: httpx.TransportError) -> GovernedMemoryError:
    """No answer, as a reason code: the exception's text (a URL, an address) is not passed on."""
    if isinstance(error, httpx.TimeoutException):
        cause = Cause.TIMEOUT
    elif isinstance(error, httpx.ConnectError):
        cause = Cause.UNREACHABLE
    else:
        cause = Cause.TRANSPORT
    return GovernedMemoryError(Reason.SERVICE_UNAVAILABLE, cause=cause)


def _reason(code: object) -> Reason:
    """The server's reason code; anything this client does not know is ``internal_error``."""
    return Reason(code) if isinstance(code, str) and code in set(Reason) else Reason.INTERNAL_ERROR


B = TypeVar("B", bound=Body)


def _valid(model: type[B], **values: object) -> B:
    """What the server would refuse as ``bad_input`` is refused here, without a call or a spent token."""
    try:
        return model.model_validate(values)
    except ValidationError:
        raise GovernedMemoryError(Reason.BAD_INPUT) from None


@dataclass(frozen=True, slots=True)
class _Request:
    """One call as it is sent: the table's call, its token and what goes with it."""

    call: Call
    path: str
    body: dict[str, Any] | None = None
    params: dict[str, str] | None = None
    entry: uuid.UUID | None = None


class _Client:
    """What both clients share: the subject, the signer, the generation, and each call's request and answer."""

    def __init__(self, signer: ScopeSigner, subject: Subject, generation: int = 1) -> None:
        self.signer, self.subject, self.generation = signer, subject, generation

    def headers(self) -> dict[str, str]:
        """The headers of an A2A request for this subject under the current generation."""
        return {"X-User-Id": self.subject.mxid, "X-Memory-Scope": self.signer.scope(self.subject, self.generation)}

    @staticmethod
    def _consent(purpose: str, policy_version: str) -> _Request:
        body = _valid(ConsentBody, purpose=purpose, policy_version=policy_version).model_dump()
        return _Request(CALLS[ControlOperation.CONSENT], "/consent", body)

    @staticmethod
    def _entries(limit: int, cursor: str | None) -> _Request:
        query = _valid(PageQuery, limit=limit, cursor=cursor)
        return _Request(CALLS[ControlOperation.ENTRIES], "/entries", params=query.params())

    @staticmethod
    def _forget(entry_id: uuid.UUID | str) -> _Request:
        entry = uuid.UUID(str(entry_id))
        return _Request(CALLS[ControlOperation.FORGET], f"/entries/{entry}", entry=entry)

    @staticmethod
    def _confirmed(op: ControlOperation) -> _Request:
        call = CALLS[op]
        return _Request(call, call.path, ConfirmBody(confirm=True).model_dump())

    def _send(self, request: _Request) -> dict[str, Any]:
        token = self.signer.control(self.subject, request.call.op.value, entry=request.entry)
        return {
            "method": request.call.method,
            "url": PREFIX + request.path,
            "json": request.body,
            "params": request.params,
            "headers": {"Authorization": f"Bearer {token}"},
        }

    def _read(self, answer: httpx.Response, model: type[A]) -> A:
        try:
            found = answer.json()
        except ValueError:
            found = None
        if answer.status_code != 200 or not isinstance(found, dict):
            raise GovernedMemoryError(_reason(found.get("error") if isinstance(found, dict) else None))
        try:
            value = model.model_validate(found)
        except ValidationError:  # a 200 that is not this call's answer
            raise GovernedMemoryError(Reason.SERVICE_UNAVAILABLE, cause=Cause.BAD_ANSWER) from None
        generation = getattr(value, "generation", None)
        if isinstance(generation, int) and generation >= 1:
            self.generation = generation
        return value


class ControlClient(_Client):
    """The control API over a synchronous ``httpx.Client`` whose ``base_url`` serves it: the memory service's control
    URL (``https://<host>:8443``) for an agent in remote mode, the agent's own URL for one running the in-process
    store. Every call answers its typed value, or raises ``GovernedMemoryError`` with the server's reason code."""

    def __init__(self, http: httpx.Client, signer: ScopeSigner, subject: Subject, generation: int = 1) -> None:
        super().__init__(signer, subject, generation)
        self.http = http

    def consent(self, purpose: str, policy_version: str) -> Consent:
        return self._call(self._consent(purpose, policy_version), Consent)

    def status(self) -> ScopeStatus:
        return self._call(_Request(CALLS[ControlOperation.STATUS], "/status"), ScopeStatus)

    def entries(self, limit: int = MAX_PAGE, cursor: str | None = None) -> Memories:
        return self._call(self._entries(limit, cursor), Memories)

    def forget(self, entry_id: uuid.UUID | str) -> Forgotten:
        """Forget one entry, with a token bound to it."""
        return self._call(self._forget(entry_id), Forgotten)

    def forget_all(self) -> ForgottenAll:
        return self._call(self._confirmed(ControlOperation.FORGET_ALL), ForgottenAll)

    def off(self) -> SwitchedOff:
        return self._call(self._confirmed(ControlOperation.OFF), SwitchedOff)

    def offboard(self) -> PrincipalOffboarded:
        return self._call(self._confirmed(ControlOperation.OFFBOARD), PrincipalOffboarded)

    def _call(self, request: _Request, model: type[A]) -> A:
        try:
            answer = self.http.request(**self._send(request))
        except httpx.TransportError as error:
            raise _unanswered(error) from None
        return self._read(answer, model)


class AsyncControlClient(_Client):
    """The control API over an ``httpx.AsyncClient`` with the same ``base_url`` as ``ControlClient``'s; every call is
    awaited and answers as ``ControlClient``'s."""

    def __init__(self, http: httpx.AsyncClient, signer: ScopeSigner, subject: Subject, generation: int = 1) -> None:
        super().__init__(signer, subject, generation)
        self.http = http

    async def consent(self, purpose: str, policy_version: str) -> Consent:
        return await self._call(self._consent(purpose, policy_version), Consent)

    async def status(self) -> ScopeStatus:
        return await self._call(_Request(CALLS[ControlOperation.STATUS], "/status"), ScopeStatus)

    async def entries(self, limit: int = MAX_PAGE, cursor: str | None = None) -> Memories:
        return await self._call(self._entries(limit, cursor), Memories)

    async def forget(self, entry_id: uuid.UUID | str) -> Forgotten:
        """Forget one entry, with a token bound to it."""
        return await self._call(self._forget(entry_id), Forgotten)

    async def forget_all(self) -> ForgottenAll:
        return await self._call(self._confirmed(ControlOperation.FORGET_ALL), ForgottenAll)

    async def off(self) -> SwitchedOff:
        return await self._call(self._confirmed(ControlOperation.OFF), SwitchedOff)

    async def offboard(self) -> PrincipalOffboarded:
        return await self._call(self._confirmed(ControlOperation.OFFBOARD), PrincipalOffboarded)

    async def _call(self, request: _Request, model: type[A]) -> A:
        try:
            answer = await self.http.request(**self._send(request))
        except httpx.TransportError as error:
            raise _unanswered(error) from None
        return self._read(answer, model)


__all__ = [
    "AsyncControlClient",
    "Consent",
    "ControlClient",
    "Forgotten",
    "ForgottenAll",
    "LastErasure",
    "Memories",
    "Memory",
    "PrincipalOffboarded",
    "ScopeSigner",
    "ScopeStatus",
    "Subject",
    "SwitchedOff",
]
