"""The application clock. Every expiry and window is computed from it and bound into SQL,
so a frozen clock (freezegun) governs the database too. One exception: whether a single-use control token may
still be spent, and how long its replay record is kept, is decided on the database's clock, the one clock
replicas cannot disagree on (``store/admission.py``)."""

from __future__ import annotations

from datetime import UTC, datetime


def now() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)
