"""Hostile input, property-based: every value ends in a value or a reason code; never another exception,
and never a message that echoes the input."""

from __future__ import annotations

import string
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kagent_memory_governed.assertion import verify
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.policy import Policy, admit_embedding, admit_fact
from kagent_memory_governed.scope import AgentId, ControlRoom, Principal
from kagent_memory_governed.testing import Bridge, compact

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
anything = st.one_of(
    st.text(max_size=300),
    st.binary(max_size=300).map(lambda raw: raw.decode("latin-1")),
    st.none(),
    st.integers(),
    st.floats(allow_nan=True),
    st.lists(st.text(max_size=5), max_size=3),
)
confusable_mxids = st.builds(
    lambda local, sep, server: f"{local}{sep}{server}",
    st.text(alphabet=string.ascii_lowercase + "аеорсху._=-/+" + "\x00\u200b", min_size=0, max_size=20).map(
        lambda s: "@" + s
    ),
    st.sampled_from([":", "：", "", "::"]),
    st.text(alphabet=string.ascii_letters + string.digits + ".-[]:" + "ехаmple", max_size=40),
)


def refused_cleanly(call: Callable[[object], object], value: object, reason: Reason = Reason.BAD_INPUT) -> None:
    """``call(value)`` is admitted, or refused with ``reason`` and nothing but its code."""
    try:
        call(value)
    except GovernedMemoryError as refused:
        assert refused.reason is reason
        assert str(refused) == refused.reason.value  # the code is the whole message: nothing echoed


@settings(max_examples=400, deadline=None)
@given(
    value=st.one_of(anything, confusable_mxids), origin=st.one_of(anything, st.sampled_from(["native", "appservice"]))
)
def test_principals_parse_or_refuse_with_bad_input(value: object, origin: object) -> None:
    try:
        principal = Principal.parse(value, origin)
    except GovernedMemoryError as refused:
        assert refused.reason is Reason.BAD_INPUT
        return
    assert principal.mxid.isascii() and principal.mxid.startswith("@") and ":" in principal.mxid
    assert len(principal.mxid.encode()) <= 255 and "\x00" not in principal.mxid


@settings(max_examples=300, deadline=None)
@given(value=anything)
def test_rooms_and_agents_parse_or_refuse_with_bad_input(value: object) -> None:
    refused_cleanly(ControlRoom.parse, value)
    refused_cleanly(AgentId.parse, value)


@settings(max_examples=300, deadline=None)
@given(
    fact=st.one_of(
        st.text(max_size=700),
        st.integers(min_value=500, max_value=520).map(lambda n: "a" * (n - 2) + "é"),  # the 512/513 boundary
        st.binary(max_size=600).map(lambda raw: raw.decode("utf-8", errors="surrogateescape")),  # invalid UTF-8
        anything,
    )
)
def test_facts_are_admitted_exactly_up_to_512_bytes(fact: object) -> None:
    try:
        admitted = admit_fact(fact, Policy())
    except GovernedMemoryError as refused:
        assert refused.reason in (Reason.BAD_INPUT, Reason.FACT_TOO_LARGE)
        if refused.reason is Reason.FACT_TOO_LARGE:
            assert isinstance(fact, str)  # only text can be too large
            assert len(fact.encode("utf-8")) > 512
        return
    assert len(admitted.encode("utf-8")) <= 512 and "\x00" not in admitted


@settings(max_examples=200, deadline=None)
@given(vector=st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3)), max_size=800))
def test_embeddings_are_admitted_or_bad_input(vector: object) -> None:
    refused_cleanly(admit_embedding, vector)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    token=st.one_of(
        anything,
        st.lists(
            st.text(alphabet=string.ascii_letters + string.digits + "-_=", max_size=60), min_size=1, max_size=5
        ).map(".".join),
    )
)
def test_arbitrary_tokens_are_refused_with_an_assertion_code(bridge: Bridge, token: object) -> None:
    with pytest.raises(GovernedMemoryError) as refused:
        verify(token, bridge.trust(), now=NOW, user_id="@alice:example.org")
    assert refused.value.reason in (Reason.NO_ASSERTION, Reason.BAD_ASSERTION)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    header=st.dictionaries(st.text(max_size=8), anything, max_size=6),
    claims=st.dictionaries(
        st.sampled_from(["iss", "aud", "sub", "origin", "room", "scope", "gen", "iat", "exp", "jti"]), anything
    ),
)
def test_signed_tokens_with_arbitrary_headers_and_claims_never_verify_by_accident(
    bridge: Bridge, header: dict[str, object], claims: dict[str, object]
) -> None:
    token = compact({"alg": "EdDSA", **header}, claims, bridge.private_key.sign)
    try:
        verify(token, bridge.trust(), now=NOW, user_id="@alice:example.org")
    except GovernedMemoryError as refused:
        assert refused.reason in (Reason.BAD_ASSERTION, Reason.PRINCIPAL_NOT_ADMITTED, Reason.SCOPE_MISMATCH)
        return
    raise AssertionError("a token of arbitrary claims verified")


def test_a_huge_header_is_refused_before_parsing(bridge: Bridge) -> None:
    header = {"alg": "EdDSA", "kid": "k" * 10_000}
    token = compact(header, bridge.claims(time.time()), bridge.private_key.sign)
    with pytest.raises(GovernedMemoryError, match="bad_assertion"):
        verify(token, bridge.trust(), now=NOW, user_id="@alice:example.org")
