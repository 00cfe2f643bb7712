"""Hostile input to every control route: never a 500, never a body beyond the contract's fields."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kagent_memory_governed.consent import admit_label
from kagent_memory_governed.contract import CALLS, MAX_BODY_BYTES
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.testing import Bridge, ScriptedModel, build_app

if TYPE_CHECKING:
    from kagent_memory_governed import Runtime

CODES = {reason.value for reason in Reason} | {"internal_error"}
# the contract's own table: a route's answer has exactly its model's members (docs/bridge.md states the same
# calls for people; tests/core/test_docs.py holds the two together)
ROUTES: list[tuple[str, str]] = [(call.method, call.route) for call in CALLS.values()]
ANSWERS: dict[tuple[str, str], set[str]] = {
    (call.method, call.route): set(call.answer.model_fields) for call in CALLS.values()
}
OPERATIONS: dict[tuple[str, str], str] = {(call.method, call.route): call.op.value for call in CALLS.values()}

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
async def client(runtime: Runtime) -> AsyncIterator[httpx.AsyncClient]:
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
async def test_unauthenticated_junk_is_refused_with_a_code(
    client: httpx.AsyncClient, route: tuple[str, str], authorization: str | None, body: str, query: str, entry_id: str
) -> None:
    method, path = route
    path = path.replace("{entry_id}", quote(entry_id, safe="") or "x")
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
    client: httpx.AsyncClient,
    bridge: Bridge,
    route: tuple[str, str],
    changes: dict[str, Any],
    body: str,
    limit: str | None,
    cursor: str | None,
) -> None:
    method, path = route
    purpose = "offboard" if path.endswith("offboard") else "control"
    token = bridge.sign(time.time(), purpose, **{"op": OPERATIONS[route], **changes})  # the right op unless drawn
    params = {k: v for k, v in (("limit", limit), ("cursor", cursor)) if v is not None}
    path = path.replace("{entry_id}", "00000000-0000-0000-0000-000000000000")
    try:
        answer = await client.request(
            method, path, params=params, content=body.encode(), headers={"Authorization": f"Bearer {token}"}
        )
    except (httpx.InvalidURL, UnicodeEncodeError, ValueError):
        return
    check(answer, route)


def _label(value: object) -> bool:
    try:
        admit_label(value)
    except GovernedMemoryError:
        return False
    return True


def _strict_json(raw: bytes) -> bool:
    def refuse(constant: str) -> None:
        raise ValueError(constant)

    try:
        json.loads(raw, parse_constant=refuse)
    except ValueError:
        return False
    return True


def expected(path: str, raw: bytes, members: dict[str, object]) -> int | str:
    """The contract's rule for a JSON object body, written out independently of the models that apply it."""
    if len(raw) > MAX_BODY_BYTES:
        return "body_too_large"
    if not _strict_json(raw):  # NaN and Infinity are not JSON, whatever member they are in
        return "bad_input"
    if path.endswith("/consent"):
        labelled = set(members) == {"purpose", "policy_version"} and all(map(_label, members.values()))
        return 200 if labelled else "bad_input"
    if set(members) - {"confirm"}:
        return "bad_input"
    return 200 if members.get("confirm") is True else "confirmation_required"


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    route=st.sampled_from([route for route in ROUTES if route[0] == "POST"]),
    members=st.dictionaries(
        st.sampled_from(["confirm", "purpose", "policy_version", "x"]),
        st.sampled_from([True, False, 1, 0, 1.0, "true", None, [True], "assist", "v1", "a b", ""]) | json_values,
        max_size=3,
    ),
)
async def test_an_object_body_gets_the_answer_the_contract_gives_it(
    client: httpx.AsyncClient, bridge: Bridge, route: tuple[str, str], members: dict[str, object]
) -> None:
    method, path = route
    purpose = "offboard" if path.endswith("offboard") else "control"
    token = bridge.sign(time.time(), purpose, op=OPERATIONS[route])
    raw = json.dumps(members).encode()
    answer = await client.request(method, path, content=raw, headers={"Authorization": f"Bearer {token}"})
    want = expected(path, raw, members)
    if want == 200:
        assert answer.status_code == 200, answer.text
    else:
        assert answer.json() == {"error": want}


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(limit=st.from_regex(r"[0-9+\- .eEx_]{0,4}", fullmatch=True) | st.integers(-5, 100).map(str))
async def test_a_limit_is_one_to_three_ascii_digits_from_1_to_50(
    client: httpx.AsyncClient, bridge: Bridge, limit: str
) -> None:
    token = bridge.sign(time.time(), "control", op="entries")
    answer = await client.get(
        "/memory/v1/entries", params={"limit": limit}, headers={"Authorization": f"Bearer {token}"}
    )
    if re.fullmatch("[0-9]{1,3}", limit) and 1 <= int(limit) <= 50:
        assert answer.status_code == 200, answer.text
    else:
        assert (answer.status_code, answer.json()) == (422, {"error": "bad_input"})
