"""A deterministic, offline embedder for the demo and tests: hashed bag of words, 768-d, L2-normalized.

It is not semantic and never used when an Agent configures ``memory.embedding``; it exists so the
lifecycle can be shown and tested with no provider and no network.
"""

from __future__ import annotations

import asyncio
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


async def local_embedder(texts: list[str]) -> list[list[float]]:
    """``embed`` as the runtime's embedder (a batch in, a batch out)."""
    return [embed(text) for text in texts]


class CountingEmbedder:
    """The deterministic local embedder, counting calls and items."""

    def __init__(self) -> None:
        self.calls = 0
        self.items = 0
        self.fail_with: str | None = None
        self.gate: asyncio.Event | None = None
        self.embedding = asyncio.Event()  # set on every call
        self.batches: list[list[str]] = []

    async def __call__(self, texts: list[str]) -> list[list[float]]:
        self.calls += 1
        self.items += len(texts)
        self.batches.append(list(texts))
        self.embedding.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_with is not None:
            raise RuntimeError(self.fail_with)
        return [embed(text) for text in texts]
