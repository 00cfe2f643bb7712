"""No cross-room, cross-user, cross-origin or cross-agent reuse (R1-R3, R28); inspect pages are bounded (R11)."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy
import pytest
from freezegun import freeze_time
from support import facts, make_key, refusal

from kagent_memory_governed.errors import Reason
from kagent_memory_governed.policy import admit_embedding
from kagent_memory_governed.scope import Origin, ScopeKey
from kagent_memory_governed.store import Store, entry_format, ranking
from kagent_memory_governed.testing import embed

SECRET = "alice keeps her spare key under the blue flowerpot"


@pytest.fixture
async def consented(store: Store) -> tuple[ScopeKey, int]:
    key = make_key(room="!control:example.org")
    grant = await store.grant(key, purpose="assist", policy_version="v1")
    await store.write(key, grant.generation, facts(SECRET))
    return key, grant.generation


@pytest.mark.parametrize(
    "neighbour",
    [
        make_key(origin=Origin.APPSERVICE, room="!control:example.org"),  # same MXID, bridged origin
        make_key("bob", room="!control:example.org"),  # another user in the same room
        make_key(room="!other:example.org"),  # same user, another room
        make_key(agent="kagent/planner", room="!control:example.org"),  # same user and room, another agent
        make_key(room="!control:other.example"),  # a room id from another server
    ],
    ids=["origin", "user", "room", "agent", "server"],
)
async def test_a_neighbouring_scope_sees_nothing(
    store: Store, consented: tuple[ScopeKey, int], neighbour: ScopeKey
) -> None:
    key, generation = consented
    assert await refusal(store.search(neighbour, generation, embed(SECRET))) is Reason.CONSENT_MISSING
    assert (await store.inspect(neighbour)).entries == []
    assert (await store.status(neighbour)).entries == 0
    # even with consent of its own under the very same generation number
    grant = await store.grant(neighbour, purpose="assist", policy_version="v1")
    assert grant.generation == generation
    assert await store.search(neighbour, grant.generation, embed(SECRET)) == []
    assert [hit.text for hit in await store.search(key, generation, embed(SECRET))] == [SECRET]


async def test_inspect_pages_through_every_live_entry_once_in_a_stable_order(store: Store, key: ScopeKey) -> None:
    t0 = datetime(2026, 6, 1, tzinfo=UTC)
    with freeze_time(t0, real_asyncio=True) as frozen:
        grant = await store.grant(key, purpose="assist", policy_version="v1")
        written = []
        for n in range(23):
            frozen.tick(timedelta(seconds=1) if n % 4 else timedelta(0))  # some share a created_at
            written += await store.write(key, grant.generation, facts(f"fact {n}"))
        seen, cursor, pages = [], None, 0
        while True:
            page = await store.inspect(key, limit=5, cursor=cursor)
            assert len(page.entries) <= 5
            seen += page.entries
            pages += 1
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
    assert pages == 5
    assert sorted(e.entry_id for e in seen) == sorted(written)
    assert [(e.created_at, e.entry_id) for e in seen] == sorted((e.created_at, e.entry_id) for e in seen)
    assert {e.source_scope for e in seen} == {f"control-room:{key.room.room_id}"}
    assert all(e.expires_at == e.created_at + timedelta(days=7) for e in seen)


async def test_a_cursor_from_another_scope_or_forged_is_refused(store: Store, consented: tuple[ScopeKey, int]) -> None:
    key, generation = consented
    await store.write(key, generation, facts("second"))
    cursor = (await store.inspect(key, limit=1)).next_cursor
    assert cursor is not None
    other = make_key("bob")
    assert await refusal(store.inspect(other, cursor=cursor)) is Reason.BAD_INPUT
    raw = bytearray(base64.urlsafe_b64decode(cursor + "="))
    raw[0] ^= 0xFF
    forgeries: tuple[Any, ...] = (  # an int too: what an untyped caller may send
        base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("="),
        cursor[:-1],
        cursor + "A",
        "!" * 43,
        "",
        42,
    )
    for forged in forgeries:
        assert await refusal(store.inspect(key, cursor=forged)) is Reason.BAD_INPUT


def _batch_of(rows: numpy.ndarray) -> entry_format.Batch:
    ids = sorted(uuid.uuid4() for _ in rows)
    never = [datetime(2030, 1, 1, tzinfo=UTC)] * len(rows)
    admitted = numpy.stack([admit_embedding(row) for row in rows])  # only what a write would store
    return entry_format.Batch(ids, [b"fact"] * len(rows), admitted, never, never)


def _exact(batch: entry_format.Batch, query: numpy.ndarray, top_k: int, max_distance: float) -> list[tuple[int, float]]:
    """The definition: every entry's cosine distance in double precision (each entry's is the same whichever others
    are computed beside it), nearest first, ties by entry id."""
    distances = ranking._distances(query, batch.matrix)
    order = numpy.argsort(distances, kind="stable")[:top_k]
    return [(int(i), float(distances[i])) for i in order if distances[i] <= max_distance]


def _rows(kind: str, rng: numpy.random.Generator) -> numpy.ndarray:
    base = rng.standard_normal(768)
    if kind == "topics":
        return numpy.stack([base + 0.3 * rng.standard_normal(768) for _ in range(100)])
    if kind == "near ties":  # distances a few ulps of single precision apart: its pass alone cannot order them
        return numpy.stack([base + 1e-6 * rng.standard_normal(768) for _ in range(100)])
    if kind == "duplicates":
        return numpy.stack([base if i % 3 else base + rng.standard_normal(768) for i in range(100)])
    # norms at both ends of what admission takes: squares near the least normal float and near its largest
    scales = rng.choice([1e-20, 1e-18, 1e-16, 1.0, 1e16, 5e17], size=100)
    rows = numpy.stack([s * (base + 0.3 * rng.standard_normal(768)) for s in scales])
    rows[rng.integers(100)] = numpy.eye(768)[0] * 1.8e19  # a squared norm near the largest admitted
    return rows


@pytest.mark.parametrize("kind", ["topics", "near ties", "duplicates", "extreme norms"])
def test_ranking_in_the_process_is_exact_cosine_in_double_precision_with_ties_by_entry_id(kind: str) -> None:
    rng = numpy.random.default_rng(29)
    for _ in range(20):
        rows = _rows(kind, rng)
        batch = _batch_of(rows)
        queries = [(rows[rng.integers(100)] + 1e-6 * rng.standard_normal(768)).astype(numpy.float32)]
        scaled = (rng.choice([1e-20, 1e-17, 1.0, 1e16]) * rng.standard_normal(768) for _ in range(7))
        queries += [admit_embedding(query) for query in scaled]
        for top_k, max_distance in ((5, 2.0), (1, 2.0), (100, 2.0), (5, 0.5)):
            ranked = ranking.rank(batch.matrix, queries, top_k=top_k, max_distance=max_distance)
            for query, found in zip(queries, ranked, strict=True):
                expected = _exact(batch, query, top_k, max_distance)
                assert found == expected


async def test_search_returns_the_nearest_entries_above_the_minimum_score(store: Store, key: ScopeKey) -> None:
    grant = await store.grant(key, purpose="assist", policy_version="v1")
    await store.write(key, grant.generation, facts("likes green tea", "deploys on fridays", "lives in lisbon"))
    hits = await store.search(key, grant.generation, embed("green tea"), top_k=2)
    assert hits[0].text == "likes green tea" and len(hits) == 2
    assert hits[0].score >= hits[1].score
    strict = await store.search(key, grant.generation, embed("green tea"), min_score=0.5)
    assert [hit.text for hit in strict] == ["likes green tea"]
