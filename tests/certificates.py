"""X.509 certificates the tests make: a CA, and certificates it signs, valid by the real clock (OpenSSL checks
against it, not freezegun's)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def certificate(
    subject: str,
    key: Any,
    issuer: str,
    issuer_key: Any,
    *,
    ca: bool,
    names: Sequence[x509.GeneralName] = (),
    server: bool = False,
) -> x509.Certificate:
    """``subject``'s certificate for ``key``'s public key, signed by ``issuer_key`` as ``issuer`` (itself for a
    self-signed CA): a CA may sign certificates; ``names`` its subject alternative names; ``server`` for server
    authentication only."""
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name(subject))
        .issuer_name(name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        signing = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
        builder = builder.add_extension(signing, critical=True)
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
    if server:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())
