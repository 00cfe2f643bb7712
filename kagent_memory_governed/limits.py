"""Limits the store enforces and the control API's contract states, held where both clients can read them: no
imports, so the bridge's client and the contract need nothing of the store for them."""

from __future__ import annotations

MAX_PAGE = 50  # the most entries one ``inspect`` page holds (``GET /memory/v1/entries``' ``limit``)

__all__ = ["MAX_PAGE"]
