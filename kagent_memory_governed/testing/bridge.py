"""A test double of the Matrix bridge: it holds an Ed25519 key and signs scope headers and control tokens,
and can sign anything else a test needs to attack with (other claims, other headers, other algorithms)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from kagent_memory_governed.assertion import Trust
from kagent_memory_governed.scope import AgentId

ISSUER = "matrix-bridge.example"
HOMESERVER = "example.org"
AGENT = "kagent/helper"


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def compact(header: dict[str, Any] | str, claims: dict[str, Any] | str, sign: Callable[[bytes], bytes]) -> str:
    def encode(part: dict[str, Any] | str) -> str:
        return b64((part if isinstance(part, str) else json.dumps(part)).encode())

    signing_input = f"{encode(header)}.{encode(claims)}"
    return f"{signing_input}.{b64(sign(signing_input.encode()))}"


@dataclass
class Bridge:
    private_key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)
    issuer: str = ISSUER
    agent: str = AGENT
    room: str = f"!control:{HOMESERVER}"  # the control room its tokens name unless told otherwise

    @property
    def public_pem(self) -> str:
        return self.private_key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()

    def trust(self) -> Trust:
        return Trust(self.private_key.public_key(), ISSUER, AgentId.parse(AGENT), HOMESERVER)

    def claims(self, now: float, purpose: str = "scope", **changes: Any) -> dict[str, Any]:
        suffix = {"scope": "", "control": "#control", "offboard": "#offboard"}[purpose]
        claims = {
            "iss": self.issuer,
            "aud": f"{self.agent}{suffix}",
            "sub": f"@alice:{HOMESERVER}",
            "origin": "native",
            "room": self.room,
            "scope": "control-room",
            "gen": 1,
            "iat": int(now),
            "exp": int(now) + 120,
            "jti": uuid.uuid4().hex,
        }
        if purpose != "scope":
            del claims["gen"]
        if purpose == "offboard":
            del claims["room"], claims["scope"]
        claims.update(changes)
        return {k: v for k, v in claims.items() if v is not ...}  # ... removes a claim

    def sign(self, now: float, purpose: str = "scope", header: dict[str, Any] | None = None, **changes: Any) -> str:
        """A compact JWS of ``claims(now, purpose, **changes)``. A control or offboarding token names its
        operation explicitly, as the bridge must: ``sign(t, "control", op="status")``."""
        return compact(
            header or {"alg": "EdDSA", "typ": "JWT"}, self.claims(now, purpose, **changes), self.private_key.sign
        )
