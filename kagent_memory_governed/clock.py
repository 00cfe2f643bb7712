"""The application clock. Every expiry and window is computed from it and bound into SQL,
so a frozen clock (freezegun) governs the database too; the server's ``now()`` is never used."""

from __future__ import annotations

from datetime import UTC, datetime


def now() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)
