"""Consent as values, and when an unfinished erasure blocks the subject's own requests.

The fence itself (is work admitted under generation *g* still allowed now?) is the database function
``governed_memory.fence`` (``store/sql/fence.sql``), applied in the statement that does the work: it refuses
a missing scope record (``consent_missing``), a disabled one (``consent_disabled``), one whose consent has
expired (``consent_expired``) and a stale generation (``consent_stale``), in that order.
"""

from __future__ import annotations

import re
from enum import StrEnum

from kagent_memory_governed.errors import GovernedMemoryError, Reason
from kagent_memory_governed.policy import admit_int

_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+-]{0,63}")
MAX_GENERATION = 2**63 - 1  # PostgreSQL's bigint: a larger value must never reach a statement


class Erasure(StrEnum):
    """Where a scope's last erasure stands. ``pending`` and ``failed`` keep the scope disabled (R9)."""

    PENDING = "pending"
    VERIFIED = "verified"
    FAILED = "failed"


def admit_generation(generation: object) -> int:
    """A consent generation is an integer from 1 to ``MAX_GENERATION``; anything else is ``bad_input``."""
    return admit_int(generation, low=1, high=MAX_GENERATION)


def admit_label(value: object) -> str:
    """A purpose or policy version: a short identifier-like label (1-64 ASCII characters), else ``bad_input``."""
    if not isinstance(value, str) or _LABEL.fullmatch(value) is None:
        raise GovernedMemoryError(Reason.BAD_INPUT)
    return value


def grant_refusal(erasure: Erasure | None) -> Reason | None:
    """Why consent cannot be granted, one entry forgotten, nor the entries inspected, while the scope's last
    erasure stands at ``erasure`` (``None``: none, or no scope record): an unfinished erasure must be completed
    first (R9)."""
    if erasure is Erasure.PENDING:
        return Reason.ERASURE_PENDING
    if erasure is Erasure.FAILED:
        return Reason.ERASURE_FAILED
    return None
