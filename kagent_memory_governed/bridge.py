"""A client for the Matrix bridge: it signs what the runtime verifies and calls the control API.

``ScopeSigner`` mints the per-request ``X-Memory-Scope`` header and one control token per operation
(EdDSA, the exact claims of CONTRACT.md, ``op`` set, a fresh ``jti``, a lifetime of at most 300 s from
the application clock, so frozen clocks govern tokens too). ``ControlClient`` (httpx, sync) and
``AsyncControlClient`` call every ``/memory/v1`` operation for one subject in one control room, answer
typed values, raise ``GovernedMemoryError`` with the server's reason code, and remember the generation
consent and erasures return, so the next scope header carries it. Nothing here logs a token or content.

    signer = ScopeSigner(private_key, issuer="matrix-bridge", agent="kagent/helper")
    memory = ControlClient(httpx.Client(base_url=agent_url), signer, Subject("@alice:example.org", "!room:example.org"))
    memory.consent("assist", "2026-11")
    httpx.post(agent_url, json=a2a_request, headers=memory.headers())   # X-User-Id and X-Memory-Scope
    memory.forget(memory.entries().entries[0].id)
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeVar

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import BaseModel, ConfigDict

from kagent_memory_governed import clock
from kagent_memory_governed.assertion import MAX_LIFETIME_SECONDS
from kagent_memory_governed.errors import GovernedMemoryError, Reason

Op = Literal["consent", "status", "entries", "forget", "forget-all", "off", "offboard"]
PREFIX = "/memory/v1"


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


class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class Consent(_Answer):
    enabled: bool
    generation: int
    max_expiry_seconds: int
    entry_cap: int


class LastErasure(_Answer):
    at: datetime
    result: str


class ScopeStatus(_Answer):
    enabled: bool
    generation: int
    purpose: str | None
    policy_version: str | None
    max_expiry_seconds: int
    entry_cap: int
    entries: int
    last_erasure: LastErasure | None


class Memory(_Answer):
    id: uuid.UUID
    text: str
    source_scope: str
    created_at: datetime
    expires_at: datetime


class Memories(_Answer):
    entries: list[Memory]
    next_cursor: str | None


class Erasure(_Answer):
    """What an erasure answered, as sent: every one is verified; all but offboarding fence (``generation``)."""

    deleted: bool | None = None  # forget
    enabled: bool | None = None  # off
    scopes: int | None = None  # offboard
    erased: int | None = None
    verified: bool
    generation: int | None = None


A = TypeVar("A", bound=_Answer)


def _reason(code: object) -> Reason:
    """The server's reason code; anything this client does not know is ``internal_error``."""
    try:
        return Reason(code)
    except ValueError:
        return Reason.INTERNAL_ERROR


class _Client:
    """The operations, once: each builds its request and reads its answer; subclasses send it."""

    def __init__(self, signer: ScopeSigner, subject: Subject, generation: int = 1) -> None:
        self.signer, self.subject, self.generation = signer, subject, generation

    def headers(self) -> dict[str, str]:
        """The headers of an A2A request for this subject under the current generation."""
        return {"X-User-Id": self.subject.mxid, "X-Memory-Scope": self.signer.scope(self.subject, self.generation)}

    def consent(self, purpose: str, policy_version: str) -> Consent:
        return self._call("consent", "POST", "consent", Consent, {"purpose": purpose, "policy_version": policy_version})

    def status(self) -> ScopeStatus:
        return self._call("status", "GET", "status", ScopeStatus)

    def entries(self, limit: int = 50, cursor: str | None = None) -> Memories:
        params = {"limit": str(limit)} | ({"cursor": cursor} if cursor else {})
        return self._call("entries", "GET", "entries", Memories, params=params)

    def forget(self, entry_id: uuid.UUID | str) -> Erasure:
        entry = uuid.UUID(str(entry_id))
        return self._call("forget", "DELETE", f"entries/{entry}", Erasure, entry=entry)

    def forget_all(self) -> Erasure:
        return self._call("forget-all", "POST", "forget-all", Erasure, {"confirm": True})

    def off(self) -> Erasure:
        return self._call("off", "POST", "off", Erasure, {"confirm": True})

    def offboard(self) -> Erasure:
        return self._call("offboard", "POST", "offboard", Erasure, {"confirm": True})

    def _request(
        self, op: Op, method: str, path: str, body: dict | None, params: dict | None, entry: uuid.UUID | None
    ) -> dict[str, Any]:
        token = self.signer.control(self.subject, op, entry=entry)
        return {
            "method": method,
            "url": f"{PREFIX}/{path}",
            "json": body,
            "params": params,
            "headers": {"Authorization": f"Bearer {token}"},
        }

    def _read(self, answer: httpx.Response, model: type[A]) -> A:
        try:
            found = answer.json()
        except ValueError:
            found = None
        if answer.status_code != 200 or not isinstance(found, dict):
            raise GovernedMemoryError(_reason(found.get("error") if isinstance(found, dict) else None))
        value = model.model_validate(found)
        generation = getattr(value, "generation", None)
        if isinstance(generation, int) and generation >= 1:
            self.generation = generation
        return value

    def _call(
        self, op: Op, method: str, path: str, model: type[A], body: dict | None = None, params=None, entry=None
    ) -> Any:
        raise NotImplementedError


class ControlClient(_Client):
    """The control API over a synchronous ``httpx.Client`` whose ``base_url`` is the agent's."""

    def __init__(self, http: httpx.Client, signer: ScopeSigner, subject: Subject, generation: int = 1) -> None:
        super().__init__(signer, subject, generation)
        self.http = http

    def _call(
        self, op: Op, method: str, path: str, model: type[A], body: dict | None = None, params=None, entry=None
    ) -> A:
        return self._read(self.http.request(**self._request(op, method, path, body, params, entry)), model)


class AsyncControlClient(_Client):
    """The control API over an ``httpx.AsyncClient``; every operation is awaited and answers as above."""

    def __init__(self, http: httpx.AsyncClient, signer: ScopeSigner, subject: Subject, generation: int = 1) -> None:
        super().__init__(signer, subject, generation)
        self.http = http

    async def _call(
        self, op: Op, method: str, path: str, model: type[A], body: dict | None = None, params=None, entry=None
    ) -> A:
        return self._read(await self.http.request(**self._request(op, method, path, body, params, entry)), model)


__all__ = [
    "AsyncControlClient",
    "Consent",
    "ControlClient",
    "Erasure",
    "LastErasure",
    "Memories",
    "Memory",
    "ScopeSigner",
    "ScopeStatus",
    "Subject",
]
