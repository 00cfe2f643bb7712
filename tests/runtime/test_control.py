"""The control API: every call of docs/bridge.md, each refusal, and scope taken from the token only (R10-R14, R29)."""

from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from freezegun import freeze_time
from support import facts

from kagent_memory_governed import clock, control
from kagent_memory_governed.assertion import verify
from kagent_memory_governed.contract import MAX_BODY_BYTES
from kagent_memory_governed.errors import GovernedMemoryError
from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey
from kagent_memory_governed.store import Store
from kagent_memory_governed.testing import HOMESERVER, Bridge, ScriptedModel, build_app, compact

if TYPE_CHECKING:
    import asyncpg

    from kagent_memory_governed import Runtime

ALICE, BOB = f"@alice:{HOMESERVER}", f"@bob:{HOMESERVER}"
ROOM = f"!control:{HOMESERVER}"


@pytest.fixture
async def client(runtime: Runtime, store: Store, bridge: Bridge) -> AsyncIterator[httpx.AsyncClient]:
    """Upstream's real KAgentApp, built with governed memory installed, over ASGI."""
    app = build_app(ScriptedModel())
    control.mount(app, store, bridge.trust())  # already mounted by activation: idempotent
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
        yield http


def auth(bridge: Bridge, op: str, purpose: str | None = None, **claims: Any) -> dict[str, str]:
    """A fresh token for one operation (``op``), signed now; ``purpose`` defaults to the one ``op`` needs."""
    purpose = purpose or ("offboard" if op == "offboard" else "control")
    return {"Authorization": f"Bearer {bridge.sign(time.time(), purpose, op=op, **claims)}"}


async def consent(client: httpx.AsyncClient, bridge: Bridge, **claims: Any) -> int:
    answer = await client.post(
        "/memory/v1/consent",
        json={"purpose": "assist", "policy_version": "v1"},
        headers=auth(bridge, "consent", **claims),
    )
    assert answer.status_code == 200, answer.text
    generation: int = answer.json()["generation"]
    return generation


async def remember(store: Store, bridge: Bridge, generation: int, *texts: str, **claims: Any) -> list[uuid.UUID]:
    key = verify(
        bridge.sign(time.time(), **claims), bridge.trust(), now=clock.now(), user_id=claims.get("sub", ALICE)
    ).key
    assert key is not None  # only an offboarding token names no scope
    return await store.write(key, generation, facts(*texts))


async def test_consent_status_inspect_forget_off_and_offboard(
    client: httpx.AsyncClient, store: Store, bridge: Bridge
) -> None:
    answer = await client.post(
        "/memory/v1/consent", json={"purpose": "assist", "policy_version": "v1"}, headers=auth(bridge, "consent")
    )
    assert answer.json() == {"enabled": True, "generation": 1, "max_expiry_seconds": 604800, "entry_cap": 100}
    ids = await remember(store, bridge, 1, "likes tea", "lives in Lisbon", "deploys on Fridays")

    status = (await client.get("/memory/v1/status", headers=auth(bridge, "status"))).json()
    assert status == {
        "enabled": True,
        "generation": 1,
        "purpose": "assist",
        "policy_version": "v1",
        "max_expiry_seconds": 604800,
        "entry_cap": 100,
        "entries": 3,
        "last_erasure": None,
    }

    page = (await client.get("/memory/v1/entries?limit=2", headers=auth(bridge, "entries"))).json()
    assert len(page["entries"]) == 2 and page["next_cursor"]
    rest = (
        await client.get(f"/memory/v1/entries?cursor={page['next_cursor']}", headers=auth(bridge, "entries"))
    ).json()
    listed = page["entries"] + rest["entries"]
    assert rest["next_cursor"] is None
    assert {e["id"] for e in listed} == {str(i) for i in ids}
    first = listed[0]
    assert set(first) == {"id", "text", "source_scope", "created_at", "expires_at"}
    assert first["source_scope"] == f"control-room:{ROOM}" and first["created_at"].endswith("Z")

    deleted = await client.delete(f"/memory/v1/entries/{first['id']}", headers=auth(bridge, "forget"))
    assert deleted.json() == {"deleted": True, "verified": True, "generation": 2}
    remaining = (await client.get("/memory/v1/entries", headers=auth(bridge, "entries"))).json()["entries"]
    assert {e["id"] for e in remaining} == {e["id"] for e in listed[1:]}

    forgot = await client.post("/memory/v1/forget-all", json={"confirm": True}, headers=auth(bridge, "forget-all"))
    assert forgot.json() == {"erased": 2, "verified": True, "generation": 3}
    await remember(store, bridge, 3, "a new fact")
    off = await client.post("/memory/v1/off", json={"confirm": True}, headers=auth(bridge, "off"))
    assert off.json() == {"enabled": False, "generation": 4, "erased": 1, "verified": True}
    status = (await client.get("/memory/v1/status", headers=auth(bridge, "status"))).json()
    assert status["enabled"] is False and status["last_erasure"]["result"] == "verified"

    await consent(client, bridge, room="!other:example.org")
    offboard = await client.post("/memory/v1/offboard", json={"confirm": True}, headers=auth(bridge, "offboard"))
    assert offboard.json() == {"scopes": 2, "erased": 0, "verified": True}


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({}, "no_assertion"),
        ({"Authorization": "Basic YWxpY2U6cGFzcw=="}, "no_assertion"),
        ({"Authorization": "Bearer not.a.token"}, "bad_assertion"),
    ],
)
async def test_missing_or_malformed_tokens_are_401(
    client: httpx.AsyncClient, headers: dict[str, str], code: str
) -> None:
    answer = await client.get("/memory/v1/status", headers=headers)
    assert (answer.status_code, answer.json()) == (401, {"error": code})


@pytest.mark.parametrize(
    ("purpose", "claims", "status", "code"),
    [
        ("control", {"aud": "kagent/helper"}, 401, "bad_assertion"),  # a scope token is not a control token
        ("control", {"aud": "kagent/other#control"}, 401, "bad_assertion"),
        ("offboard", {}, 401, "bad_assertion"),
        ("control", {"exp": 1, "iat": 0}, 401, "bad_assertion"),
        ("control", {"origin": "appservice"}, 403, "principal_not_admitted"),
        ("control", {"sub": "@alice:remote.example"}, 403, "principal_not_admitted"),
    ],
)
async def test_tokens_for_another_purpose_agent_time_or_principal_are_refused(
    client: httpx.AsyncClient, bridge: Bridge, purpose: str, claims: dict[str, Any], status: int, code: str
) -> None:
    answer = await client.get("/memory/v1/status", headers=auth(bridge, "status", purpose, **claims))
    assert (answer.status_code, answer.json()) == (status, {"error": code})


async def test_another_key_cannot_sign(client: httpx.AsyncClient) -> None:
    answer = await client.get("/memory/v1/status", headers=auth(Bridge(), "status"))
    assert (answer.status_code, answer.json()) == (401, {"error": "bad_assertion"})


async def test_another_subjects_entry_is_not_found_and_survives(
    client: httpx.AsyncClient, store: Store, bridge: Bridge
) -> None:
    generation = await consent(client, bridge, sub=BOB)
    [bobs] = await remember(store, bridge, generation, "bob's secret", sub=BOB)
    await consent(client, bridge)
    answer = await client.delete(f"/memory/v1/entries/{bobs}", headers=auth(bridge, "forget"))
    assert (answer.status_code, answer.json()) == (404, {"error": "not_found"})
    bob_view = (await client.get("/memory/v1/entries", headers=auth(bridge, "entries", sub=BOB))).json()
    assert [e["id"] for e in bob_view["entries"]] == [str(bobs)]
    alice_view = (await client.get("/memory/v1/entries", headers=auth(bridge, "entries"))).json()
    assert alice_view["entries"] == []


async def test_a_forget_token_bound_to_an_entry_forgets_that_entry_only(
    client: httpx.AsyncClient, store: Store, bridge: Bridge
) -> None:
    generation = await consent(client, bridge)
    kept, forgotten = await remember(store, bridge, generation, "likes tea", "lives in Lisbon")
    bound = auth(bridge, "forget", entry=str(forgotten))
    other = await client.delete(f"/memory/v1/entries/{kept}", headers=bound)
    assert (other.status_code, other.json()) == (401, {"error": "bad_assertion"})
    malformed = await client.delete("/memory/v1/entries/not-an-id", headers=bound)
    assert (malformed.status_code, malformed.json()) == (401, {"error": "bad_assertion"})
    answer = await client.delete(f"/memory/v1/entries/{forgotten}", headers=bound)  # refused unspent: still valid
    assert answer.status_code == 200 and answer.json()["deleted"] is True
    listed = (await client.get("/memory/v1/entries", headers=auth(bridge, "entries"))).json()
    assert [entry["id"] for entry in listed["entries"]] == [str(kept)]


async def test_a_destructive_token_is_accepted_once(client: httpx.AsyncClient, store: Store, bridge: Bridge) -> None:
    await consent(client, bridge)
    headers = auth(bridge, "forget-all")
    first = await client.post("/memory/v1/forget-all", json={"confirm": True}, headers=headers)
    again = await client.post("/memory/v1/forget-all", json={"confirm": True}, headers=headers)
    assert first.status_code == 200
    assert (again.status_code, again.json()) == (401, {"error": "assertion_replayed"})


@pytest.mark.parametrize("path", ["/memory/v1/forget-all", "/memory/v1/off"])
@pytest.mark.parametrize(
    "body", [{}, {"confirm": False}, {"confirm": "true"}, {"confirm": 1}, {"confirm": None}, {"confirm": [True]}]
)
async def test_missing_confirmation_is_422_and_nothing_changes(
    client: httpx.AsyncClient, store: Store, bridge: Bridge, path: str, body: dict[str, object]
) -> None:
    generation = await consent(client, bridge)
    await remember(store, bridge, generation, "keep me")
    answer = await client.post(path, json=body, headers=auth(bridge, path.rsplit("/", 1)[1]))
    assert (answer.status_code, answer.json()) == (422, {"error": "confirmation_required"})
    status = (await client.get("/memory/v1/status", headers=auth(bridge, "status"))).json()
    assert (status["enabled"], status["entries"], status["generation"]) == (True, 1, generation)


@pytest.mark.parametrize("path", ["/memory/v1/forget-all", "/memory/v1/off", "/memory/v1/offboard"])
@pytest.mark.parametrize(
    "body", [b'{"confirm": true, "x": 1}', b'{"confirm": false, "x": 1}', b'{"x": 1}', b"[]", b"true", b"", b"{"]
)
async def test_a_body_other_than_a_confirmation_object_is_bad_input(
    client: httpx.AsyncClient, store: Store, bridge: Bridge, path: str, body: bytes
) -> None:
    generation = await consent(client, bridge)
    await remember(store, bridge, generation, "keep me")
    answer = await client.post(path, content=body, headers=auth(bridge, path.rsplit("/", 1)[1]))
    assert (answer.status_code, answer.json()) == (422, {"error": "bad_input"})
    assert await state(client, bridge) == (True, generation, 1)


async def test_offboard_requires_confirmation(client: httpx.AsyncClient, bridge: Bridge) -> None:
    answer = await client.post("/memory/v1/offboard", json={}, headers=auth(bridge, "offboard"))
    assert (answer.status_code, answer.json()) == (422, {"error": "confirmation_required"})


@pytest.mark.parametrize(
    "query",
    [
        *("limit=51", "limit=0", "limit=-1", "limit=abc", "limit=1&limit=2", "cursor=forged", "limit=5&scope=other"),
        *("limit=%2B5", "limit=+5", "limit=1e1", "limit=5.0", "limit=1_0", "limit=", "limit", "limit=0050"),
        *("limit=%D9%A5", "limit=0x5", "cursor=a&cursor=b", "cursor=", "=5", "Limit=5"),
    ],
)
async def test_bad_page_queries_are_422(client: httpx.AsyncClient, bridge: Bridge, query: str) -> None:
    await consent(client, bridge)
    answer = await client.get(f"/memory/v1/entries?{query}", headers=auth(bridge, "entries"))
    assert (answer.status_code, answer.json()) == (422, {"error": "bad_input"})


@pytest.mark.parametrize(
    ("query", "listed"), [("limit=05", 3), ("limit=050", 3), ("limit=1", 1), ("limit=50", 3), ("", 3)]
)
async def test_a_limit_of_one_to_three_ascii_digits_is_accepted(
    client: httpx.AsyncClient, store: Store, bridge: Bridge, query: str, listed: int
) -> None:
    generation = await consent(client, bridge)
    await remember(store, bridge, generation, "one", "two", "three")
    answer = await client.get(f"/memory/v1/entries?{query}", headers=auth(bridge, "entries"))
    assert answer.status_code == 200 and len(answer.json()["entries"]) == listed


async def test_a_cursor_from_another_scope_is_refused(client: httpx.AsyncClient, store: Store, bridge: Bridge) -> None:
    generation = await consent(client, bridge, sub=BOB)
    await remember(store, bridge, generation, "one", "two", sub=BOB)
    cursor = (await client.get("/memory/v1/entries?limit=1", headers=auth(bridge, "entries", sub=BOB))).json()[
        "next_cursor"
    ]
    answer = await client.get(f"/memory/v1/entries?cursor={cursor}", headers=auth(bridge, "entries"))
    assert (answer.status_code, answer.json()) == (422, {"error": "bad_input"})


@pytest.mark.parametrize(
    "body",
    [
        *(b"not json", b"[]", b'{"purpose": "assist"}', b'{"purpose": "a b", "policy_version": "v1"}', b"{" * 600),
        *(b"", b"{}", b"null", b'{"purpose": 5, "policy_version": "v1"}', b'{"purpose": null, "policy_version": "v1"}'),
        *(b'{"purpose": ["assist"], "policy_version": "v1"}', b'{"purpose": "assist", "policy_version": true}'),
        b'{"purpose": "assist", "policy_version": "v1", "confirm": true}',
    ],
)
async def test_bad_consent_bodies_are_422(client: httpx.AsyncClient, bridge: Bridge, body: bytes) -> None:
    answer = await client.post("/memory/v1/consent", content=body, headers=auth(bridge, "consent"))
    assert (answer.status_code, answer.json()) == (422, {"error": "bad_input"})


async def test_entries_hide_what_has_expired(client: httpx.AsyncClient, store: Store, bridge: Bridge) -> None:
    generation = await consent(client, bridge)
    await remember(store, bridge, generation, "soon gone")
    with freeze_time(clock.now() + timedelta(days=7), real_asyncio=True):
        token = auth(bridge, "entries")  # signed at the frozen now
        listed = (await client.get("/memory/v1/entries", headers=token)).json()
        assert listed == {"entries": [], "next_cursor": None}


async def test_a_malformed_entry_id_is_422(client: httpx.AsyncClient, bridge: Bridge) -> None:
    answer = await client.delete("/memory/v1/entries/not-a-uuid", headers=auth(bridge, "forget"))
    assert (answer.status_code, answer.json()) == (422, {"error": "bad_input"})


async def test_the_routes_are_documented_in_the_openapi_schema(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json")).json()
    paths = {path: ops for path, ops in schema["paths"].items() if path.startswith("/memory/v1")}
    assert "/" in schema["paths"]  # the agent's own A2A endpoint: this is the real app
    assert set(paths) == {
        "/memory/v1/consent",
        "/memory/v1/status",
        "/memory/v1/entries",
        "/memory/v1/entries/{entry_id}",
        "/memory/v1/forget-all",
        "/memory/v1/off",
        "/memory/v1/offboard",
    }
    assert "requestBody" in paths["/memory/v1/off"]["post"]
    assert "HTTPBearer" in schema["components"]["securitySchemes"]


async def test_request_bodies_are_documented_as_closed_objects(client: httpx.AsyncClient) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]
    for path in ("/memory/v1/consent", "/memory/v1/forget-all", "/memory/v1/off", "/memory/v1/offboard"):
        schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert schema["additionalProperties"] is False, path
    assert set(
        paths["/memory/v1/consent"]["post"]["requestBody"]["content"]["application/json"]["schema"]["required"]
    ) == {"purpose", "policy_version"}


async def test_timestamps_are_rfc3339_utc_with_microseconds_always_spelled(
    client: httpx.AsyncClient, store: Store, bridge: Bridge
) -> None:
    moment = clock.now().replace(microsecond=0)  # a whole second: no shorter spelling may be chosen for it
    with freeze_time(moment, real_asyncio=True):
        generation = await consent(client, bridge)
        await remember(store, bridge, generation, "likes tea")
        [entry] = (await client.get("/memory/v1/entries", headers=auth(bridge, "entries"))).json()["entries"]
        await client.post("/memory/v1/forget-all", json={"confirm": True}, headers=auth(bridge, "forget-all"))
        last = (await client.get("/memory/v1/status", headers=auth(bridge, "status"))).json()["last_erasure"]
    spelled = moment.strftime("%Y-%m-%dT%H:%M:%S.000000Z")
    assert entry["created_at"] == spelled and entry["expires_at"] == (moment + timedelta(days=7)).strftime(
        "%Y-%m-%dT%H:%M:%S.000000Z"
    )
    assert entry["id"] == str(uuid.UUID(entry["id"]))  # the canonical lower-case spelling
    assert last == {"at": spelled, "result": "verified"}


@pytest.mark.parametrize("alg", ["none", "HS256"])
async def test_another_algorithm_is_refused(client: httpx.AsyncClient, bridge: Bridge, alg: str) -> None:
    claims = bridge.claims(time.time(), "control")
    secret = bridge.public_pem.encode()
    signer = (lambda data: b"") if alg == "none" else (lambda data: hmac.digest(secret, data, "sha256"))
    token = compact({"alg": alg}, claims, signer)
    answer = await client.get("/memory/v1/status", headers={"Authorization": f"Bearer {token}"})
    assert (answer.status_code, answer.json()) == (401, {"error": "bad_assertion"})


async def test_saves_racing_an_off_call_never_land_afterwards(
    client: httpx.AsyncClient, store: Store, bridge: Bridge, sql: asyncpg.Connection
) -> None:
    generation = await consent(client, bridge)
    key = verify(bridge.sign(time.time(), gen=generation), bridge.trust(), now=clock.now(), user_id=ALICE).key
    assert key is not None

    async def save(n: int) -> None:
        try:
            await store.write(key, generation, facts(f"racing fact {n}"))
        except GovernedMemoryError:
            pass

    async def off() -> httpx.Response:
        return await client.post("/memory/v1/off", json={"confirm": True}, headers=auth(bridge, "off"))

    results = await asyncio.gather(*(save(n) for n in range(10)), off(), *(save(n) for n in range(10, 20)))
    answer = results[10]
    assert isinstance(answer, httpx.Response)
    assert answer.json()["verified"] is True
    assert await sql.fetchval("SELECT count(*) FROM governed_memory.entries") == 0
    await save(99)
    assert await sql.fetchval("SELECT count(*) FROM governed_memory.entries") == 0


async def test_offboard_covers_every_agent_sharing_the_database(
    client: httpx.AsyncClient, store: Store, bridge: Bridge
) -> None:
    await consent(client, bridge)
    other_agent = ScopeKey(
        Principal.parse(ALICE, "native"), AgentId.parse("team-b/planner"), ControlRoom.parse(f"!planner:{HOMESERVER}")
    )
    grant = await store.grant(other_agent, purpose="assist", policy_version="v1")
    await store.write(other_agent, grant.generation, facts("planner fact"))
    answer = await client.post("/memory/v1/offboard", json={"confirm": True}, headers=auth(bridge, "offboard"))
    assert answer.json() == {"scopes": 2, "erased": 1, "verified": True}
    assert (await store.status(other_agent)).enabled is False


# -- each token names one operation; changes are accepted once -----------------------------------

OPERATIONS = ["consent", "status", "entries", "forget", "forget-all", "off", "offboard"]
SINGLE_USE = ["consent", "forget", "forget-all", "off", "offboard"]
CALLS = {
    "consent": ("POST", "/memory/v1/consent", {"purpose": "assist", "policy_version": "v1"}),
    "status": ("GET", "/memory/v1/status", None),
    "entries": ("GET", "/memory/v1/entries", None),
    "forget": ("DELETE", "/memory/v1/entries/{id}", None),
    "forget-all": ("POST", "/memory/v1/forget-all", {"confirm": True}),
    "off": ("POST", "/memory/v1/off", {"confirm": True}),
    "offboard": ("POST", "/memory/v1/offboard", {"confirm": True}),
}


async def call(
    client: httpx.AsyncClient, operation: str, headers: dict[str, str], entry: object = None
) -> httpx.Response:
    method, path, body = CALLS[operation]
    return await client.request(method, path.replace("{id}", str(entry)), json=body, headers=headers)


async def state(client: httpx.AsyncClient, bridge: Bridge) -> tuple[bool, int, int]:
    status = (await client.get("/memory/v1/status", headers=auth(bridge, "status"))).json()
    return status["enabled"], status["generation"], status["entries"]


async def test_a_consent_token_replayed_after_off_is_refused_and_memory_stays_off(
    client: httpx.AsyncClient, bridge: Bridge
) -> None:
    token = auth(bridge, "consent")
    body = {"purpose": "assist", "policy_version": "v1"}
    assert (await client.post("/memory/v1/consent", json=body, headers=token)).status_code == 200
    off = await client.post("/memory/v1/off", json={"confirm": True}, headers=auth(bridge, "off"))
    assert off.status_code == 200
    replayed = await client.post("/memory/v1/consent", json=body, headers=token)
    assert (replayed.status_code, replayed.json()) == (401, {"error": "assertion_replayed"})
    assert await state(client, bridge) == (False, off.json()["generation"], 0)


async def test_a_status_token_cannot_grant_consent(client: httpx.AsyncClient, bridge: Bridge) -> None:
    body = {"purpose": "assist", "policy_version": "v1"}
    answer = await client.post("/memory/v1/consent", json=body, headers=auth(bridge, "status"))
    assert (answer.status_code, answer.json()) == (401, {"error": "bad_assertion"})
    assert await state(client, bridge) == (False, 0, 0)


@pytest.mark.parametrize("used_on", OPERATIONS)
@pytest.mark.parametrize("minted_for", OPERATIONS)
async def test_a_token_is_accepted_for_the_operation_it_names_only(
    client: httpx.AsyncClient, store: Store, bridge: Bridge, minted_for: str, used_on: str
) -> None:
    generation = await consent(client, bridge)
    [entry] = await remember(store, bridge, generation, "likes tea")
    before = await state(client, bridge)
    # the audience (and so the token's shape) is right for the route; only `op` may differ
    purpose = "offboard" if used_on == "offboard" else "control"
    answer = await call(client, used_on, auth(bridge, minted_for, purpose), entry)
    if minted_for == used_on:
        assert answer.status_code == 200, answer.text
    else:
        assert (answer.status_code, answer.json()) == (401, {"error": "bad_assertion"})
        assert await state(client, bridge) == before


@pytest.mark.parametrize("claims", [{"op": ...}, {"op": "STATUS"}, {"op": ["status"]}, {"op": None}, {"op": ""}])
async def test_a_control_token_without_its_operation_is_refused(
    client: httpx.AsyncClient, bridge: Bridge, claims: dict[str, Any]
) -> None:
    token = bridge.sign(time.time(), "control", **claims)
    answer = await client.get("/memory/v1/status", headers={"Authorization": f"Bearer {token}"})
    assert (answer.status_code, answer.json()) == (401, {"error": "bad_assertion"})


@pytest.mark.parametrize("operation", SINGLE_USE)
async def test_a_token_that_changes_something_is_accepted_once(
    client: httpx.AsyncClient, store: Store, bridge: Bridge, operation: str
) -> None:
    generation = await consent(client, bridge)
    [entry] = await remember(store, bridge, generation, "likes tea")
    token = auth(bridge, operation)
    assert (await call(client, operation, token, entry)).status_code == 200
    again = await call(client, operation, token, entry)
    assert (again.status_code, again.json()) == (401, {"error": "assertion_replayed"})


@pytest.mark.parametrize("operation", ["status", "entries"])
async def test_a_reading_token_may_be_reused_within_its_lifetime(
    client: httpx.AsyncClient, bridge: Bridge, operation: str
) -> None:
    await consent(client, bridge)
    token = auth(bridge, operation)
    answers = [await call(client, operation, token) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [200, 200, 200]


async def test_a_token_refused_for_its_body_is_still_spent(client: httpx.AsyncClient, bridge: Bridge) -> None:
    await consent(client, bridge)
    token = auth(bridge, "off")
    unconfirmed = await client.post("/memory/v1/off", json={}, headers=token)
    assert (unconfirmed.status_code, unconfirmed.json()) == (422, {"error": "confirmation_required"})
    again = await client.post("/memory/v1/off", json={"confirm": True}, headers=token)
    assert (again.status_code, again.json()) == (401, {"error": "assertion_replayed"})
    assert (await state(client, bridge))[0] is True


# -- bodies: bounded while read, one meaning per body ---------------------------------------------


def _peak_rss_reset() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS, where Linux allows it."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(f"{field}:"))


@pytest.mark.parametrize("with_token", [True, False])
async def test_a_100_mb_body_is_refused_while_it_streams_and_memory_stays_flat(
    client: httpx.AsyncClient, bridge: Bridge, with_token: bool
) -> None:
    chunk, total, sent = b"x" * 65536, 100 * 2**20, 0

    async def hundred_megabytes() -> AsyncIterator[bytes]:
        nonlocal sent
        while sent < total:
            sent += len(chunk)
            yield chunk

    headers = auth(bridge, "consent") if with_token else {}
    field = "VmHWM" if _peak_rss_reset() else "VmRSS"
    before = _rss_kib(field)
    answer = await client.post("/memory/v1/consent", content=hundred_megabytes(), headers=headers)
    growth = _rss_kib(field) - before
    assert (answer.status_code, answer.json()) == (413, {"error": "body_too_large"})
    assert sent <= 2 * len(chunk)  # the reader stopped at the limit; the rest was never pulled
    assert growth < 4 * 1024, f"{field} grew by {growth} KiB"


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("with_token", [True, False])
@pytest.mark.parametrize("operation", [*OPERATIONS, "unknown"])
async def test_a_body_over_one_kib_is_413_on_every_route(
    client: httpx.AsyncClient, bridge: Bridge, operation: str, with_token: bool, streamed: bool
) -> None:
    method, path, _ = CALLS.get(operation, ("POST", "/memory/v1/unknown", None))
    raw = b'{"confirm": true, "padding": "' + b"x" * 1000 + b'"}'
    assert len(raw) > MAX_BODY_BYTES

    async def stream() -> AsyncIterator[bytes]:
        yield raw

    token = auth(bridge, operation) if with_token and operation != "unknown" else {}
    answer = await client.request(
        method, path.replace("{id}", str(uuid.uuid4())), content=stream() if streamed else raw, headers=token
    )
    assert (answer.status_code, answer.json()) == (413, {"error": "body_too_large"})
    if with_token and operation in SINGLE_USE:  # refused before authentication: the token is not spent
        assert (await call(client, operation, token, uuid.uuid4())).json() != {"error": "assertion_replayed"}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/memory/v1/off", b'{"confirm": false, "confirm": true}'),
        ("/memory/v1/forget-all", b'{"confirm": true, "confirm": true}'),
        ("/memory/v1/consent", b'{"purpose": "a", "policy_version": "v1", "purpose": "b"}'),
        ("/memory/v1/off", b'{"confirm": NaN}'),
        ("/memory/v1/off", b'{"confirm": true, "x": {"y": 1, "y": 2}}'),
    ],
)
async def test_duplicate_members_and_non_json_constants_are_bad_input(
    client: httpx.AsyncClient, store: Store, bridge: Bridge, path: str, body: bytes
) -> None:
    generation = await consent(client, bridge)
    await remember(store, bridge, generation, "keep me")
    answer = await client.post(path, content=body, headers=auth(bridge, path.rsplit("/", 1)[1]))
    assert (answer.status_code, answer.json()) == (422, {"error": "bad_input"})
    assert await state(client, bridge) == (True, generation, 1)


# -- the whole of /memory/v1 answers reason codes --------------------------------------------------


@pytest.mark.parametrize("with_token", [True, False])
@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/memory/v1/nothing", 404, "not_found"),
        ("POST", "/memory/v1", 404, "not_found"),
        ("GET", "/memory/v1/", 404, "not_found"),
        ("GET", "/memory/v1/status/", 404, "not_found"),
        ("DELETE", "/memory/v1/entries/a/b", 404, "not_found"),
        ("GET", "/memory/v1/v2/status", 404, "not_found"),
        ("GET", "/memory/v1/off", 405, "method_not_allowed"),
        ("POST", "/memory/v1/status", 405, "method_not_allowed"),
        ("PUT", f"/memory/v1/entries/{uuid.UUID(int=1)}", 405, "method_not_allowed"),
        ("DELETE", "/memory/v1/entries", 405, "method_not_allowed"),
        ("PATCH", "/memory/v1/consent", 405, "method_not_allowed"),
    ],
)
async def test_unknown_routes_and_wrong_methods_answer_a_reason_code(
    client: httpx.AsyncClient, bridge: Bridge, method: str, path: str, status: int, code: str, with_token: bool
) -> None:
    headers = auth(bridge, "status") if with_token else {}
    answer = await client.request(method, path, headers=headers)
    assert (answer.status_code, answer.json()) == (status, {"error": code})
    if status == 405:
        assert answer.headers["allow"] in {"GET", "POST", "DELETE"}


async def test_routes_outside_memory_v1_keep_the_apps_own_answers(client: httpx.AsyncClient) -> None:
    answer = await client.get("/not-memory")
    assert (answer.status_code, answer.json()) == (404, {"detail": "Not Found"})
