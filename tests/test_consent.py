from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from kagent_memory_governed.consent import Erasure, ScopeState, admit_generation, admit_label, fence, grant_refusal
from kagent_memory_governed.errors import GovernedMemoryError, Reason

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def state(**changes: object) -> ScopeState:
    values = dict(enabled=True, generation=3, consent_expires_at=None, erasure=None, max_expiry_seconds=60, entry_cap=5)
    values.update(changes)
    return ScopeState(**values)


def test_the_current_generation_of_an_enabled_scope_passes_the_fence() -> None:
    assert fence(state(), 3, NOW) is None


@pytest.mark.parametrize(
    ("record", "generation", "reason"),
    [
        (None, 1, Reason.CONSENT_MISSING),
        (state(enabled=False, generation=0), 1, Reason.CONSENT_MISSING),
        (state(enabled=False), 3, Reason.CONSENT_DISABLED),
        (state(consent_expires_at=NOW), 3, Reason.CONSENT_EXPIRED),
        (state(), 2, Reason.CONSENT_STALE),
        (state(), 4, Reason.CONSENT_STALE),
    ],
)
def test_the_fence_refuses_missing_disabled_expired_and_stale_consent(
    record: ScopeState | None, generation: int, reason: Reason
) -> None:
    assert fence(record, generation, NOW) is reason


def test_consent_valid_until_later_passes() -> None:
    assert fence(state(consent_expires_at=NOW + timedelta(microseconds=1)), 3, NOW) is None


def test_an_unfinished_erasure_blocks_a_new_grant() -> None:
    assert grant_refusal(None) is None
    assert grant_refusal(state(erasure=Erasure.VERIFIED)) is None
    assert grant_refusal(state(enabled=False, erasure=Erasure.PENDING)) is Reason.ERASURE_PENDING
    assert grant_refusal(state(enabled=False, erasure=Erasure.FAILED)) is Reason.ERASURE_FAILED


@pytest.mark.parametrize("value", [0, -1, True, "1", 1.0, None])
def test_generations_are_positive_integers(value: object) -> None:
    with pytest.raises(GovernedMemoryError):
        admit_generation(value)


@pytest.mark.parametrize("value", ["", " memory", "x" * 65, "purpose with spaces", "naïve", None, 3])
def test_labels_are_short_identifiers(value: object) -> None:
    with pytest.raises(GovernedMemoryError):
        admit_label(value)
    assert admit_label("personal-assistant") == "personal-assistant"
