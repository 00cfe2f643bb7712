"""Moved: the entry format to ``store/entry_format.py``, the ranking to ``store/ranking.py``, the kept keyrings to
``store/keyrings.py``. These names stay here only until their last importers import those; then this goes."""

from __future__ import annotations

from kagent_memory_governed.store.entry_format import Row, new_key, open_entries, seal
from kagent_memory_governed.store.keyrings import Keyrings

__all__ = ["Keyrings", "Row", "new_key", "open_entries", "seal"]
