"""The data plane over TLS (#35): the runtime verifies the service's certificate and name against the CA file it is
given (libpq's ``verify-full``); a certificate of another CA or for another name is ``service_unavailable``."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from certificates import certificate
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from support import facts, refusal
from test_data_plane import bearer_file, plane, presenting, scope_key, serving, token_for

from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.service import server
from kagent_memory_governed.service.remote import RemoteStore
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import Bridge, embed


def authority(common: str = "governed memory test CA") -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    return key, certificate(common, key, common, key, ca=True)


def serving_certificate(
    ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate], *names: x509.GeneralName
) -> server.ServerTLS:
    ca_key, ca_certificate = ca
    key = ec.generate_private_key(ec.SECP256R1())
    issuer = ca_certificate.subject.rfc4514_string().removeprefix("CN=")
    signed = certificate("governed-memory", key, issuer, ca_key, ca=False, names=names, server=True)
    pem = serialization.Encoding.PEM
    private = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return server.ServerTLS(signed.public_bytes(pem), private)


def ca_file(tmp_path: Path, ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate], name: str = "ca.pem") -> Path:
    path = tmp_path / name
    path.write_bytes(ca[1].public_bytes(serialization.Encoding.PEM))
    return path


LOOPBACK = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))


async def test_every_call_round_trips_over_tls_verified_against_the_ca(
    store: Store, bridge: Bridge, tmp_path: Path
) -> None:
    ca = authority()
    key = scope_key()
    generation = (await store.grant(key, purpose="assist", policy_version="v1")).generation
    async with serving(plane(store, bridge), tls=serving_certificate(ca, LOOPBACK)) as port:
        client = RemoteStore.connect(
            f"https://127.0.0.1:{port}", token_file=bearer_file(tmp_path), ca_file=ca_file(tmp_path, ca)
        )
        assert await client.refresh_policy() == store.policy
        with presenting(token_for(bridge, key, generation)):
            await client.admit(key, generation, "save", units=1, explicit=True)
            [entry] = await client.write(key, generation, facts("likes green tea"))
        with presenting(token_for(bridge, key, generation + 1)):  # signed, but for a generation not granted
            assert await refusal(client.write(key, generation + 1, facts("stale"))) is Reason.CONSENT_STALE
        with presenting(token_for(bridge, key, generation)):
            await client.admit(key, generation, "load", units=1, explicit=True)
            assert [hit.entry_id for hit in await client.search(key, generation, embed("likes green tea"))] == [entry]
            assert await client.record_turn(key, generation, "s", "i", recalled=False) == 1
        await client.close()


@pytest.mark.parametrize("mismatch", ["another_ca", "another_name"])
async def test_a_certificate_the_ca_file_does_not_vouch_for_is_service_unavailable(
    store: Store, bridge: Bridge, tmp_path: Path, mismatch: str
) -> None:
    ca = authority()
    names = [x509.DNSName("memory.example")] if mismatch == "another_name" else [LOOPBACK]
    trusted = ca_file(tmp_path, authority("another CA") if mismatch == "another_ca" else ca, "trusted.pem")
    key = scope_key()
    async with serving(plane(store, bridge), tls=serving_certificate(ca, *names)) as port:
        client = RemoteStore.connect(f"https://127.0.0.1:{port}", token_file=bearer_file(tmp_path), ca_file=trusted)
        with presenting(token_for(bridge, key, 1)), pytest.raises(GovernedMemoryError) as failed:
            await client.admit(key, 1, "load", units=1)
        await client.close()
    assert (failed.value.reason, failed.value.cause) == (Reason.SERVICE_UNAVAILABLE, "unavailable")
