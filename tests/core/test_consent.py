from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from kagent_memory_governed.consent import Erasure, admit_generation, admit_label, grant_refusal
from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.store import Store

NOW = datetime(2026, 1, 1, tzinfo=UTC)


# The fence is the database function every hot-path statement applies (store/sql/fence.sql); here on its own.
FENCE = (
    "SELECT governed_memory.fence(s, $2, $3) FROM jsonb_populate_record(NULL::governed_memory.scopes, $1::jsonb) AS s"
)


@pytest.fixture
def fenced(store: Store, sql: asyncpg.Connection) -> asyncpg.Connection:
    """A connection to the migrated test database (``store`` migrates it)."""
    return sql


async def _fence(
    sql: asyncpg.Connection, record: dict[str, Any] | None, generation: int, now: datetime = NOW
) -> Reason | None:
    if record is None:
        missing = "SELECT governed_memory.fence(NULL::governed_memory.scopes, $1, $2)"
        refusal = await sql.fetchval(missing, generation, now)
    else:
        row = {"scope_id": str(uuid.uuid4()), "enabled": True, "generation": 3, "consent_expires_at": None} | record
        refusal = await sql.fetchval(FENCE, json.dumps(row, default=str), generation, now)
    return Reason(refusal) if refusal is not None else None


async def test_the_current_generation_of_an_enabled_scope_passes_the_fence(fenced: asyncpg.Connection) -> None:
    assert await _fence(fenced, {}, 3) is None


@pytest.mark.parametrize(
    ("record", "generation", "reason"),
    [
        (None, 1, Reason.CONSENT_MISSING),
        ({"enabled": False, "generation": 0}, 1, Reason.CONSENT_MISSING),
        ({"enabled": False}, 3, Reason.CONSENT_DISABLED),
        ({"enabled": False, "consent_expires_at": NOW}, 2, Reason.CONSENT_DISABLED),  # the first reason wins
        ({"consent_expires_at": NOW}, 3, Reason.CONSENT_EXPIRED),
        ({"consent_expires_at": NOW}, 2, Reason.CONSENT_EXPIRED),
        ({}, 2, Reason.CONSENT_STALE),
        ({}, 4, Reason.CONSENT_STALE),
    ],
)
async def test_the_fence_refuses_missing_disabled_expired_and_stale_consent(
    fenced: asyncpg.Connection, record: dict[str, Any] | None, generation: int, reason: Reason
) -> None:
    assert await _fence(fenced, record, generation) is reason


async def test_consent_valid_until_later_passes(fenced: asyncpg.Connection) -> None:
    assert await _fence(fenced, {"consent_expires_at": NOW + timedelta(microseconds=1)}, 3) is None


def test_an_unfinished_erasure_blocks_a_new_grant() -> None:
    assert grant_refusal(None) is None
    assert grant_refusal(Erasure.VERIFIED) is None
    assert grant_refusal(Erasure.PENDING) is Reason.ERASURE_PENDING
    assert grant_refusal(Erasure.FAILED) is Reason.ERASURE_FAILED


@pytest.mark.parametrize("value", [0, -1, True, "1", 1.0, None])
def test_generations_are_positive_integers(value: object) -> None:
    with pytest.raises(GovernedMemoryError):
        admit_generation(value)


@pytest.mark.parametrize("value", ["", " memory", "x" * 65, "purpose with spaces", "naïve", None, 3])
def test_labels_are_short_identifiers(value: object) -> None:
    with pytest.raises(GovernedMemoryError):
        admit_label(value)
    assert admit_label("personal-assistant") == "personal-assistant"
