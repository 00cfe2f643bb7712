"""What the data plane's service and its client agree on beyond the ``.proto``: the metadata names, the bounds of
a message, the search bounds the service fixes, and the gRPC status each reason code travels with.

A refusal is a status whose details are exactly a ``Reason`` value and whose code is ``STATUS[reason]``; a client
takes nothing else for a reason code (``remote``). Imports nothing of the server or the store."""

from __future__ import annotations

import base64
import binascii
import json
from ipaddress import ip_address

import grpc

from kagent_memory_governed.errors import Reason

SCOPE = "x-memory-scope"  # the bridge-signed JWS, exactly as the runtime received it in ``X-Memory-Scope``
AUTHORIZATION = "authorization"  # ``Bearer <workload identity token>``: which agent calls
MAX_MESSAGE_BYTES = 1 << 20  # a write of 100 facts of 512 bytes with 768-d vectors is about 360 KiB
# a replica that comes back is reached again within this (gRPC's default backoff grows to 120 s)
RECONNECT_BACKOFF_MS = (200, 2000)
SEARCH_TOP_K = 5  # hits per embedding, fixed by the service (ADR 0001)
SEARCH_MIN_SCORE = 0.3
MAX_TOKEN_CHARS = 4096  # assertion.MAX_TOKEN_BYTES (not imported: assertion reaches the store package)
MAX_ID_CHARS = 256  # a session or invocation id
MAX_CANDIDATES = 4096  # invocation ids a collection names; the client sends the most recent
MAX_PENDING_CALLS = 128  # calls of one Exchange stream the service works on at once; it reads no more meanwhile
DEFAULT_DEADLINE_SECONDS = 5.0  # the client's, per call
DEFAULT_HANDLER_SECONDS = 10.0  # the service's bound on one handler, whatever the client's deadline

_CODE = grpc.StatusCode
STATUS: dict[Reason, grpc.StatusCode] = {
    Reason.NO_ASSERTION: _CODE.UNAUTHENTICATED,
    Reason.BAD_ASSERTION: _CODE.UNAUTHENTICATED,
    Reason.ASSERTION_REPLAYED: _CODE.UNAUTHENTICATED,
    Reason.BAD_IDENTITY: _CODE.UNAUTHENTICATED,
    Reason.ASSERTION_EXPIRING: _CODE.UNAUTHENTICATED,
    Reason.PRINCIPAL_NOT_ADMITTED: _CODE.PERMISSION_DENIED,
    Reason.SCOPE_MISMATCH: _CODE.PERMISSION_DENIED,
    Reason.CONSENT_MISSING: _CODE.FAILED_PRECONDITION,
    Reason.CONSENT_DISABLED: _CODE.FAILED_PRECONDITION,
    Reason.CONSENT_STALE: _CODE.FAILED_PRECONDITION,
    Reason.CONSENT_EXPIRED: _CODE.FAILED_PRECONDITION,
    Reason.ERASURE_FAILED: _CODE.FAILED_PRECONDITION,
    Reason.ERASURE_PENDING: _CODE.FAILED_PRECONDITION,
    Reason.CONFIRMATION_REQUIRED: _CODE.FAILED_PRECONDITION,
    Reason.SCHEMA_OUTDATED: _CODE.FAILED_PRECONDITION,
    Reason.SCHEMA_MISSING: _CODE.FAILED_PRECONDITION,
    Reason.SCHEMA_NEWER: _CODE.FAILED_PRECONDITION,
    Reason.UNSUPPORTED_DATABASE: _CODE.FAILED_PRECONDITION,
    Reason.KEY_STORE_MISMATCH: _CODE.FAILED_PRECONDITION,
    Reason.ENTRY_CAP_REACHED: _CODE.RESOURCE_EXHAUSTED,
    Reason.RATE_LIMITED: _CODE.RESOURCE_EXHAUSTED,
    Reason.HOURLY_CEILING: _CODE.RESOURCE_EXHAUSTED,
    Reason.BODY_TOO_LARGE: _CODE.RESOURCE_EXHAUSTED,
    Reason.BAD_INPUT: _CODE.INVALID_ARGUMENT,
    Reason.FACT_TOO_LARGE: _CODE.INVALID_ARGUMENT,
    Reason.MALFORMED_SUMMARY: _CODE.INVALID_ARGUMENT,
    Reason.NOT_FOUND: _CODE.NOT_FOUND,
    Reason.METHOD_NOT_ALLOWED: _CODE.UNIMPLEMENTED,
    Reason.STORE_UNAVAILABLE: _CODE.UNAVAILABLE,
    Reason.KEY_UNAVAILABLE: _CODE.UNAVAILABLE,
    Reason.STORE_REGRESSED: _CODE.UNAVAILABLE,  # brought forward: the next call may serve
    Reason.KEYRING_STALE: _CODE.UNAVAILABLE,
    Reason.IDENTITY_UNAVAILABLE: _CODE.UNAVAILABLE,
    Reason.SERVICE_UNAVAILABLE: _CODE.UNAVAILABLE,
    Reason.MODEL_FAILED: _CODE.INTERNAL,
    Reason.EMBEDDING_FAILED: _CODE.INTERNAL,
    Reason.INTERNAL_ERROR: _CODE.INTERNAL,
}


def status(reason: Reason) -> grpc.StatusCode:
    """The gRPC status code a refusal with ``reason`` travels with (``INTERNAL`` for a code not listed yet)."""
    return STATUS.get(reason, _CODE.INTERNAL)


def reason_of(code: object, details: object) -> Reason | None:
    """The reason code of a status, if it is one as the service sends it: details exactly a code, with its status
    code. ``None`` for anything else (another status, a proxy's answer, text)."""
    if not isinstance(details, str):
        return None
    try:
        reason = Reason(details)
    except ValueError:
        return None
    return reason if code == status(reason) else None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 in brackets or not) is this machine's loopback."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


def claims_unverified(token: object) -> dict[str, object] | None:
    """The claims a compact JWS carries, read without verifying anything (``None`` if it carries none). Only for
    what verification then checks (the service: the subject to hold ``sub`` to) or what merely avoids a wrong call
    (the client: the token is the one for the scope it was asked about)."""
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS or token.count(".") != 2:
        return None
    payload = token.split(".")[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (binascii.Error, ValueError, RecursionError):
        return None
    return claims if isinstance(claims, dict) else None
