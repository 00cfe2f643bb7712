"""Hostile input to every control route: never a 500, never a body beyond the contract's fields."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from urllib.parse import quote

import httpx
import pytest
from agent import ScriptedModel, build_app
from bridge import Bridge
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kagent_memory_governed.errors import Reason

CODES = {reason.value for reason in Reason} | {"internal_error"}
ANSWERS = {
    ("POST", "/memory/v1/consent"): {"enabled", "generation", "max_expiry_seconds", "entry_cap"},
    ("GET", "/memory/v1/status"): {
        "enabled",
        "generation",
        "purpose",
        "policy_version",
        "max_expiry_seconds",
        "entry_cap",
        "entries",
        "last_erasure",
    },
    ("GET", "/memory/v1/entries"): {"entries", "next_cursor"},
    ("DELETE", "/memory/v1/entries/{id}"): {"deleted", "verified", "generation"},
    ("POST", "/memory/v1/forget-all"): {"erased", "verified", "generation"},
    ("POST", "/memory/v1/off"): {"enabled", "generation", "erased", "verified"},
    ("POST", "/memory/v1/offboard"): {"scopes", "erased", "verified"},
}
ROUTES = list(ANSWERS)
OPERATIONS = {
    ("POST", "/memory/v1/consent"): "consent",
    ("GET", "/memory/v1/status"): "status",
    ("GET", "/memory/v1/entries"): "entries",
    ("DELETE", "/memory/v1/entries/{id}"): "forget",
    ("POST", "/memory/v1/forget-all"): "forget-all",
    ("POST", "/memory/v1/off"): "off",
    ("POST", "/memory/v1/offboard"): "offboard",
}

junk = st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=80),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=20), children, max_size=4),
    max_leaves=12,
)
claims = st.fixed_dictionaries(
    {},
    optional={
        "sub": junk,
        "origin": st.sampled_from(["native", "appservice", "", "NATIVE"]) | junk,
        "room": junk,
        "scope": junk,
        "aud": junk,
        "jti": junk | st.integers(),
        "iat": st.integers(min_value=-(2**40), max_value=2**40),
        "nbf": st.integers(min_value=-(2**40), max_value=2**70) | junk,
        "op": st.sampled_from(sorted(set(OPERATIONS.values()))) | junk | st.integers() | st.none(),
    },
)


@pytest.fixture(scope="module")
async def client(runtime) -> AsyncIterator[httpx.AsyncClient]:
    app = build_app(ScriptedModel())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
        yield http


def check(answer: httpx.Response, route: tuple[str, str]) -> None:
    assert answer.status_code != 500, answer.text
    body = answer.json()
    if answer.status_code == 200:
        assert set(body) == ANSWERS[route]
    else:
        assert set(body) == {"error"} and body["error"] in CODES, body
        assert answer.status_code in (401, 403, 404, 405, 409, 413, 422, 429, 503)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    route=st.sampled_from(ROUTES),
    authorization=st.one_of(st.none(), junk, st.builds(lambda t: f"Bearer {t}", junk)),
    body=st.one_of(json_values.map(json.dumps), junk),
    query=junk,
    entry_id=junk,
)
async def test_unauthenticated_junk_is_refused_with_a_code(client, route, authorization, body, query, entry_id):
    method, path = route
    path = path.replace("{id}", quote(entry_id, safe="") or "x")
    headers = {"Authorization": authorization} if authorization is not None else {}
    try:
        answer = await client.request(method, path, params={"q": query}, content=body.encode(), headers=headers)
    except (httpx.InvalidURL, UnicodeEncodeError, ValueError):
        return  # not sendable over HTTP at all
    if answer.status_code in (307, 404, 405) and b'"error"' not in answer.content:
        return  # the junk id made the path another route (a '/' or '..' in it): the router's answer, not ours
    check(answer, route)
    assert answer.status_code != 200


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    route=st.sampled_from(ROUTES),
    changes=claims,
    body=st.one_of(json_values.map(json.dumps), junk, st.just('{"confirm": true}')),
    limit=st.one_of(st.none(), junk, st.integers(-5, 100).map(str)),
    cursor=st.one_of(st.none(), junk),
)
async def test_signed_tokens_with_hostile_claims_and_bodies_get_contract_answers(
    client, bridge: Bridge, route, changes, body, limit, cursor
):
    method, path = route
    purpose = "offboard" if path.endswith("offboard") else "control"
    token = bridge.sign(time.time(), purpose, **{"op": OPERATIONS[route], **changes})  # the right op unless drawn
    params = {k: v for k, v in (("limit", limit), ("cursor", cursor)) if v is not None}
    path = path.replace("{id}", "00000000-0000-0000-0000-000000000000")
    try:
        answer = await client.request(
            method, path, params=params, content=body.encode(), headers={"Authorization": f"Bearer {token}"}
        )
    except (httpx.InvalidURL, UnicodeEncodeError, ValueError):
        return
    check(answer, route)
