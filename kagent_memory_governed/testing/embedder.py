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
import socket
import threading
from collections.abc import Callable, Sequence
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
    """``POST /v1/embeddings`` of the OpenAI API, answered with the server's ``vector`` of each input (``dimensions``
    ignored)."""

    protocol_version = "HTTP/1.1"
    server: EmbeddingServer

    def setup(self) -> None:
        super().setup()
        # the status line and headers, then the body: two writes, which Nagle's algorithm would hold for the
        # client's delayed acknowledgement (40 ms a request on Linux), as no real provider's server does
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:  # noqa: N802  # http.server's name
        size = int(self.headers.get("content-length") or 0)
        try:
            body = json.loads(self.rfile.read(size))
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            batch = self.server.batch
            vectors = batch(texts) if batch is not None else [self.server.vector(text) for text in texts]
            data = [{"object": "embedding", "index": i, "embedding": list(v)} for i, v in enumerate(vectors)]
            answer: dict[str, object] = {"object": "list", "model": body.get("model", ""), "data": data}
            status = 200 if self.path.rstrip("/").endswith("/embeddings") else 404
        except (ValueError, KeyError, TypeError):
            answer, status = {"error": {"message": "bad request"}}, 400
        except Exception:  # the embedder behind it failed: a provider's 500
            answer, status = {"error": {"message": "embedding failed"}}, 500
        raw = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002  # http.server's name
        pass  # what a request carries is never printed


class EmbeddingServer(ThreadingHTTPServer):
    """An OpenAI-compatible embeddings server on loopback answering ``vector(text)`` (default: ``embed``); its base
    URL is ``url``. ``serve_forever`` serves it (on a thread, or a process of its own: a benchmark's)."""

    daemon_threads = True

    def __init__(self, vector: Callable[[str], list[float]] = embed, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Embeddings)
        self.vector = vector
        # answers a whole request instead of ``vector``, when set: a test's own embedder (``CountingEmbedder``)
        self.batch: Callable[[list[str]], Sequence[Sequence[float]]] | None = None
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a caller that went away (its timeout, its process stopped) is no error of the provider's


_served: list[EmbeddingServer] = []


def embedding_server() -> EmbeddingServer:
    """This process's ``EmbeddingServer`` answering ``embed``, started on first use on a daemon thread: the memory
    service's embedding provider in tests (the deterministic embedder, over the real HTTP wire)."""
    if not _served:
        server = EmbeddingServer()
        threading.Thread(target=server.serve_forever, name="embeddings", daemon=True).start()
        _served.append(server)
    return _served[0]


def openai_compatible_url() -> str:
    """The base URL (``http://127.0.0.1:<port>/v1``) of ``embedding_server``."""
    return embedding_server().url
