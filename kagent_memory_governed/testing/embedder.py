"""A deterministic, offline embedder for the demo and tests: hashed bag of words, 768-d, L2-normalized.

It is not semantic and never used when an Agent configures ``memory.embedding``; it exists so the
lifecycle can be shown and tested with no provider and no network. ``openai_compatible_url`` serves it as the
memory service's embedding provider, on loopback.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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


class _Embeddings(BaseHTTPRequestHandler):
    """``POST /v1/embeddings`` of the OpenAI API, answered with ``embed`` of each input (``dimensions`` ignored)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802  # http.server's name
        size = int(self.headers.get("content-length") or 0)
        try:
            body = json.loads(self.rfile.read(size))
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            answer: dict[str, object] = {
                "object": "list",
                "model": body.get("model", ""),
                "data": [{"object": "embedding", "index": i, "embedding": embed(t)} for i, t in enumerate(texts)],
            }
            status = 200 if self.path.rstrip("/").endswith("/embeddings") else 404
        except (ValueError, KeyError, TypeError):
            answer, status = {"error": {"message": "bad request"}}, 400
        raw = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002  # http.server's name
        pass  # what a request carries is never printed


_served: list[str] = []


def openai_compatible_url() -> str:
    """The base URL (``http://127.0.0.1:<port>/v1``) of an OpenAI-compatible embeddings server answering ``embed``
    on loopback, started once per process on a daemon thread: the memory service's embedding provider in tests and
    benchmarks (the deterministic embedder, over the real HTTP wire)."""
    if not _served:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Embeddings)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="embeddings", daemon=True).start()
        _served.append(f"http://127.0.0.1:{server.server_address[1]}/v1")
    return _served[0]
