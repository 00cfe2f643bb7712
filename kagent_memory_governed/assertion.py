"""The bridge's signed scope assertion: a compact JWS, Ed25519 (``EdDSA``) only.

Verification is a pure function of the token, the expected audience, the request's ``X-User-Id``, the
trust settings, the operation it is presented for and the application clock. It never consults the
token's header for a key or an algorithm choice (no ``none``, no HMAC, no ``jku``/``jwk``/``x5u``), accepts
only canonical base64url (one spelling per token), refuses duplicate JSON members, and answers with a reason
code only:

- ``no_assertion``            no token at all;
- ``bad_assertion``           not a well-formed EdDSA JWS from our issuer, for our audience and operation, in
                              its lifetime (``iat``, ``exp`` and, when present, ``nbf``);
- ``principal_not_admitted``  a principal other than a native user of the configured homeserver (R4);
- ``scope_mismatch``          ``sub`` is not exactly the request's ``X-User-Id``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from kagent_memory_governed.consent import admit_generation
from kagent_memory_governed.ed25519 import is_prime_order_point
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.scope import AgentId, ControlRoom, Origin, Principal, ScopeKey, ScopeKind

MAX_TOKEN_BYTES = 4096
MAX_LIFETIME_SECONDS = 300
LEEWAY_SECONDS = 30
_ALLOWED_HEADER = {"alg", "typ", "kid"}  # anything else (jku, jwk, x5u, x5c, crit, ...) is refused
_SCOPE_CLAIMS = {"iss", "aud", "sub", "origin", "room", "scope", "gen", "iat", "exp", "jti"}
_CONTROL_CLAIMS = _SCOPE_CLAIMS - {"gen"}
_OFFBOARD_CLAIMS = _CONTROL_CLAIMS - {"room", "scope"}
_PURPOSES = {
    "scope": (_SCOPE_CLAIMS, ""),
    "control": (_CONTROL_CLAIMS | {"op"}, "#control"),
    "offboard": (_OFFBOARD_CLAIMS | {"op"}, "#offboard"),
}
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")


class ControlOperation(StrEnum):
    """The ``op`` claim of a control or offboarding token: the one call it was minted for."""

    CONSENT = "consent"
    STATUS = "status"
    ENTRIES = "entries"
    FORGET = "forget"
    FORGET_ALL = "forget-all"
    OFF = "off"
    OFFBOARD = "offboard"

    @property
    def single_use(self) -> bool:
        """Whether a token for this operation is accepted once only (``status`` and ``entries`` only read)."""
        return self not in (ControlOperation.STATUS, ControlOperation.ENTRIES)

    @property
    def purpose(self) -> Literal["control", "offboard"]:
        """The token's audience suffix: ``#offboard`` for offboarding, ``#control`` for every other call."""
        return "offboard" if self is ControlOperation.OFFBOARD else "control"


def _bad() -> GovernedMemoryError:
    return GovernedMemoryError(Reason.BAD_ASSERTION)


@dataclass(frozen=True, slots=True)
class Trust:
    """What a token must match: the bridge's key and issuer, this agent, and the local homeserver."""

    public_key: Ed25519PublicKey
    issuer: str
    agent: AgentId
    homeserver: str

    @staticmethod
    def load_public_key(value: str) -> Ed25519PublicKey:
        """An Ed25519 public key from PEM text or ``@/path/to/key.pem``; ``ValueError`` for anything else,
        and for a small-order, mixed-order, off-curve or non-canonically encoded point: with a small-order
        key, a forged signature verifies for every message."""
        pem = Path(value[1:]).read_bytes() if value.startswith("@") else value.encode()
        key = load_pem_public_key(pem)
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("the bridge public key must be an Ed25519 key")
        if not is_prime_order_point(key.public_bytes_raw()):
            raise ValueError("the bridge public key must be a canonical Ed25519 point of prime order")
        return key


@dataclass(frozen=True, slots=True)
class Assertion:
    """A verified assertion. ``key`` is ``None`` for offboarding tokens, ``generation`` for control and
    offboarding tokens, and ``op`` (the operation the token names) for scope headers. ``entry`` is the one
    entry a ``forget`` token was minted for, when it names one."""

    principal: Principal
    key: ScopeKey | None
    generation: int | None
    op: ControlOperation | None
    jti: str
    expires_at: datetime
    entry: uuid.UUID | None = None


def _b64(part: str) -> bytes:
    """The bytes of one JWS segment, written exactly as base64url without padding would write them: no
    ``=``, no ``+``/``/``, no set bits past the last byte. Anything else is another spelling of a token."""
    if _BASE64URL.fullmatch(part) is None:
        raise _bad()
    try:
        raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        raise _bad() from None
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != part:
        raise _bad()
    return raw


def _unique_members(pairs: list[tuple[str, object]]) -> dict[str, object]:
    members = dict(pairs)
    if len(members) != len(pairs):
        raise _bad()
    return members


def _no_constant(name: str) -> object:
    raise _bad()  # NaN and the infinities are not JSON, in any claim


def _json_object(raw: bytes) -> dict[str, object]:
    try:
        value = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_members, parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise _bad() from None
    if not isinstance(value, dict):
        raise _bad()
    return value


def _signed_claims(token: object, public_key: Ed25519PublicKey) -> dict[str, object]:
    if token is None or token == "":
        raise GovernedMemoryError(Reason.NO_ASSERTION)
    if not isinstance(token, str) or len(token) > MAX_TOKEN_BYTES or not token.isascii():
        raise _bad()
    parts = token.split(".")
    if len(parts) != 3:
        raise _bad()
    header = _json_object(_b64(parts[0]))
    if header.get("alg") != "EdDSA" or not set(header) <= _ALLOWED_HEADER:
        raise _bad()
    try:
        public_key.verify(_b64(parts[2]), f"{parts[0]}.{parts[1]}".encode())
    except InvalidSignature:
        raise _bad() from None
    return _json_object(_b64(parts[1]))


def _seconds(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad()
    return value


def verify(
    token: object,
    trust: Trust,
    *,
    now: datetime,
    purpose: str = "scope",
    user_id: object = None,
    op: ControlOperation | None = None,
) -> Assertion:
    """Verify ``token`` at ``now`` for one purpose of this agent:

    - ``"scope"``: the per-request ``X-Memory-Scope``; ``aud`` is ``<namespace>/<name>``, ``gen`` is required
      and ``sub`` must equal ``user_id`` (the request's ``X-User-Id``) exactly; an ``op`` claim is refused
      (a control token is never a scope header);
    - ``"control"``: a control API token; ``aud`` is ``<namespace>/<name>#control``, no ``gen``;
    - ``"offboard"``: ``aud`` is ``<namespace>/<name>#offboard``; names a principal only (no room or scope).

    A control or offboarding token is accepted for the operation ``op`` only: its ``op`` claim must equal it.
    A ``forget`` token may carry ``entry``, an entry id in its canonical form, binding it to that entry (the
    caller compares, ``Assertion.entry``); any other token carrying ``entry`` is refused. Whether a token has
    been used before is the caller's question (``ControlOperation.single_use``, ``Store.claim_once``).
    """
    if (op is None) != (purpose == "scope"):
        raise TypeError("verify: a control or offboard purpose needs its operation, a scope header none")
    claims = _signed_claims(token, trust.public_key)
    required, suffix = _PURPOSES[purpose]
    if not required <= set(claims):
        raise _bad()
    if claims["iss"] != trust.issuer or claims["aud"] != f"{trust.agent}{suffix}":
        raise _bad()
    if op is None and "op" in claims:  # a control token is never a scope header
        raise _bad()
    if op is not None and claims["op"] != op.value:
        raise _bad()
    issued, expires = _seconds(claims["iat"]), _seconds(claims["exp"])
    moment = now.timestamp()
    if not 0 < expires - issued <= MAX_LIFETIME_SECONDS:
        raise _bad()
    if issued > moment + LEEWAY_SECONDS or expires + LEEWAY_SECONDS <= moment:
        raise _bad()
    if "nbf" in claims:  # optional; when present, the same leeway as iat, and before exp
        not_before = _seconds(claims["nbf"])
        if not_before > moment + LEEWAY_SECONDS or not_before >= expires:
            raise _bad()
    jti = claims["jti"]
    if not isinstance(jti, str) or not 1 <= len(jti) <= 128 or not jti.isascii() or not jti.isprintable():
        raise _bad()
    try:
        principal = Principal.parse(claims["sub"], claims["origin"])
    except GovernedMemoryError:
        raise _bad() from None
    if principal.origin is not Origin.NATIVE or principal.server != trust.homeserver:
        raise GovernedMemoryError(Reason.PRINCIPAL_NOT_ADMITTED)
    if purpose == "scope" and user_id != principal.mxid:
        raise GovernedMemoryError(Reason.SCOPE_MISMATCH)
    key = generation = None
    if purpose != "offboard":
        if claims["scope"] != ScopeKind.CONTROL_ROOM.value:
            raise _bad()
        try:
            key = ScopeKey(principal, trust.agent, ControlRoom.parse(claims["room"]))
            generation = admit_generation(claims["gen"]) if purpose == "scope" else None
        except GovernedMemoryError:
            raise _bad() from None
    entry = _entry(claims["entry"], op) if "entry" in claims else None
    return Assertion(principal, key, generation, op, jti, datetime.fromtimestamp(expires, UTC), entry)


def _entry(value: object, op: ControlOperation | None) -> uuid.UUID:
    """The entry a ``forget`` token is bound to: a UUID in the canonical lower-case form the API answers."""
    if op is not ControlOperation.FORGET or not isinstance(value, str):
        raise _bad()
    try:
        entry = uuid.UUID(value)
    except ValueError:
        raise _bad() from None
    if str(entry) != value:
        raise _bad()
    return entry
