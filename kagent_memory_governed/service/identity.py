"""Which agent calls: the workload identity of a data-plane call (docs/decisions/0001-memory-service.md).

``authorization: Bearer <token>`` is the pod's projected service-account token of the service's audience, verified
offline against the JWKS the API server publishes and mapped from ``<namespace>/<service account>`` to the agent:
RS256 or ES256 by a ``kid`` of the JWKS of that key type (never ``none``, HMAC, ``jku``, ``jwk``); ``iss`` exactly the
issuer; ``aud`` exactly the one audience (kagent's ``kagent`` token, or one also meant for a recipient who could replay
it here, is refused); ``iat``, ``nbf``, ``exp`` on the application clock within LEEWAY_SECONDS, ``exp - iat`` within
max_lifetime; ``kubernetes.io`` naming a pod (a legacy Secret token has none); ``sub`` of those claims. Refusals are
``BAD_IDENTITY`` with a ``cause`` of CAUSES, keys that cannot be had ``IDENTITY_UNAVAILABLE``; no token, claim or key
value reaches an exception or a log line.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import re
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from kagent_memory_governed import clock
from kagent_memory_governed.errors import Cause, ConfigurationError, GovernedMemoryError, Reason, http_cause
from kagent_memory_governed.scope import AgentId

logger = logging.getLogger(__name__)

SETTINGS = "KAGENT_GOVERNED_MEMORY_IDENTITY_"  # the prefix of the settings a ConfigurationError names
_CAUSES = "missing malformed algorithm unknown_key key_mismatch signature issuer audience lifetime not_yet_valid"
CAUSES = frozenset(map(Cause, f"{_CAUSES} expired not_a_pod subject unknown_agent".split()))  # BAD_IDENTITY's
LEEWAY_SECONDS = 30
MAX_LIFETIME_SECONDS = 600  # the ADR's projection (expirationSeconds: 600); a longer-lived token is refused
MAX_TOKEN_BYTES = 8192
MAX_DOCUMENT_BYTES = 256 * 1024
KEPT_SECONDS = (60, 3600)  # Cache-Control: max-age, bounded; the API server answers "public, max-age=3600"
REFETCH_SECONDS = 60  # an unknown kid fetches the keys again at most this often
RETRY_SECONDS = 5  # without fresh keys, a failed fetch is tried again at most this often
CACHED_TOKENS = 4096
FETCH_TIMEOUT_SECONDS = 5.0
_SA = "system:serviceaccount:"
_POD = ("name", "uid")  # what a pod-bound token's kubernetes.io.pod carries
_HEADER = {"alg", "kid", "typ"}
_BASE64URL = re.compile(r"[A-Za-z0-9_-]*")
_MAX_AGE = re.compile(r"(?:^|,)\s*max-age\s*=\s*(\d{1,10})\s*(?:,|$)", re.IGNORECASE)

Metadata = Mapping[str, str] | Iterable[tuple[str, str | bytes]]


def _refused(cause: Cause) -> GovernedMemoryError:
    return GovernedMemoryError(Reason.BAD_IDENTITY, cause=cause)


def _unavailable(cause: Cause) -> GovernedMemoryError:
    return GovernedMemoryError(Reason.IDENTITY_UNAVAILABLE, cause=cause)


def _b64(part: object) -> bytes:
    """Canonical unpadded base64url, else ``ValueError``: one spelling of each token."""
    if not isinstance(part, str) or _BASE64URL.fullmatch(part) is None:
        raise ValueError("not base64url")
    raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != part:
        raise ValueError("not canonical base64url")
    return raw


def _unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
    if len({name for name, _ in pairs}) != len(pairs):
        raise ValueError("a member twice")
    return dict(pairs)


def _json(raw: bytes) -> dict[str, object]:
    """A JSON object without duplicate members, else ``ValueError`` (a NaN is no integer: ``_seconds`` refuses it)."""
    try:
        value = json.loads(raw.decode(), object_pairs_hook=_unique)
    except RecursionError:
        raise ValueError("nested too deep") from None
    if not isinstance(value, dict):
        raise ValueError("not an object")
    return value


@dataclass(frozen=True, slots=True)
class _Key:
    alg: str
    public: rsa.RSAPublicKey | ec.EllipticCurvePublicKey

    def verifies(self, signature: bytes, message: bytes) -> bool:
        try:
            if isinstance(self.public, rsa.RSAPublicKey):
                self.public.verify(signature, message, padding.PKCS1v15(), hashes.SHA256())
                return True
            r, s = int.from_bytes(signature[:32]), int.from_bytes(signature[32:])  # JWS: r || s (RFC 7518, 3.4)
            self.public.verify(encode_dss_signature(r, s), message, ec.ECDSA(hashes.SHA256()))
            return len(signature) == 64
        except InvalidSignature:
            return False


def _key_of(jwk: dict[str, object]) -> _Key | None:
    """The verification key of one JWK; ``None`` for a kind not verified with (ValueError: an unreadable one)."""
    if jwk.get("use", "sig") != "sig":
        return None
    if jwk.get("kty") == "RSA" and jwk.get("alg", "RS256") == "RS256":
        n, e = (int.from_bytes(_b64(jwk.get(name))) for name in ("n", "e"))
        return _Key("RS256", rsa.RSAPublicNumbers(e, n).public_key()) if n.bit_length() >= 2048 else None
    if jwk.get("kty") == "EC" and jwk.get("crv") == "P-256" and jwk.get("alg", "ES256") == "ES256":
        x, y = _b64(jwk.get("x")), _b64(jwk.get("y"))
        numbers = ec.EllipticCurvePublicNumbers(int.from_bytes(x), int.from_bytes(y), ec.SECP256R1())
        return _Key("ES256", numbers.public_key())  # ValueError off the curve
    return None


def parse_jwks(document: object) -> dict[str, _Key]:
    """The keys of a JWKS by ``kid``: RSA of 2048 bits or more (RS256), P-256 (ES256); a key of another kind, or
    unreadable, is left out. ``IDENTITY_UNAVAILABLE`` for an answer that is no JWKS or names a kid twice."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise _unavailable(Cause.JWKS_MALFORMED)
    keys: dict[str, _Key | None] = {}
    for jwk in document["keys"]:
        kid = jwk.get("kid") if isinstance(jwk, dict) else None
        if isinstance(kid, str) and kid:
            if kid in keys:
                raise _unavailable(Cause.JWKS_MALFORMED)
            try:
                keys[kid] = _key_of(jwk)
            except ValueError:
                keys[kid] = None
    return {kid: key for kid, key in keys.items() if key is not None}


def _bearer(metadata: Metadata | None) -> str:
    pairs = metadata.items() if isinstance(metadata, Mapping) else metadata or ()
    values = [value for key, value in pairs if isinstance(key, str) and key.lower() == "authorization"]
    if not values:
        raise _refused(Cause.MISSING)
    scheme, _, token = values[0].partition(" ") if isinstance(values[0], str) else ("", "", "")
    if len(values) > 1 or scheme.lower() != "bearer" or not token:
        raise _refused(Cause.MALFORMED)
    return token


def _parse(token: str) -> tuple[str, str, bytes, bytes, bytes]:
    """``(alg, kid, signed message, signature, payload)``, or refused before any key is looked up."""
    if len(token) > MAX_TOKEN_BYTES or not token.isascii() or token.count(".") != 2:
        raise _refused(Cause.MALFORMED)
    head, body, signature = token.split(".")
    try:
        header, signed, payload = _json(_b64(head)), _b64(signature), _b64(body)
    except ValueError:
        raise _refused(Cause.MALFORMED) from None
    alg, kid = header.get("alg"), header.get("kid")
    if alg not in ("RS256", "ES256") or not isinstance(alg, str):
        raise _refused(Cause.ALGORITHM)
    if not set(header) <= _HEADER or header.get("typ", "JWT") != "JWT" or not isinstance(kid, str) or not kid:
        raise _refused(Cause.MALFORMED)
    return alg, kid, f"{head}.{body}".encode(), signed, payload


def _seconds(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refused(Cause.MALFORMED)
    return value


def service_account(
    claims: dict[str, object], *, issuer: str, audience: str, now: datetime, max_lifetime: int
) -> tuple[str, str, int]:
    """``(namespace, service account, exp)`` of a signed token's claims, or ``BAD_IDENTITY`` with its cause."""
    if claims.get("iss") != issuer:
        raise _refused(Cause.ISSUER)
    audiences = claims.get("aud")
    if (audiences if isinstance(audiences, list) else [audiences]) != [audience]:
        raise _refused(Cause.AUDIENCE)
    kube = claims.get("kubernetes.io")
    pod = kube.get("pod") if isinstance(kube, dict) else None
    named = isinstance(pod, dict) and all(isinstance(pod.get(k), str) and pod[k] for k in _POD)
    if not isinstance(kube, dict) or not named:
        raise _refused(Cause.NOT_A_POD)
    issued, not_before, expires = (_seconds(claims.get(name)) for name in ("iat", "nbf", "exp"))
    moment = now.timestamp()
    if not 0 < expires - issued <= max_lifetime or not_before > expires:
        raise _refused(Cause.LIFETIME)
    if issued > moment + LEEWAY_SECONDS or not_before > moment + LEEWAY_SECONDS:
        raise _refused(Cause.NOT_YET_VALID)
    if expires + LEEWAY_SECONDS <= moment:
        raise _refused(Cause.EXPIRED)
    namespace, account = kube.get("namespace"), kube.get("serviceaccount")
    name = account.get("name") if isinstance(account, dict) else None
    if not isinstance(namespace, str) or not isinstance(name, str) or claims.get("sub") != f"{_SA}{namespace}:{name}":
        raise _refused(Cause.SUBJECT)
    return namespace, name, expires


def agent_table(entries: Mapping[str, str] | Iterable[tuple[str, str]] | None) -> dict[str, AgentId] | None:
    """``<namespace>/<service account>`` to its agent, ``None`` for the identity. ``ConfigurationError`` (never a value)
    for a name that is none, an agent outside its service account's namespace, or a service account two agents share."""
    if entries is None:
        return None
    setting, table = f"{SETTINGS}AGENTS", dict[str, AgentId]()
    for account, agent in entries.items() if isinstance(entries, Mapping) else entries:
        try:
            key, value = AgentId.parse(account), AgentId.parse(agent)
        except GovernedMemoryError:
            raise ConfigurationError(f"{setting}: <namespace>/<service account> to <namespace>/<agent>") from None
        if key.namespace != value.namespace:
            raise ConfigurationError(f"{setting}: an agent in another namespace than its service account")
        if table.setdefault(str(key), value) != value:
            raise ConfigurationError(f"{setting}: a service account two agents share", code="shared_service_account")
    return table


class WorkloadIdentity:
    """The agent a data-plane call comes from, proved by its projected service-account token (module docstring).
    Construction refuses bad settings with ``ConfigurationError``; ``aclose`` releases the HTTP client."""

    def __init__(
        self,
        *,
        issuer: str,
        audience: str,
        api_server: str,
        ca_file: Path | None,
        token_file: Path | None,
        agents: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
        max_lifetime: int = MAX_LIFETIME_SECONDS,
    ) -> None:
        base = urlsplit(api_server)
        if not issuer or not audience:
            raise ConfigurationError(f"{SETTINGS}ISSUER and {SETTINGS}AUDIENCE must not be empty", code="missing")
        if base.scheme != "https" or not base.hostname or base.query or base.fragment or base.username:
            raise ConfigurationError(f"{SETTINGS}API_SERVER: https://host[:port] without credentials or query")
        try:
            context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        except (OSError, ValueError):  # ssl.SSLError is an OSError
            raise ConfigurationError(f"{SETTINGS}CA: not a readable file of certificates") from None
        self._issuer, self._audience, self._max_lifetime = issuer, audience, max_lifetime
        self._table, self._token_file = agent_table(agents), token_file
        self._origin, self._base = f"https://{base.netloc}", api_server.rstrip("/")
        self._http = httpx.AsyncClient(verify=context, timeout=FETCH_TIMEOUT_SECONDS, trust_env=False)
        self._lock, self._failure = asyncio.Lock(), Cause.NOT_FETCHED
        self._keys, self._verified = dict[str, _Key](), dict[bytes, tuple[AgentId, int]]()
        self._fresh_until = self._attempted = datetime.min.replace(tzinfo=UTC)

    async def agent(self, metadata: Metadata | None) -> AgentId:
        """The agent whose pod holds the call's token. ``BAD_IDENTITY`` (cause in CAUSES) for a token not accepted,
        ``IDENTITY_UNAVAILABLE`` when the cluster's keys cannot be had now."""
        bearer = _bearer(metadata)  # a token verified before is found by the digest of its text, before parsing
        digest = hashlib.sha256(bearer.encode()).digest() if bearer.isascii() else b""
        remembered, until = self._verified.get(digest, (None, 0))
        if remembered is not None and clock.now().timestamp() < until:
            return remembered
        self._verified.pop(digest, None)
        alg, kid, message, signature, payload = _parse(bearer)
        key = await self._key(kid)
        if key.alg != alg:
            raise _refused(Cause.KEY_MISMATCH)
        if not key.verifies(signature, message):
            raise _refused(Cause.SIGNATURE)
        try:
            claims = _json(payload)
        except ValueError:
            raise _refused(Cause.MALFORMED) from None
        namespace, account, expires = service_account(
            claims, issuer=self._issuer, audience=self._audience, now=clock.now(), max_lifetime=self._max_lifetime
        )
        account = f"{namespace}/{account}"
        try:
            agent = self._table[account] if self._table is not None else AgentId.parse(account)
        except (KeyError, GovernedMemoryError):
            raise _refused(Cause.UNKNOWN_AGENT) from None
        if len(self._verified) >= CACHED_TOKENS:  # the oldest first: lifetimes are alike
            del self._verified[next(iter(self._verified))]
        self._verified[digest] = (agent, expires + LEEWAY_SECONDS)  # accepted until then, as verify would
        return agent

    async def _key(self, kid: str) -> _Key:
        """The key of ``kid``: fetched when the keys are stale or absent (at most every RETRY_SECONDS after a
        failure), and for an unknown ``kid`` at most every REFETCH_SECONDS."""
        if clock.now() < self._fresh_until and kid in self._keys:
            return self._keys[kid]
        async with self._lock:  # one fetch at a time; those who waited read what it brought
            now = clock.now()
            fresh = now < self._fresh_until
            if fresh and kid in self._keys:
                return self._keys[kid]
            if now < self._attempted + timedelta(seconds=REFETCH_SECONDS if fresh else RETRY_SECONDS):
                raise _refused(Cause.UNKNOWN_KEY) if fresh else _unavailable(self._failure)
            await self._refresh(now)
            if kid not in self._keys:
                raise _refused(Cause.UNKNOWN_KEY)
            return self._keys[kid]

    async def _refresh(self, now: datetime) -> None:
        self._attempted = now
        try:
            discovery, _ = await self._get(f"{self._base}/.well-known/openid-configuration", "discovery")
            if discovery.get("issuer") != self._issuer:
                raise _unavailable(Cause.DISCOVERY_ISSUER)
            jwks, max_age = await self._get(self._jwks_url(discovery.get("jwks_uri")), "jwks")
            keys = parse_jwks(jwks)
        except GovernedMemoryError as error:
            self._failure = error.cause or Cause.UNKNOWN
            logger.warning("workload identity: the cluster's keys cannot be had (%s)", self._failure)
            raise
        kept = min(max(max_age or 0, KEPT_SECONDS[0]), KEPT_SECONDS[1])
        self._keys, self._fresh_until = keys, now + timedelta(seconds=kept)
        logger.info("workload identity: %d keys of the cluster, kept %d s", len(keys), kept)

    def _jwks_url(self, uri: object) -> str:
        """``jwks_uri`` when it is on the API server, else the API server's own ``/openid/v1/jwks`` (served whatever
        ``--service-account-jwks-uri`` says): the service's token is sent nowhere else."""
        parts = urlsplit(uri if isinstance(uri, str) else "")
        if f"{parts.scheme}://{parts.netloc}" == self._origin and parts.path[:1] == "/" and not parts.query:
            return f"{self._origin}{parts.path}"
        return f"{self._base}/openid/v1/jwks"

    async def _get(self, url: str, what: str) -> tuple[dict[str, object], int | None]:
        """One JSON object from the API server and its ``max-age``, or ``IDENTITY_UNAVAILABLE`` ``<what>_<cause>``."""
        headers = {"accept": "application/json"}
        if self._token_file is not None:
            try:  # read for each fetch: the kubelet renews the file
                own = (await asyncio.to_thread(self._token_file.read_text)).strip()
            except (OSError, UnicodeDecodeError):
                raise _unavailable(Cause.OWN_TOKEN_UNREADABLE) from None
            headers["authorization"] = f"Bearer {own}"
        body = bytearray()
        try:
            async with self._http.stream("GET", url, headers=headers) as answer:
                if answer.status_code != 200:
                    raise _unavailable(http_cause(f"{what}_http_", answer.status_code))
                async for chunk in answer.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_DOCUMENT_BYTES:
                        raise _unavailable(Cause(f"{what}_too_large"))
                match = _MAX_AGE.search(answer.headers.get("cache-control", ""))
        except httpx.HTTPError as error:  # its text is read for one category, never passed on
            cause = Cause.TIMEOUT if isinstance(error, httpx.TimeoutException) else Cause.UNREACHABLE
            untrusted = "CERTIFICATE_VERIFY_FAILED" in str(error)
            raise _unavailable(Cause(f"{what}_{Cause.TLS_UNTRUSTED_CERTIFICATE if untrusted else cause}")) from None
        try:
            return _json(bytes(body)), int(match.group(1)) if match else None
        except ValueError:
            raise _unavailable(Cause(f"{what}_malformed")) from None

    async def aclose(self) -> None:
        await self._http.aclose()
