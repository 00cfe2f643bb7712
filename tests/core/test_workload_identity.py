"""The workload identity of a data-plane call (``service/identity.py``), against tokens signed here exactly as the
kube-apiserver shapes projected service-account tokens, and a real HTTPS server on loopback serving issuer discovery.

What is mimicked, from Kubernetes' source and docs:

- claims (``Claims`` in https://github.com/kubernetes/kubernetes/blob/master/pkg/serviceaccount/claims.go, and the
  decoded token in https://kubernetes.io/docs/reference/access-authn-authz/service-accounts-admin/#bound-service-account-tokens):
  ``aud`` a list (the projection's one audience), ``exp``, ``iat``, ``nbf`` (= ``iat``), ``iss``, ``jti`` (a UUID),
  ``kubernetes.io`` {``namespace``, ``node`` {name, uid}, ``pod`` {name, uid}, ``serviceaccount`` {name, uid}},
  ``sub`` ``system:serviceaccount:<namespace>:<name>``; ``kubectl create token`` leaves out ``pod``, a token bound
  to a Secret carries ``secret`` instead, and a legacy Secret token (``LegacyClaims``, pkg/serviceaccount/legacy.go)
  has ``iss: kubernetes/serviceaccount`` and flat ``kubernetes.io/serviceaccount/...`` claims, no ``exp``;
- header ``{"alg": "RS256" | "ES256", "kid": <base64url SHA-256 of the key's DER SubjectPublicKeyInfo>}``
  (``keyIDFromPublicKey``, pkg/serviceaccount/jwt.go), ES256 signatures as JWS r || s;
- discovery and JWKS as ``openIDConfigJSON`` and ``publicJWKSFromKeys`` render them (pkg/serviceaccount/
  openidmetadata.go: ``use: sig``, ``alg``, ``kid``), served with ``Cache-Control: public, max-age=3600``
  (pkg/routes/openidmetadata.go); the JWKS's ``jwks_uri`` names the API server's external address.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cluster import AUDIENCE, DROP, ISSUER, T0, Cluster, Key, b64, bearer, claims, ec_key, rsa_key, serving, token
from cryptography.hazmat.primitives import hashes, hmac, serialization
from freezegun import freeze_time
from support import free_port

from kagent_memory_governed.errors import ConfigurationError, GovernedMemoryError, Reason
from kagent_memory_governed.scope import AgentId
from kagent_memory_governed.service import identity
from kagent_memory_governed.service.identity import WorkloadIdentity

OWN_TOKEN = "SENTINEL-own-service-account-token"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with serving(tmp_path_factory.mktemp("cluster")) as state:
        yield state


@dataclass(frozen=True)
class Keys:
    rsa: Key
    ec: Key
    other_rsa: Key


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys(rsa_key(), ec_key(), rsa_key())


@pytest.fixture
def api(cluster: Cluster, keys: Keys) -> Cluster:
    cluster.keys, cluster.seen = [keys.rsa, keys.ec], []
    cluster.cache_control, cluster.status, cluster.issuer, cluster.jwks_body = "public, max-age=3600", 200, ISSUER, None
    cluster.jwks_uri = "https://203.0.113.10:6443/openid/v1/jwks"
    return cluster


@pytest.fixture
def own_token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(OWN_TOKEN + "\n")
    return path


@pytest.fixture
def frozen() -> Iterator[Any]:
    with freeze_time(T0, real_asyncio=True) as clock:
        yield clock


@pytest.fixture
async def verifier(api: Cluster, own_token: Path, frozen: Any) -> AsyncIterator[WorkloadIdentity]:
    verifier = WorkloadIdentity(
        issuer=ISSUER, audience=AUDIENCE, api_server=api.url, ca_file=api.ca, token_file=own_token
    )
    yield verifier
    await verifier.aclose()


async def refused(verifier: WorkloadIdentity, metadata: Any, reason: Reason = Reason.BAD_IDENTITY) -> str:
    """The cause of the refusal, after checking that the refusal carries nothing of the metadata."""
    with pytest.raises(GovernedMemoryError) as caught:
        await verifier.agent(metadata)
    error = caught.value
    assert error.reason is reason and str(error) == reason.value and error.__cause__ is None
    texts = (str(error), repr(error), error.explained(), *map(str, error.args))
    for _, value in metadata or ():
        text = value.decode() if isinstance(value, bytes) else value
        for part in text.removeprefix("Bearer ").split("."):
            assert len(part) < 8 or not any(part in text for text in texts)
    assert error.cause is not None
    if reason is Reason.BAD_IDENTITY:
        assert error.cause in identity.CAUSES
    return error.cause


# -- accepted --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["rsa", "ec"])
async def test_a_projected_token_names_the_agent_of_its_service_account(
    verifier: WorkloadIdentity, api: Cluster, keys: Keys, kind: str
) -> None:
    key = getattr(keys, kind)
    assert await verifier.agent(bearer(token(key))) == AgentId("agents", "alpha")
    # discovery, then the JWKS from the API server itself (jwks_uri names another address), with the own token
    assert api.seen == [
        ("/.well-known/openid-configuration", f"Bearer {OWN_TOKEN}"),
        ("/openid/v1/jwks", f"Bearer {OWN_TOKEN}"),
    ]


async def test_a_jwks_uri_on_the_api_server_is_followed(verifier: WorkloadIdentity, api: Cluster, keys: Keys) -> None:
    api.jwks_uri = f"{api.url}/keys/elsewhere"
    assert await verifier.agent(bearer(token(keys.rsa))) == AgentId("agents", "alpha")
    assert [path for path, _ in api.seen] == ["/.well-known/openid-configuration", "/keys/elsewhere"]


async def test_grpc_metadata_as_a_mapping_or_pairs_is_read_alike(verifier: WorkloadIdentity, keys: Keys) -> None:
    value = token(keys.ec)
    assert await verifier.agent({"authorization": f"Bearer {value}"}) == AgentId("agents", "alpha")
    assert await verifier.agent((("Authorization", f"bearer {value}"),)) == AgentId("agents", "alpha")


async def test_the_table_maps_a_service_account_to_its_agent(
    api: Cluster, own_token: Path, keys: Keys, frozen: Any
) -> None:
    table = {"agents/memory-sa": "agents/alpha", "agents/beta": "agents/beta"}
    verifier = WorkloadIdentity(
        issuer=ISSUER, audience=AUDIENCE, api_server=api.url, ca_file=api.ca, token_file=own_token, agents=table
    )
    assert await verifier.agent(bearer(token(keys.rsa, claims(account="memory-sa")))) == AgentId("agents", "alpha")
    assert await verifier.agent(bearer(token(keys.rsa, claims(account="beta")))) == AgentId("agents", "beta")
    assert await refused(verifier, bearer(token(keys.rsa, claims(account="alpha")))) == "unknown_agent"
    await verifier.aclose()


async def test_a_token_of_agent_a_never_acts_as_agent_b(api: Cluster, own_token: Path, keys: Keys, frozen: Any) -> None:
    table = [("agents/alpha", "agents/alpha"), ("agents/beta", "agents/beta")]
    verifier = WorkloadIdentity(
        issuer=ISSUER, audience=AUDIENCE, api_server=api.url, ca_file=api.ca, token_file=own_token, agents=table
    )
    alpha = claims(account="alpha")
    assert await verifier.agent(bearer(token(keys.rsa, alpha))) == AgentId("agents", "alpha")
    # A's pod claiming B's name in sub, or B's service account in kubernetes.io, breaks the signature or the match
    assert await refused(verifier, bearer(token(keys.rsa, {**alpha, "sub": "system:serviceaccount:agents:beta"}))) == (
        "subject"
    )
    head, payload, signature = token(keys.rsa, alpha).split(".")
    forged = b64(json.dumps({**alpha, "sub": "system:serviceaccount:agents:beta"}).encode())
    assert await refused(verifier, bearer(f"{head}.{forged}.{signature}")) == "signature"
    # a token meant for agent B as its audience (or for B and the service both) is no token of the service's
    for audience in (["agents/beta"], [AUDIENCE, "agents/beta"]):
        assert await refused(verifier, bearer(token(keys.rsa, claims(account="alpha", aud=audience)))) == "audience"
    await verifier.aclose()


async def test_within_the_leeway_a_token_is_still_accepted(verifier: WorkloadIdentity, keys: Keys, frozen: Any) -> None:
    early = token(keys.rsa, claims(issued=T0 + datetime.timedelta(seconds=20)))
    assert await verifier.agent(bearer(early)) == AgentId("agents", "alpha")
    old = claims(issued=T0 - datetime.timedelta(seconds=620))  # expired 20 s ago
    assert await verifier.agent(bearer(token(keys.ec, old))) == AgentId("agents", "alpha")
    frozen.tick(10)
    assert await refused(verifier, bearer(token(keys.ec, old))) == "expired"  # cached until exp + leeway only


# -- refused ---------------------------------------------------------------------------------------------------


def _hs256(keys: Keys) -> str:
    """The classic confusion: HMAC keyed with the RSA public key's PEM, as a verifier trusting ``alg`` would."""
    secret = keys.rsa.private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    head = b64(json.dumps({"alg": "HS256", "kid": keys.rsa.kid}).encode())
    payload = b64(json.dumps(claims()).encode())
    mac = hmac.HMAC(secret, hashes.SHA256())
    mac.update(f"{head}.{payload}".encode())
    return f"{head}.{payload}.{b64(mac.finalize())}"


def _unsigned(header: dict[str, Any], body: dict[str, Any]) -> str:
    return f"{b64(json.dumps(header).encode())}.{b64(json.dumps(body).encode())}."


LEGACY = {  # LegacyClaims: what a ServiceAccount token Secret held before 1.24
    "iss": "kubernetes/serviceaccount",
    "kubernetes.io/serviceaccount/namespace": "agents",
    "kubernetes.io/serviceaccount/secret.name": "alpha-token-x2x9q",
    "kubernetes.io/serviceaccount/service-account.name": "alpha",
    "kubernetes.io/serviceaccount/service-account.uid": "0b0c2c4e-8f7b-4b5e-9a53-2b0b7a9d1d11",
    "sub": "system:serviceaccount:agents:alpha",
}
UNBOUND = claims()["kubernetes.io"] | {"pod": DROP}


def _kube(**changes: Any) -> dict[str, Any]:
    body = claims()
    body["kubernetes.io"] = {k: v for k, v in {**body["kubernetes.io"], **changes}.items() if v is not DROP}
    return body


REFUSALS: dict[str, Any] = {
    "no metadata": (lambda k: None, "missing"),
    "no authorization": (lambda k: [("x-memory-scope", "x")], "missing"),
    "not bearer": (lambda k: [("authorization", f"Basic {token(k.rsa)}")], "malformed"),
    "bearer of nothing": (lambda k: [("authorization", "Bearer ")], "malformed"),
    "two authorizations": (lambda k: bearer(token(k.rsa)) + bearer(token(k.rsa)), "malformed"),
    "binary value": (lambda k: [("authorization", token(k.rsa).encode())], "malformed"),
    "not three parts": (lambda k: bearer(token(k.rsa) + ".x"), "malformed"),
    "padded base64": (lambda k: bearer(token(k.rsa).replace(".", "=.", 1)), "malformed"),
    "too long": (lambda k: bearer(token(k.rsa, claims(pad="x" * 9000))), "malformed"),
    "jku in the header": (lambda k: bearer(token(k.rsa, jku="https://attacker.example/jwks")), "malformed"),
    "no kid": (lambda k: bearer(_unsigned({"alg": "RS256"}, claims())), "malformed"),
    "claims twice": (lambda k: bearer(_duplicate(k)), "malformed"),
    "claims not json": (lambda k: bearer(_signed(k.rsa, b"not json")), "malformed"),
    "exp not a number": (lambda k: bearer(token(k.rsa, claims(exp="never"))), "malformed"),
    "alg none": (lambda k: bearer(_unsigned({"alg": "none", "kid": k.rsa.kid}, claims())), "algorithm"),
    "hs256 with the public key": (lambda k: bearer(_hs256(k)), "algorithm"),
    "es384": (lambda k: bearer(_unsigned({"alg": "ES384", "kid": k.ec.kid}, claims()) + "AAAA"), "algorithm"),
    "a kid not in the jwks": (lambda k: bearer(token(k.other_rsa)), "unknown_key"),
    "es256 naming an rsa key": (lambda k: bearer(token(k.ec, kid=k.rsa.kid)), "key_mismatch"),
    "rs256 naming an ec key": (lambda k: bearer(token(k.rsa, kid=k.ec.kid)), "key_mismatch"),
    "another key under a known kid": (lambda k: bearer(token(k.other_rsa, kid=k.rsa.kid)), "signature"),
    "tampered claims": (lambda k: bearer(_tampered(k.ec)), "signature"),
    "another issuer": (lambda k: bearer(token(k.rsa, claims(iss="https://other.cluster"))), "issuer"),
    "legacy secret token": (lambda k: bearer(token(k.rsa, LEGACY)), "issuer"),
    "kagent's own token": (lambda k: bearer(token(k.rsa, claims(aud=["kagent"]))), "audience"),
    "the api server's audience": (lambda k: bearer(token(k.rsa, claims(aud=[ISSUER]))), "audience"),
    "two audiences": (lambda k: bearer(token(k.rsa, claims(aud=[AUDIENCE, "kagent"]))), "audience"),
    "an audience prefix": (lambda k: bearer(token(k.rsa, claims(aud=[AUDIENCE + "-x"]))), "audience"),
    "no audience": (lambda k: bearer(token(k.rsa, claims(aud=DROP))), "audience"),
    "legacy claims, our iss and aud": (
        lambda k: bearer(token(k.rsa, {**LEGACY, **_now(), "iss": ISSUER})),
        "not_a_pod",
    ),
    "kubectl create token": (lambda k: bearer(token(k.rsa, _kube(pod=DROP))), "not_a_pod"),
    "bound to a secret": (
        lambda k: bearer(token(k.rsa, _kube(pod=DROP, secret={"name": "s", "uid": "u"}))),
        "not_a_pod",
    ),
    "a pod without uid": (lambda k: bearer(token(k.rsa, _kube(pod={"name": "alpha-1"}))), "not_a_pod"),
    "expired": (lambda k: bearer(token(k.rsa, claims(issued=T0 - datetime.timedelta(seconds=631)))), "expired"),
    "issued later": (
        lambda k: bearer(token(k.rsa, claims(issued=T0 + datetime.timedelta(seconds=31)))),
        "not_yet_valid",
    ),
    "nbf later": (lambda k: bearer(token(k.rsa, claims(nbf=int(T0.timestamp()) + 60))), "not_yet_valid"),
    "an hour's token": (lambda k: bearer(token(k.rsa, claims(exp=int(T0.timestamp()) + 3600))), "lifetime"),
    "sub of another account": (
        lambda k: bearer(token(k.rsa, claims(sub="system:serviceaccount:agents:beta"))),
        "subject",
    ),
    "sub of another namespace": (lambda k: bearer(token(k.rsa, _kube(namespace="other"))), "subject"),
    "a user's sub": (lambda k: bearer(token(k.rsa, claims(sub="alice"))), "subject"),
    "no service account name": (lambda k: bearer(token(k.rsa, _kube(serviceaccount={"uid": "u"}))), "subject"),
    "not an agent's name": (lambda k: bearer(token(k.rsa, claims("Agents"))), "unknown_agent"),
}


def _now() -> dict[str, object]:
    now = int(T0.timestamp())
    return {"aud": [AUDIENCE], "iat": now, "nbf": now, "exp": now + 600}


def _signed(key: Key, payload: bytes) -> str:
    head, body = b64(json.dumps({"alg": key.alg, "kid": key.kid}).encode()), b64(payload)
    return f"{head}.{body}.{b64(key.sign(f'{head}.{body}'.encode()))}"


def _duplicate(keys: Keys) -> str:
    text = json.dumps(claims())
    return _signed(keys.rsa, text.replace('"iss":', f'"iss": "{ISSUER}", "iss":', 1).encode())


def _tampered(key: Key) -> str:
    head, _, signature = token(key).split(".")
    return f"{head}.{b64(json.dumps(claims(account='beta')).encode())}.{signature}"


@pytest.mark.parametrize("case", sorted(REFUSALS))
async def test_a_token_the_service_does_not_accept_is_refused_with_its_cause(
    verifier: WorkloadIdentity, keys: Keys, case: str
) -> None:
    make, cause = REFUSALS[case]
    assert await refused(verifier, make(keys)) == cause


def test_every_cause_is_proved_by_a_refusal() -> None:
    assert {cause for _, cause in REFUSALS.values()} == identity.CAUSES


# -- configuration ---------------------------------------------------------------------------------------------


def _configured(api: Cluster, own_token: Path, **changes: Any) -> WorkloadIdentity:
    settings: dict[str, Any] = {
        "issuer": ISSUER,
        "audience": AUDIENCE,
        "api_server": api.url,
        "ca_file": api.ca,
        "token_file": own_token,
    }
    return WorkloadIdentity(**(settings | changes))


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"agents/shared": "agents/alpha"}, None),
        ([("agents/shared", "agents/alpha"), ("agents/shared", "agents/beta")], "two agents share"),
        ([("agents/shared", "agents/alpha"), ("agents/shared", "agents/alpha")], None),  # the same entry twice
        ({"agents/alpha": "other/alpha"}, "another namespace"),
        ({"agents/alpha": "alpha"}, "<namespace>/<agent>"),
        ({"agents:alpha": "agents/alpha"}, "<namespace>/<agent>"),
    ],
)
def test_a_service_account_two_agents_share_is_a_configuration_error(
    api: Cluster, own_token: Path, table: Any, says: str | None
) -> None:
    if says is None:
        _configured(api, own_token, agents=table)
        return
    with pytest.raises(ConfigurationError) as caught:
        _configured(api, own_token, agents=table)
    assert says in str(caught.value) and "KAGENT_GOVERNED_MEMORY_IDENTITY_AGENTS" in str(caught.value)
    assert "agents/" not in str(caught.value) and "alpha" not in str(caught.value)  # the setting, never an entry
    if says == "two agents share":
        assert caught.value.code == "shared_service_account"


@pytest.mark.parametrize(
    "changes",
    [
        {"issuer": ""},
        {"audience": ""},
        {"api_server": "http://127.0.0.1:6443"},
        {"api_server": "https://user:pass@127.0.0.1:6443"},
        {"ca_file": Path("/nonexistent/ca.crt")},
    ],
)
def test_settings_it_cannot_use_are_refused_at_construction(
    api: Cluster, own_token: Path, changes: dict[str, Any]
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        _configured(api, own_token, **changes)
    assert "KAGENT_GOVERNED_MEMORY_IDENTITY_" in str(caught.value) and "pass" not in str(caught.value)


# -- the cluster's keys ----------------------------------------------------------------------------------------


async def test_keys_that_cannot_be_had_are_identity_unavailable(
    api: Cluster, own_token: Path, keys: Keys, frozen: Any, tmp_path: Path
) -> None:
    value = bearer(token(keys.rsa))
    cases: list[tuple[dict[str, Any], dict[str, Any], str]] = [
        ({"status": 503}, {}, "discovery_http_503"),
        ({"status": 403}, {}, "discovery_http_403"),
        ({"issuer": "https://another.issuer"}, {}, "discovery_issuer"),
        ({"jwks_body": b"<html>not json</html>"}, {}, "jwks_malformed"),
        ({"jwks_body": b'{"keys": {}}'}, {}, "jwks_malformed"),
        ({"jwks_body": json.dumps({"keys": [keys.rsa.jwk(), keys.rsa.jwk()]}).encode()}, {}, "jwks_malformed"),
        ({"jwks_body": b" " * (identity.MAX_DOCUMENT_BYTES + 1)}, {}, "jwks_too_large"),
        ({}, {"ca_file": api.wrong_ca}, "discovery_tls_untrusted_certificate"),
        ({}, {"api_server": f"https://127.0.0.1:{free_port()}"}, "discovery_unreachable"),
        ({}, {"token_file": tmp_path / "absent"}, "own_token_unreadable"),
    ]
    for state, settings, cause in cases:
        for name, setting in state.items():
            setattr(api, name, setting)
        verifier = _configured(api, own_token, **settings)
        assert await refused(verifier, value, Reason.IDENTITY_UNAVAILABLE) == cause, cause
        await verifier.aclose()
        api.status, api.issuer, api.jwks_body = 200, ISSUER, None


async def test_a_failed_fetch_is_retried_after_a_few_seconds_not_on_every_call(
    verifier: WorkloadIdentity, api: Cluster, keys: Keys, frozen: Any
) -> None:
    api.status = 503
    value = bearer(token(keys.rsa))
    for _ in range(5):
        assert await refused(verifier, value, Reason.IDENTITY_UNAVAILABLE) == "discovery_http_503"
    assert api.fetches("/.well-known/openid-configuration") == 1
    api.status = 200
    frozen.tick(identity.RETRY_SECONDS)
    assert await verifier.agent(value) == AgentId("agents", "alpha")
    assert api.fetches("/.well-known/openid-configuration") == 2


async def test_a_new_kid_served_later_is_picked_up_at_most_once_a_minute(
    verifier: WorkloadIdentity, api: Cluster, keys: Keys, frozen: Any
) -> None:
    assert await verifier.agent(bearer(token(keys.rsa))) == AgentId("agents", "alpha")
    api.keys = [keys.rsa, keys.ec, keys.other_rsa]  # the API server rotates in a new key
    for second in range(0, 60, 6):
        frozen.move_to(T0 + datetime.timedelta(seconds=second))
        rotated = token(keys.other_rsa, claims(issued=T0 + datetime.timedelta(seconds=second)))
        assert await refused(verifier, bearer(rotated)) == "unknown_key"
        unknown = token(rsa_key() if second == 0 else keys.other_rsa, kid=f"unknown-{second}")
        assert await refused(verifier, bearer(unknown)) == "unknown_key"
    assert api.fetches() == 1  # twenty tokens of unknown kids in a minute, no fetch
    frozen.move_to(T0 + datetime.timedelta(seconds=identity.REFETCH_SECONDS))
    rotated = token(keys.other_rsa, claims(issued=T0 + datetime.timedelta(seconds=60)))
    assert await verifier.agent(bearer(rotated)) == AgentId("agents", "alpha")
    assert api.fetches() == 2
    assert await refused(verifier, bearer(token(keys.other_rsa, kid="still-unknown"))) == "unknown_key"
    assert api.fetches() == 2


@pytest.mark.parametrize(
    ("cache_control", "kept"),
    [("public, max-age=3600", 3600), ("public, max-age=120", 120), ("max-age=86400", 3600), ("no-cache", 60), ("", 60)],
)
async def test_the_keys_are_kept_for_their_max_age_within_bounds(
    verifier: WorkloadIdentity, api: Cluster, keys: Keys, frozen: Any, cache_control: str, kept: int
) -> None:
    api.cache_control = cache_control
    assert await verifier.agent(bearer(token(keys.rsa))) == AgentId("agents", "alpha")
    api.keys = [keys.ec]  # the RSA key retired
    frozen.move_to(T0 + datetime.timedelta(seconds=kept - 1))
    later = T0 + datetime.timedelta(seconds=kept - 1)
    assert await verifier.agent(bearer(token(keys.rsa, claims(issued=later)))) == AgentId("agents", "alpha")
    assert api.fetches() == 1
    frozen.move_to(T0 + datetime.timedelta(seconds=kept))
    later = T0 + datetime.timedelta(seconds=kept)
    assert await refused(verifier, bearer(token(keys.rsa, claims(issued=later)))) == "unknown_key"
    assert await verifier.agent(bearer(token(keys.ec, claims(issued=later)))) == AgentId("agents", "alpha")
    assert api.fetches() == 2


async def test_concurrent_calls_share_one_fetch(verifier: WorkloadIdentity, api: Cluster, keys: Keys) -> None:
    tokens = [bearer(token(keys.rsa if n % 2 else keys.ec)) for n in range(20)]
    agents = await asyncio.gather(*(verifier.agent(value) for value in tokens))
    assert set(agents) == {AgentId("agents", "alpha")}
    assert api.fetches("/.well-known/openid-configuration") == 1 and api.fetches() == 1


# -- the verified tokens ---------------------------------------------------------------------------------------


async def test_a_verified_token_is_remembered_until_its_exp_and_no_longer(
    verifier: WorkloadIdentity, api: Cluster, keys: Keys, frozen: Any
) -> None:
    api.cache_control = "public, max-age=120"
    value = bearer(token(keys.rsa))
    assert await verifier.agent(value) == AgentId("agents", "alpha")
    api.status = 503  # the API server down and the keys stale: a remembered token needs neither
    frozen.move_to(T0 + datetime.timedelta(seconds=600 + identity.LEEWAY_SECONDS - 1))
    assert await verifier.agent(value) == AgentId("agents", "alpha")
    other = token(keys.rsa, claims(issued=T0 + datetime.timedelta(seconds=600)))
    assert await refused(verifier, bearer(other), Reason.IDENTITY_UNAVAILABLE) == "discovery_http_503"
    api.status = 200
    frozen.move_to(T0 + datetime.timedelta(seconds=600 + identity.LEEWAY_SECONDS + identity.RETRY_SECONDS))
    assert await refused(verifier, value) == "expired"  # forgotten, and verified again


async def test_the_remembered_tokens_are_bounded(
    verifier: WorkloadIdentity, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(identity, "CACHED_TOKENS", 3)
    values = [bearer(token(keys.ec)) for _ in range(5)]
    for value in values:
        assert await verifier.agent(value) == AgentId("agents", "alpha")
    assert len(verifier._verified) == 3  # the two oldest forgotten
    for value in values:  # and verified again when they come back
        assert await verifier.agent(value) == AgentId("agents", "alpha")


# -- nothing of a token in the logs ----------------------------------------------------------------------------


async def test_no_token_or_claim_reaches_a_log_line(
    api: Cluster, own_token: Path, keys: Keys, frozen: Any, caplog: pytest.LogCaptureFixture
) -> None:
    body = claims()
    secrets = [OWN_TOKEN, body["jti"], body["kubernetes.io"]["pod"]["name"], body["kubernetes.io"]["pod"]["uid"]]
    value = token(keys.rsa, body)
    secrets += value.split(".")
    with caplog.at_level(logging.DEBUG):
        api.status = 503
        frozen.move_to(T0 - datetime.timedelta(seconds=identity.RETRY_SECONDS))
        verifier = _configured(api, own_token)
        await refused(verifier, bearer(value), Reason.IDENTITY_UNAVAILABLE)
        api.status = 200
        frozen.move_to(T0)
        assert await verifier.agent(bearer(value)) == AgentId("agents", "alpha")
        for make, _ in REFUSALS.values():
            metadata = make(keys)
            with pytest.raises(GovernedMemoryError):
                await verifier.agent(metadata)
            secrets += [v.decode() if isinstance(v, bytes) else v for _, v in metadata or ()]
        await verifier.aclose()
    lines = [record.getMessage() for record in caplog.records]
    assert any("cannot be had (discovery_http_503)" in line for line in lines)
    for secret in secrets:
        for part in secret.removeprefix("Bearer ").split("."):
            assert len(part) < 8 or not any(part in line for line in lines), part[:12]
