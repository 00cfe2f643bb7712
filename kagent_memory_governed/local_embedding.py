"""A deterministic, offline embedder for the demo and tests: hashed bag of words, 768-d, L2-normalized.

It is not semantic and never used when an Agent configures ``memory.embedding``; it exists so the
lifecycle can be shown and tested with no provider and no network.
"""

from __future__ import annotations

import hashlib
import math
import re

from kagent_memory_governed.policy import EMBEDDING_DIMENSIONS

_WORD = re.compile(r"\w+")


def embed(text: str) -> list[float]:
    """The same text always gives the same unit vector; texts sharing words score closer."""
    vector = [0.0] * EMBEDDING_DIMENSIONS
    for word in _WORD.findall(text.lower()) or [text]:
        digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
        index = int.from_bytes(digest[:4], "big") % EMBEDDING_DIMENSIONS
        vector[index] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector] if any(vector) else [1.0 / math.sqrt(EMBEDDING_DIMENSIONS)] * EMBEDDING_DIMENSIONS
