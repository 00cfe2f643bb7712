"""The control API: every call of CONTRACT.md, each refusal, and scope taken from the token only (R10-R14, R29)."""

from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from agent import ScriptedModel, build_app
from bridge import HOMESERVER, Bridge, compact
from conftest import facts
from freezegun import freeze_time

from kagent_memory_governed import clock, control
from kagent_memory_governed.assertion import verify
from kagent_memory_governed.errors import GovernedMemoryError
from kagent_memory_governed.scope import AgentId, ControlRoom, Principal, ScopeKey
from kagent_memory_governed.store import Store

ALICE, BOB = f"@alice:{HOMESERVER}", f"@bob:{HOMESERVER}"
ROOM = f"!control:{HOMESERVER}"


@pytest.fixture
async def client(runtime, store: Store, bridge: Bridge) -> AsyncIterator[httpx.AsyncClient]:
    """Upstream's real KAgentApp, built with governed memory installed, over ASGI."""
    app = build_app(ScriptedModel())
    control.mount(app, store, bridge.trust())  # already mounted by activation: idempotent
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
        yield http


def auth(bridge: Bridge, purpose: str = "control", **claims) -> dict[str, str]:
    return {"Authorization": f"Bearer {bridge.sign(time.time(), purpose, **claims)}"}


async def consent(client: httpx.AsyncClient, bridge: Bridge, **claims) -> int:
    answer = await client.post(
        "/memory/v1/consent", json={"purpose": "assist", "policy_version": "v1"}, headers=auth(bridge, **claims)
    )
    assert answer.status_code == 200, answer.text
    return answer.json()["generation"]


async def remember(store: Store, bridge: Bridge, generation: int, *texts: str, **claims) -> list[uuid.UUID]:
    key = verify(
        bridge.sign(time.time(), **claims), bridge.trust(), now=clock.now(), user_id=claims.get("sub", ALICE)
    ).key
    return await store.write(key, generation, facts(*texts))


async def test_consent_status_inspect_forget_off_and_offboard(client, store: Store, bridge: Bridge):
    answer = await client.post(
        "/memory/v1/consent", json={"purpose": "assist", "policy_version": "v1"}, headers=auth(bridge)
    )
    assert answer.json() == {"enabled": True, "generation": 1, "max_expiry_seconds": 604800, "entry_cap": 100}
    ids = await remember(store, bridge, 1, "likes tea", "lives in Lisbon", "deploys on Fridays")

    status = (await client.get("/memory/v1/status", headers=auth(bridge))).json()
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

    page = (await client.get("/memory/v1/entries?limit=2", headers=auth(bridge))).json()
    assert len(page["entries"]) == 2 and page["next_cursor"]
    rest = (await client.get(f"/memory/v1/entries?cursor={page['next_cursor']}", headers=auth(bridge))).json()
    listed = page["entries"] + rest["entries"]
    assert rest["next_cursor"] is None
    assert {e["id"] for e in listed} == {str(i) for i in ids}
    first = listed[0]
    assert set(first) == {"id", "text", "source_scope", "created_at", "expires_at"}
    assert first["source_scope"] == f"control-room:{ROOM}" and first["created_at"].endswith("Z")

    deleted = await client.delete(f"/memory/v1/entries/{first['id']}", headers=auth(bridge))
    assert deleted.json() == {"deleted": True, "verified": True, "generation": 2}
    remaining = (await client.get("/memory/v1/entries", headers=auth(bridge))).json()["entries"]
    assert {e["id"] for e in remaining} == {e["id"] for e in listed[1:]}

    forgot = await client.post("/memory/v1/forget-all", json={"confirm": True}, headers=auth(bridge))
    assert forgot.json() == {"erased": 2, "verified": True, "generation": 3}
    await remember(store, bridge, 3, "a new fact")
    off = await client.post("/memory/v1/off", json={"confirm": True}, headers=auth(bridge))
    assert off.json() == {"enabled": False, "generation": 4, "erased": 1, "verified": True}
    status = (await client.get("/memory/v1/status", headers=auth(bridge))).json()
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
async def test_missing_or_malformed_tokens_are_401(client, headers: dict, code: str):
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
    client, bridge: Bridge, purpose: str, claims: dict, status: int, code: str
):
    answer = await client.get("/memory/v1/status", headers=auth(bridge, purpose, **claims))
    assert (answer.status_code, answer.json()) == (status, {"error": code})


async def test_another_key_cannot_sign(client):
    answer = await client.get("/memory/v1/status", headers=auth(Bridge()))
    assert (answer.status_code, answer.json()) == (401, {"error": "bad_assertion"})


async def test_another_subjects_entry_is_not_found_and_survives(client, store: Store, bridge: Bridge):
    generation = await consent(client, bridge, sub=BOB)
    [bobs] = await remember(store, bridge, generation, "bob's secret", sub=BOB)
    await consent(client, bridge)
    answer = await client.delete(f"/memory/v1/entries/{bobs}", headers=auth(bridge))
    assert (answer.status_code, answer.json()) == (404, {"error": "not_found"})
    bob_view = (await client.get("/memory/v1/entries", headers=auth(bridge, sub=BOB))).json()
    assert [e["id"] for e in bob_view["entries"]] == [str(bobs)]
    alice_view = (await client.get("/memory/v1/entries", headers=auth(bridge))).json()
    assert alice_view["entries"] == []


async def test_a_destructive_token_is_accepted_once(client, store: Store, bridge: Bridge):
    await consent(client, bridge)
    headers = auth(bridge)
    first = await client.post("/memory/v1/forget-all", json={"confirm": True}, headers=headers)
    again = await client.post("/memory/v1/forget-all", json={"confirm": True}, headers=headers)
    assert first.status_code == 200
    assert (again.status_code, again.json()) == (401, {"error": "assertion_replayed"})


@pytest.mark.parametrize("path", ["/memory/v1/forget-all", "/memory/v1/off"])
@pytest.mark.parametrize("body", [{}, {"confirm": False}, {"confirm": "true"}, {"confirm": 1}])
async def test_missing_confirmation_is_422_and_nothing_changes(client, store: Store, bridge: Bridge, path, body):
    generation = await consent(client, bridge)
    await remember(store, bridge, generation, "keep me")
    answer = await client.post(path, json=body, headers=auth(bridge))
    assert (answer.status_code, answer.json()) == (422, {"error": "confirmation_required"})
    status = (await client.get("/memory/v1/status", headers=auth(bridge))).json()
    assert (status["enabled"], status["entries"], status["generation"]) == (True, 1, generation)


async def test_offboard_requires_confirmation(client, bridge: Bridge):
    answer = await client.post("/memory/v1/offboard", json={}, headers=auth(bridge, "offboard"))
    assert (answer.status_code, answer.json()) == (422, {"error": "confirmation_required"})


@pytest.mark.parametrize(
    "query",
    ["limit=51", "limit=0", "limit=-1", "limit=abc", "limit=1&limit=2", "cursor=forged", "limit=5&scope=other"],
)
async def test_bad_page_queries_are_422(client, bridge: Bridge, query: str):
    await consent(client, bridge)
    answer = await client.get(f"/memory/v1/entries?{query}", headers=auth(bridge))
    assert (answer.status_code, answer.json()) == (422, {"error": "bad_input"})


async def test_a_cursor_from_another_scope_is_refused(client, store: Store, bridge: Bridge):
    generation = await consent(client, bridge, sub=BOB)
    await remember(store, bridge, generation, "one", "two", sub=BOB)
    cursor = (await client.get("/memory/v1/entries?limit=1", headers=auth(bridge, sub=BOB))).json()["next_cursor"]
    answer = await client.get(f"/memory/v1/entries?cursor={cursor}", headers=auth(bridge))
    assert (answer.status_code, answer.json()) == (422, {"error": "bad_input"})


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[]", b'{"purpose": "assist"}', b'{"purpose": "a b", "policy_version": "v1"}', b"{" * 600],
)
async def test_bad_consent_bodies_are_422(client, bridge: Bridge, body: bytes):
    answer = await client.post("/memory/v1/consent", content=body, headers=auth(bridge))
    assert (answer.status_code, answer.json()) == (422, {"error": "bad_input"})


async def test_entries_hide_what_has_expired(client, store: Store, bridge: Bridge):
    generation = await consent(client, bridge)
    await remember(store, bridge, generation, "soon gone")
    with freeze_time(clock.now() + timedelta(days=7), real_asyncio=True):
        token = auth(bridge)  # signed at the frozen now
        listed = (await client.get("/memory/v1/entries", headers=token)).json()
        assert listed == {"entries": [], "next_cursor": None}


async def test_a_malformed_entry_id_is_422(client, bridge: Bridge):
    answer = await client.delete("/memory/v1/entries/not-a-uuid", headers=auth(bridge))
    assert (answer.status_code, answer.json()) == (422, {"error": "bad_input"})


async def test_the_routes_are_documented_in_the_openapi_schema(client):
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


@pytest.mark.parametrize("alg", ["none", "HS256"])
async def test_another_algorithm_is_refused(client, bridge: Bridge, alg: str):
    claims = bridge.claims(time.time(), "control")
    secret = bridge.public_pem.encode()
    signer = (lambda data: b"") if alg == "none" else (lambda data: hmac.digest(secret, data, "sha256"))
    token = compact({"alg": alg}, claims, signer)
    answer = await client.get("/memory/v1/status", headers={"Authorization": f"Bearer {token}"})
    assert (answer.status_code, answer.json()) == (401, {"error": "bad_assertion"})


async def test_saves_racing_an_off_call_never_land_afterwards(client, store: Store, bridge: Bridge, sql):
    generation = await consent(client, bridge)
    key = verify(bridge.sign(time.time(), gen=generation), bridge.trust(), now=clock.now(), user_id=ALICE).key

    async def save(n: int) -> None:
        try:
            await store.write(key, generation, facts(f"racing fact {n}"))
        except GovernedMemoryError:
            pass

    async def off() -> httpx.Response:
        return await client.post("/memory/v1/off", json={"confirm": True}, headers=auth(bridge))

    results = await asyncio.gather(*(save(n) for n in range(10)), off(), *(save(n) for n in range(10, 20)))
    assert results[10].json()["verified"] is True
    assert await sql.fetchval("SELECT count(*) FROM governed_memory.entries") == 0
    await save(99)
    assert await sql.fetchval("SELECT count(*) FROM governed_memory.entries") == 0


async def test_offboard_covers_every_agent_sharing_the_database(client, store: Store, bridge: Bridge):
    await consent(client, bridge)
    other_agent = ScopeKey(
        Principal.parse(ALICE, "native"), AgentId.parse("team-b/planner"), ControlRoom.parse(f"!planner:{HOMESERVER}")
    )
    grant = await store.grant(other_agent, purpose="assist", policy_version="v1")
    await store.write(other_agent, grant.generation, facts("planner fact"))
    answer = await client.post("/memory/v1/offboard", json={"confirm": True}, headers=auth(bridge, "offboard"))
    assert answer.json() == {"scopes": 2, "erased": 1, "verified": True}
    assert (await store.status(other_agent)).enabled is False
