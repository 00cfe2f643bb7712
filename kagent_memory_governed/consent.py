"""Consent as values, and the fence: is work admitted under generation *g* still allowed now?

Pure functions; the store applies them inside the transaction that reads the scope record.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
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


@dataclass(frozen=True, slots=True)
class ScopeState:
    """The durable scope record as the fence sees it."""

    enabled: bool
    generation: int
    consent_expires_at: datetime | None
    erasure: Erasure | None
    max_expiry_seconds: int
    entry_cap: int

    @property
    def interrupted(self) -> bool:
        """An erasure began and has not been verified: the scope may not resume on an assumption."""
        return self.erasure in (Erasure.PENDING, Erasure.FAILED)


def admit_generation(generation: object) -> int:
    """A consent generation is an integer from 1 to ``MAX_GENERATION``; anything else is ``bad_input``."""
    return admit_int(generation, low=1, high=MAX_GENERATION)


def admit_label(value: object) -> str:
    """A purpose or policy version: a short identifier-like label (1-64 ASCII characters), else ``bad_input``."""
    if not isinstance(value, str) or _LABEL.fullmatch(value) is None:
        raise GovernedMemoryError(Reason.BAD_INPUT)
    return value


def fence(state: ScopeState | None, generation: int, now: datetime) -> Reason | None:
    """Why work admitted under ``generation`` is refused now, or ``None`` if it may proceed.

    Refuses a missing scope record, a disabled one, one whose consent has expired, and a stale generation.
    """
    if state is None or state.generation == 0:
        return Reason.CONSENT_MISSING
    if not state.enabled:
        return Reason.CONSENT_DISABLED
    if state.consent_expires_at is not None and state.consent_expires_at <= now:
        return Reason.CONSENT_EXPIRED
    if generation != state.generation:
        return Reason.CONSENT_STALE
    return None


def grant_refusal(state: ScopeState | None) -> Reason | None:
    """Why consent cannot be granted, one entry forgotten, nor the entries inspected, now: an interrupted
    erasure must be completed first (R9)."""
    if state is None:
        return None
    if state.erasure is Erasure.PENDING:
        return Reason.ERASURE_PENDING
    if state.erasure is Erasure.FAILED:
        return Reason.ERASURE_FAILED
    return None
