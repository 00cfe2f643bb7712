"""The scope assertion is verified exactly as docs/bridge.md says; every refusal is a reason code (R4, R28, R32)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import string
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from kagent_memory_governed.assertion import Trust, verify
from kagent_memory_governed.contract import ControlOperation as Operation
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.testing import HOMESERVER, Bridge, b64, compact

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
T = NOW.timestamp()
ALICE = f"@alice:{HOMESERVER}"


def reason_for(
    token: object, trust: Trust, *, purpose: str = "scope", user_id: object = ALICE, op: Operation | None = None
) -> Reason:
    with pytest.raises(GovernedMemoryError) as refused:
        verify(token, trust, now=NOW, purpose=purpose, user_id=user_id, op=op)
    assert str(refused.value) == refused.value.reason.value
    return refused.value.reason


def test_a_valid_scope_assertion_yields_the_typed_key_and_generation(bridge: Bridge) -> None:
    assertion = verify(bridge.sign(T, gen=7), bridge.trust(), now=NOW, user_id=ALICE)
    assert assertion.key is not None
    assert assertion.key.principal.mxid == ALICE
    assert str(assertion.key.agent) == "kagent/helper"
    assert assertion.key.room.room_id == f"!control:{HOMESERVER}"
    assert assertion.generation == 7
    assert assertion.expires_at.timestamp() == int(T) + 120


def test_control_and_offboard_tokens_carry_no_generation(bridge: Bridge) -> None:
    token = bridge.sign(T, "control", op="status")
    control = verify(token, bridge.trust(), now=NOW, purpose="control", op=Operation.STATUS)
    assert control.key is not None
    assert control.generation is None and control.key.room.room_id == f"!control:{HOMESERVER}"
    assert control.op is Operation.STATUS
    token = bridge.sign(T, "offboard", op="offboard")
    offboard = verify(token, bridge.trust(), now=NOW, purpose="offboard", op=Operation.OFFBOARD)
    assert offboard.key is None and offboard.principal.mxid == ALICE


@pytest.mark.parametrize("token", [None, ""])
def test_no_token_is_no_assertion(bridge: Bridge, token: object) -> None:
    assert reason_for(token, bridge.trust()) is Reason.NO_ASSERTION


def test_another_key_is_a_bad_signature(bridge: Bridge) -> None:
    impostor = Bridge()
    assert reason_for(impostor.sign(T), bridge.trust()) is Reason.BAD_ASSERTION


def test_a_tampered_payload_is_refused(bridge: Bridge) -> None:
    header, _, signature = bridge.sign(T).split(".")
    forged = b64(json.dumps(bridge.claims(T, sub="@mallory:example.org")).encode())
    assert reason_for(f"{header}.{forged}.{signature}", bridge.trust()) is Reason.BAD_ASSERTION


def test_alg_none_and_hs256_with_the_public_key_as_secret_are_refused(bridge: Bridge) -> None:
    claims = bridge.claims(T)
    unsigned = compact({"alg": "none"}, claims, lambda _: b"")
    assert reason_for(unsigned, bridge.trust()) is Reason.BAD_ASSERTION
    assert reason_for(unsigned.rsplit(".", 1)[0] + ".", bridge.trust()) is Reason.BAD_ASSERTION
    secret = bridge.public_pem.encode()
    hs256 = compact({"alg": "HS256"}, claims, lambda data: hmac.new(secret, data, hashlib.sha256).digest())
    assert reason_for(hs256, bridge.trust()) is Reason.BAD_ASSERTION


@pytest.mark.parametrize(
    "header",
    [
        {"alg": "EdDSA", "jku": "https://evil.example/keys"},
        {"alg": "EdDSA", "jwk": {"kty": "OKP"}},
        {"alg": "EdDSA", "x5u": "https://evil.example/cert"},
        {"alg": "EdDSA", "crit": ["exp"]},
        {"alg": "ES256"},
        {"typ": "JWT"},
    ],
)
def test_header_tricks_are_refused(bridge: Bridge, header: dict[str, Any]) -> None:
    assert reason_for(bridge.sign(T, header=header), bridge.trust()) is Reason.BAD_ASSERTION


def test_a_kid_is_ignored_not_trusted(bridge: Bridge) -> None:
    token = bridge.sign(T, header={"alg": "EdDSA", "kid": "../../etc/passwd"})
    assert verify(token, bridge.trust(), now=NOW, user_id=ALICE).generation == 1


@pytest.mark.parametrize(
    "changes",
    [
        {"iss": "someone-else"},
        {"aud": "kagent/other-agent"},
        {"aud": "kagent/helper#control"},
        {"aud": ["kagent/helper"]},
        {"scope": "space"},
        {"room": "#alias:example.org"},
        {"gen": 0},
        {"gen": 2**63},  # past PostgreSQL's bigint: refused before any statement
        {"gen": 2**70},
        {"op": "status"},  # a control token's operation has no place in a scope header
        {"op": None},
        {"nbf": int(T) + 31},  # not yet valid, beyond the leeway
        {"nbf": float(T)},
        {"nbf": int(T) + 120},  # never valid: not before its own expiry
        {"gen": "1"},
        {"gen": True},
        {"iat": int(T) - 400, "exp": int(T) + 10},  # lifetime over 300 s
        {"exp": int(T) - 31, "iat": int(T) - 100},  # expired beyond the leeway
        {"iat": int(T) + 31, "exp": int(T) + 100},  # issued in the future beyond the leeway
        {"exp": int(T)},  # exp before iat + 1
        {"iat": float(T)},
        {"jti": ""},
        {"jti": 5},
        {"sub": "alice"},
        {"origin": "federated"},
    ],
)
def test_claims_that_do_not_match_are_bad_assertions(bridge: Bridge, changes: dict[str, Any]) -> None:
    assert reason_for(bridge.sign(T, **changes), bridge.trust()) is Reason.BAD_ASSERTION


@pytest.mark.parametrize("claim", ["iss", "aud", "sub", "origin", "room", "scope", "gen", "iat", "exp", "jti"])
def test_every_claim_is_required(bridge: Bridge, claim: str) -> None:
    missing: dict[str, Any] = {claim: ...}
    assert reason_for(bridge.sign(T, **missing), bridge.trust()) is Reason.BAD_ASSERTION


def test_the_largest_bigint_generation_is_admitted(bridge: Bridge) -> None:
    assert verify(bridge.sign(T, gen=2**63 - 1), bridge.trust(), now=NOW, user_id=ALICE).generation == 2**63 - 1


def test_nbf_is_optional_and_enforced_with_the_same_leeway_as_iat(bridge: Bridge) -> None:
    trust = bridge.trust()
    for nbf in (int(T) - 60, int(T), int(T) + 30):  # past, now, and the edge of the leeway
        assert verify(bridge.sign(T, nbf=nbf), trust, now=NOW, user_id=ALICE).generation == 1
    assert reason_for(bridge.sign(T, nbf=int(T) + 31), trust) is Reason.BAD_ASSERTION
    token = bridge.sign(T, "control", op="status", nbf=int(T) + 31)
    assert reason_for(token, trust, purpose="control", op=Operation.STATUS) is Reason.BAD_ASSERTION


def test_the_leeway_is_thirty_seconds_each_way(bridge: Bridge) -> None:
    trust = bridge.trust()
    assert verify(bridge.sign(T, iat=int(T) - 129, exp=int(T) - 29), trust, now=NOW, user_id=ALICE)
    assert verify(bridge.sign(T, iat=int(T) + 30, exp=int(T) + 90), trust, now=NOW, user_id=ALICE)
    assert reason_for(bridge.sign(T, iat=int(T) - 130, exp=int(T) - 30), trust) is Reason.BAD_ASSERTION


@pytest.mark.parametrize(
    "changes",
    [{"origin": "appservice"}, {"sub": "@alice:remote.example"}, {"sub": "@alice:example.org.evil"}],
)
def test_bridged_remote_and_lookalike_principals_are_not_admitted(bridge: Bridge, changes: dict[str, Any]) -> None:
    user = changes.get("sub", ALICE)
    assert reason_for(bridge.sign(T, **changes), bridge.trust(), user_id=user) is Reason.PRINCIPAL_NOT_ADMITTED


@pytest.mark.parametrize("user_id", [None, "@bob:example.org", "@Alice:example.org", "alice", ALICE + " "])
def test_sub_must_equal_the_request_user_exactly(bridge: Bridge, user_id: object) -> None:
    assert reason_for(bridge.sign(T), bridge.trust(), user_id=user_id) is Reason.SCOPE_MISMATCH


def test_duplicate_claims_are_refused(bridge: Bridge) -> None:
    claims = json.dumps(bridge.claims(T))
    duplicated = claims[:-1] + ', "sub": "@mallory:example.org"}'
    token = compact({"alg": "EdDSA"}, duplicated, bridge.private_key.sign)
    assert reason_for(token, bridge.trust()) is Reason.BAD_ASSERTION


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_non_json_constant_in_any_claim_is_refused(bridge: Bridge, constant: str) -> None:
    claims = json.dumps(bridge.claims(T))
    for extra in (f', "note": {constant}}}', f', "note": [1, {{"deep": {constant}}}]}}'):
        token = compact({"alg": "EdDSA"}, claims[:-1] + extra, bridge.private_key.sign)
        assert reason_for(token, bridge.trust()) is Reason.BAD_ASSERTION


def test_a_forget_token_may_name_the_one_entry_it_forgets(bridge: Bridge) -> None:
    entry = "0b8e4f5a-6d0c-4f7e-9a41-5f2b8c1d9e30"
    token = bridge.sign(T, "control", op="forget", entry=entry)
    assert str(verify(token, bridge.trust(), now=NOW, purpose="control", op=Operation.FORGET).entry) == entry
    unbound = bridge.sign(T, "control", op="forget")
    assert verify(unbound, bridge.trust(), now=NOW, purpose="control", op=Operation.FORGET).entry is None


@pytest.mark.parametrize(
    "entry", ["0B8E4F5A-6D0C-4F7E-9A41-5F2B8C1D9E30", "0b8e4f5a6d0c4f7e9a415f2b8c1d9e30", "x", 7, None]
)
def test_an_entry_claim_in_another_spelling_or_type_is_refused(bridge: Bridge, entry: object) -> None:
    token = bridge.sign(T, "control", op="forget", entry=entry)
    assert reason_for(token, bridge.trust(), purpose="control", op=Operation.FORGET) is Reason.BAD_ASSERTION


@pytest.mark.parametrize("op", [op for op in Operation if op is not Operation.FORGET])
def test_an_entry_claim_on_any_token_but_forget_is_refused(bridge: Bridge, op: Operation) -> None:
    purpose = "offboard" if op is Operation.OFFBOARD else "control"
    token = bridge.sign(T, purpose, op=op.value, entry="0b8e4f5a-6d0c-4f7e-9a41-5f2b8c1d9e30")
    assert reason_for(token, bridge.trust(), purpose=purpose, op=op) is Reason.BAD_ASSERTION
    header = bridge.sign(T, entry="0b8e4f5a-6d0c-4f7e-9a41-5f2b8c1d9e30")
    assert reason_for(header, bridge.trust()) is Reason.BAD_ASSERTION


@pytest.mark.parametrize(
    "token",
    ["a.b", "a.b.c.d", "!!.!!.!!", "e30.e30.e30", "x" * 5000, "é.é.é", 42, b"bytes", "eyJhbGciOiJFZERTQSJ9..", "..."],
)
def test_malformed_tokens_are_bad_assertions(bridge: Bridge, token: object) -> None:
    assert reason_for(token, bridge.trust()) is Reason.BAD_ASSERTION


def test_a_padded_or_non_object_part_is_refused(bridge: Bridge) -> None:
    header, payload, signature = bridge.sign(T).split(".")
    assert reason_for(f"{header}=.{payload}.{signature}", bridge.trust()) is Reason.BAD_ASSERTION
    array = compact({"alg": "EdDSA"}, "[1, 2]", bridge.private_key.sign)
    assert reason_for(array, bridge.trust()) is Reason.BAD_ASSERTION


def test_the_public_key_loads_from_pem_text_or_a_file(bridge: Bridge, tmp_path: Path) -> None:
    path = tmp_path / "bridge.pem"
    path.write_text(bridge.public_pem)
    for value in (bridge.public_pem, f"@{path}"):
        assert Trust.load_public_key(value).public_bytes_raw() == bridge.private_key.public_key().public_bytes_raw()
    ec_pem = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(ValueError):
        Trust.load_public_key(ec_pem.decode())


def _signed(bridge: Bridge, payload: str) -> str:
    """A token over exactly these payload characters, signed by the bridge itself."""
    signing_input = f"{b64(json.dumps({'alg': 'EdDSA'}).encode())}.{payload}"
    return f"{signing_input}.{b64(bridge.private_key.sign(signing_input.encode()))}"


def _with_signature_char(bridge: Bridge, wanted: str) -> str:
    """A valid scope token whose signature segment contains one of ``wanted`` (a fresh jti until it does)."""
    while not set((token := bridge.sign(T)).rsplit(".", 1)[1]) & set(wanted):
        pass
    return token


def test_a_padded_token_is_refused_even_when_its_signature_covers_the_padding(bridge: Bridge) -> None:
    header, payload, signature = bridge.sign(T).split(".")
    assert len(signature) % 4 == 2
    assert reason_for(f"{header}.{payload}.{signature}==", bridge.trust()) is Reason.BAD_ASSERTION
    claims = base64.urlsafe_b64encode(json.dumps(bridge.claims(T, jti="padded-x")).encode()).decode()
    assert claims.endswith("=")
    assert reason_for(_signed(bridge, claims), bridge.trust()) is Reason.BAD_ASSERTION


def test_the_standard_alphabet_is_another_spelling_and_refused(bridge: Bridge) -> None:
    token = _with_signature_char(bridge, "-_")
    assert verify(token, bridge.trust(), now=NOW, user_id=ALICE)
    respelled = token.translate(str.maketrans("-_", "+/"))
    head, _, signature = respelled.rpartition(".")
    assert base64.b64decode(signature + "==") == base64.urlsafe_b64decode(token.rsplit(".", 1)[1] + "==")
    assert reason_for(respelled, bridge.trust()) is Reason.BAD_ASSERTION
    # and a payload the bridge itself wrote with '+' or '/' is refused although its signature is good
    claims = base64.b64encode(json.dumps(bridge.claims(T, jti="~~~??")).encode()).decode().rstrip("=")
    assert "+" in claims or "/" in claims  # three '~' in a row: one sits last in a 3-byte group, 0x7e -> '+'
    assert reason_for(_signed(bridge, claims), bridge.trust()) is Reason.BAD_ASSERTION


def test_non_zero_trailing_bits_are_another_spelling_and_refused(bridge: Bridge) -> None:
    token = bridge.sign(T)
    head, _, signature = token.rpartition(".")
    alphabet = string.ascii_uppercase + string.ascii_lowercase + string.digits + "-_"
    last = alphabet.index(signature[-1])
    assert last & 0b1111 == 0  # 64 bytes fill 86 characters with 4 bits to spare, all zero
    respelled = f"{head}.{signature[:-1]}{alphabet[last | 0b0101]}"
    assert base64.urlsafe_b64decode(respelled.rsplit(".", 1)[1] + "==") == base64.urlsafe_b64decode(signature + "==")
    assert reason_for(respelled, bridge.trust()) is Reason.BAD_ASSERTION


@pytest.mark.parametrize("presented_for", list(Operation))
@pytest.mark.parametrize("minted_for", list(Operation))
def test_a_control_token_is_valid_for_the_operation_it_names_only(
    bridge: Bridge, minted_for: Operation, presented_for: Operation
) -> None:
    purpose = "offboard" if presented_for is Operation.OFFBOARD else "control"
    token = bridge.sign(T, purpose, op=minted_for.value)
    if minted_for is presented_for:
        assert verify(token, bridge.trust(), now=NOW, purpose=purpose, op=presented_for).op is presented_for
    else:
        assert reason_for(token, bridge.trust(), purpose=purpose, op=presented_for) is Reason.BAD_ASSERTION


def test_only_changes_are_single_use() -> None:
    assert {op.value for op in Operation if op.single_use} == {"consent", "forget", "forget-all", "off", "offboard"}


@pytest.mark.parametrize(("purpose", "op"), [("control", None), ("offboard", None), ("scope", Operation.STATUS)])
def test_asking_for_a_purpose_without_its_operation_is_a_programming_error(
    bridge: Bridge, purpose: str, op: Operation | None
) -> None:
    with pytest.raises(TypeError):
        verify(bridge.sign(T), bridge.trust(), now=NOW, purpose=purpose, op=op)


def _pem(raw: bytes) -> str:
    key = Ed25519PublicKey.from_public_bytes(raw)
    return key.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()


# The eight points of small order, as libsodium's ge25519_has_small_order lists them (both signs of x).
SMALL_ORDER = [
    "0000000000000000000000000000000000000000000000000000000000000000",  # order 4
    "0000000000000000000000000000000000000000000000000000000000000080",  # order 4
    "0100000000000000000000000000000000000000000000000000000000000000",  # the identity
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",  # order 2
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",  # order 8
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
]
NON_CANONICAL = [
    "0100000000000000000000000000000000000000000000000000000000000080",  # x = 0 with the sign bit set
    "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",  # y = p, i.e. 0
    "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",  # y = p + 1, i.e. 1: the identity
    "0200000000000000000000000000000000000000000000000000000000000000",  # y = 2: not on the curve
]


def test_the_identity_key_accepts_a_forged_signature_for_any_message() -> None:
    """Why the bridge key is checked: the library verifies R = identity, S = 0 under the identity key."""
    identity = Ed25519PublicKey.from_public_bytes(bytes.fromhex(SMALL_ORDER[2]))
    identity.verify(bytes.fromhex(SMALL_ORDER[2]) + bytes(32), b'{"sub": "@mallory:example.org"}')


@pytest.mark.parametrize("encoding", SMALL_ORDER + NON_CANONICAL)
def test_small_order_and_non_canonical_bridge_keys_are_refused(encoding: str) -> None:
    with pytest.raises(ValueError):
        Trust.load_public_key(_pem(bytes.fromhex(encoding)))


def test_a_key_with_a_small_order_component_is_refused(bridge: Bridge) -> None:
    from kagent_memory_governed import ed25519

    genuine = bridge.private_key.public_key().public_bytes_raw()
    p = 2**255 - 19
    point, small = ed25519._decode(genuine), ed25519._decode(bytes.fromhex(SMALL_ORDER[4]))
    assert point is not None and small is not None
    x, y, z, _ = ed25519._add(point, small)
    x, y = x * pow(z, -1, p) % p, y * pow(z, -1, p) % p  # the genuine key plus a point of order 8
    encoding = (y | (x & 1) << 255).to_bytes(32, "little")
    assert ed25519._decode(encoding) is not None  # on the curve, canonically encoded
    with pytest.raises(ValueError):
        Trust.load_public_key(_pem(encoding))
    assert ed25519.is_prime_order_point(genuine)
