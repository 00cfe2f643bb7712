"""A Kubernetes API server's service-account tokens and issuer discovery, as the tests need them: keys and tokens
signed exactly as the kube-apiserver shapes projected service-account tokens, and a real HTTPS server on loopback
serving the discovery document and the JWKS (tests/core/test_workload_identity.py says what is mimicked, and where
from)."""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import json
import ssl
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from certificates import certificate
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from support import free_port

T0 = datetime.datetime(2026, 11, 2, 9, 0, tzinfo=datetime.UTC)
ISSUER = "https://kubernetes.default.svc.cluster.local"
AUDIENCE = "governed-memory"
DROP = object()


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _integer(value: int, size: int | None = None) -> str:
    return b64(value.to_bytes(size or (value.bit_length() + 7) // 8))


@dataclass(frozen=True)
class Key:
    private: Any
    alg: str

    @property
    def kid(self) -> str:
        der = self.private.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return b64(hashlib.sha256(der).digest())

    def jwk(self) -> dict[str, str]:
        numbers = self.private.public_key().public_numbers()
        if self.alg == "RS256":
            return {"use": "sig", "kty": "RSA", "kid": self.kid, "alg": "RS256", "n": _integer(numbers.n), "e": "AQAB"}
        x, y = _integer(numbers.x, 32), _integer(numbers.y, 32)
        return {"use": "sig", "kty": "EC", "kid": self.kid, "crv": "P-256", "alg": "ES256", "x": x, "y": y}

    def sign(self, message: bytes) -> bytes:
        if self.alg == "RS256":
            signature: bytes = self.private.sign(message, padding.PKCS1v15(), hashes.SHA256())
            return signature
        r, s = decode_dss_signature(self.private.sign(message, ec.ECDSA(hashes.SHA256())))
        return r.to_bytes(32) + s.to_bytes(32)


def rsa_key() -> Key:
    return Key(rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256")


def ec_key() -> Key:
    return Key(ec.generate_private_key(ec.SECP256R1()), "ES256")


def claims(
    namespace: str = "agents", account: str = "alpha", *, issued: datetime.datetime = T0, **changes: Any
) -> dict[str, Any]:
    """A projected token's claims for a pod of ``namespace/account``, ``expirationSeconds: 600``."""
    now = int(issued.timestamp())
    body: dict[str, Any] = {
        "aud": [AUDIENCE],
        "exp": now + 600,
        "iat": now,
        "iss": ISSUER,
        "jti": str(uuid.uuid4()),
        "kubernetes.io": {
            "namespace": namespace,
            "node": {"name": "node-1", "uid": str(uuid.uuid4())},
            "pod": {"name": f"{account}-6d4cf56db6-x2x9q", "uid": str(uuid.uuid4())},
            "serviceaccount": {"name": account, "uid": str(uuid.uuid4())},
        },
        "nbf": now,
        "sub": f"system:serviceaccount:{namespace}:{account}",
    }
    for name, value in changes.items():
        body.pop(name) if value is DROP else body.__setitem__(name.replace("__", "."), value)
    return body


def token(key: Key, body: dict[str, Any] | None = None, **header: Any) -> str:
    head = b64(json.dumps({"alg": key.alg, "kid": key.kid, **header}, separators=(",", ":")).encode())
    payload = b64(json.dumps(claims() if body is None else body, separators=(",", ":")).encode())
    return f"{head}.{payload}.{b64(key.sign(f'{head}.{payload}'.encode()))}"


def bearer(value: str) -> list[tuple[str, str]]:
    return [("x-memory-scope", "irrelevant"), ("authorization", f"Bearer {value}")]


# -- the API server's issuer discovery, over TLS on loopback ----------------------------------------------------


def _certificate(subject: str, key: Any, issuer_key: Any, issuer: str, *, ca: bool) -> x509.Certificate:
    loopback = [x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))]
    return certificate(subject, key, issuer, issuer_key, ca=ca, names=() if ca else loopback)


@dataclass
class Cluster:
    url: str
    ca: Path
    wrong_ca: Path
    keys: list[Key] = field(default_factory=list)
    cache_control: str = "public, max-age=3600"
    status: int = 200
    issuer: str = ISSUER
    jwks_uri: str = "https://203.0.113.10:6443/openid/v1/jwks"  # the external address, as the API server says
    jwks_body: bytes | None = None
    seen: list[tuple[str, str | None]] = field(default_factory=list)

    def fetches(self, path: str = "/openid/v1/jwks") -> int:
        return sum(1 for seen, _ in self.seen if seen == path)


@contextmanager
def serving(directory: Path) -> Iterator[Cluster]:
    """The API server's issuer discovery and JWKS over TLS on loopback, certificates under ``directory``."""
    ca_key, wrong_key, server_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = _certificate("cluster CA", ca_key, ca_key, "cluster CA", ca=True)
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    wrong = _certificate("another CA", wrong_key, wrong_key, "another CA", ca=True)
    (directory / "wrong-ca.pem").write_bytes(wrong.public_bytes(serialization.Encoding.PEM))
    server = _certificate("kube-apiserver", server_key, ca_key, "cluster CA", ca=False)
    (directory / "server.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    pkcs8 = serialization.PrivateFormat.PKCS8
    plain = serialization.NoEncryption()
    (directory / "server.key").write_bytes(server_key.private_bytes(serialization.Encoding.PEM, pkcs8, plain))
    port = free_port()
    state = Cluster(f"https://127.0.0.1:{port}", directory / "ca.pem", directory / "wrong-ca.pem")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            state.seen.append((self.path, self.headers.get("Authorization")))
            if self.path == "/.well-known/openid-configuration":
                algs = sorted({key.alg for key in state.keys})
                document = {
                    "issuer": state.issuer,
                    "jwks_uri": state.jwks_uri,
                    "response_types_supported": ["id_token"],
                }
                body = json.dumps(
                    {**document, "subject_types_supported": ["public"], "id_token_signing_alg_values_supported": algs}
                )
                self._answer(body.encode(), "application/json")
            elif self.path in ("/openid/v1/jwks", "/keys/elsewhere"):
                jwks = json.dumps({"keys": [key.jwk() for key in state.keys]}).encode()
                self._answer(state.jwks_body if state.jwks_body is not None else jwks, "application/jwk-set+json")
            else:
                self.send_error(404)

        def _answer(self, body: bytes, content_type: str) -> None:
            if state.status != 200:
                self.send_error(state.status)
                return
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Cache-Control", state.cache_control)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(directory / "server.pem", directory / "server.key")
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()
