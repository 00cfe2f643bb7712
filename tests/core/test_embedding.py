"""The memory service's embedder (R46) against real HTTP servers on loopback: the OpenAI wire, kagent's vector
post-processing, bounded calls, and every failure a content-free cause, never a text of the input or the answer."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from gzip import compress
from pathlib import Path

import numpy
import pytest

from kagent_memory_governed.embedding import Embedders, EmbeddingModel, OpenAIEmbedder, fit, load_table
from kagent_memory_governed.errors import Cause, ConfigurationError, GovernedMemoryError, Reason
from kagent_memory_governed.testing import embed, openai_compatible_url

SENTINEL = "okapi-sentinel-41d2 the user's locker code is 7781"
Answer = Callable[[dict[str, object], dict[str, str]], Awaitable[tuple[int, bytes]]]


@asynccontextmanager
async def provider(
    answer: Answer, *, gzip: bool = False, drip: float = 0.0
) -> AsyncIterator[tuple[str, list[tuple[dict[str, object], dict[str, str]]]]]:
    """An HTTP/1.1 server on loopback answering each request with ``answer(body, headers)`` (gzip-encoded if asked);
    the requests it saw."""
    seen: list[tuple[dict[str, object], dict[str, str]]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
        body = json.loads(await reader.readexactly(int(headers.get("content-length", "0"))))
        seen.append((body, headers))
        status, raw = await answer(body, headers)
        encoding = b"content-encoding: gzip\r\n" if gzip else b""
        raw = compress(raw) if gzip else raw
        writer.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (status, len(raw)))
        writer.write(encoding)
        if drip:  # the status line, then the body a piece at a time, each piece before any read times out
            writer.write(b"connection: close\r\n\r\n")
            for start in range(0, len(raw), 128):
                await writer.drain()
                await asyncio.sleep(drip)
                writer.write(raw[start : start + 128])
            await writer.drain()
            writer.close()
            return
        writer.write(b"connection: close\r\n\r\n" + raw)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", seen
    finally:
        server.close()


def vectors(body: dict[str, object], width: int = 768) -> bytes:
    texts = body["input"]
    assert isinstance(texts, list)
    data = [{"index": i, "embedding": [1.0] * width} for i in range(len(texts))]
    return json.dumps({"data": data[::-1]}).encode()  # out of order: the index orders them


async def failure(work: Awaitable[object]) -> GovernedMemoryError:
    with pytest.raises(GovernedMemoryError) as refused:
        await work
    assert refused.value.reason is Reason.EMBEDDING_FAILED
    return refused.value


async def test_the_openai_wire_answers_the_deterministic_embedder_in_order() -> None:
    async def answer(body: dict[str, object], headers: dict[str, str]) -> tuple[int, bytes]:
        texts = body["input"]
        assert isinstance(texts, list)
        return 200, json.dumps({"data": [{"index": i, "embedding": embed(t)} for i, t in enumerate(texts)]}).encode()

    texts = ["likes green tea", "lives in Lisbon", "plays the cello"]
    async with provider(answer) as (url, seen):
        embedder = OpenAIEmbedder(EmbeddingModel(url=url, model="local-hash-768", max_batch=2, dimensions=None))
        answered = await embedder(texts)
        await embedder.aclose()
    assert [body["input"] for body, _ in seen] == [texts[:2], texts[2:]]  # a batch is at most 2
    assert all("dimensions" not in body for body, _ in seen)  # null: not sent, for models that refuse it
    assert [vector.tolist() for vector in answered] == [pytest.approx(embed(text), abs=1e-6) for text in texts]
    served = OpenAIEmbedder(EmbeddingModel(url=openai_compatible_url(), model="local-hash-768"))
    assert [v.tolist() for v in await served(texts)] == [pytest.approx(embed(t), abs=1e-6) for t in texts]
    await served.aclose()


async def test_a_compressed_answer_is_read_decoded_and_bounded_as_decoded() -> None:
    async def answer(body: dict[str, object], headers: dict[str, str]) -> tuple[int, bytes]:
        return 200, vectors(body)

    async with provider(answer, gzip=True) as (url, seen):
        embedder = OpenAIEmbedder(EmbeddingModel(url=url, model="m"))
        small = OpenAIEmbedder(EmbeddingModel(url=url, model="m", max_answer_bytes=8192))
        try:
            [vector] = await embedder(["one"])
            three = ["one", "two", "three"]  # 3 x 768 floats: 11.6 KB decoded, a few hundred bytes compressed
            assert (await failure(small(three))).cause is Cause.ANSWER_TOO_LARGE
        finally:
            await embedder.aclose()
            await small.aclose()
    assert vector.shape == (768,) and len(vectors(seen[1][0])) > 8192


async def test_the_request_names_the_model_the_dimensions_and_the_key_read_for_each_call(tmp_path: Path) -> None:
    async def answer(body: dict[str, object], headers: dict[str, str]) -> tuple[int, bytes]:
        return 200, vectors(body)

    key = tmp_path / "key"
    async with provider(answer) as (url, seen):
        embedder = OpenAIEmbedder(EmbeddingModel(url=url, model="text-embedding-3-small", credential_file=key))
        key.write_text("sk-first\n")
        await embedder(["one"])
        key.write_text("sk-rotated\n")
        await embedder(["two"])
        key.unlink()
        assert (await failure(embedder(["three"]))).cause is Cause.CREDENTIAL_UNREADABLE
        await embedder.aclose()
    assert [body for body, _ in seen] == [
        {"model": "text-embedding-3-small", "input": [text], "encoding_format": "float", "dimensions": 768}
        for text in ("one", "two")
    ]
    assert [headers["authorization"] for _, headers in seen] == ["Bearer sk-first", "Bearer sk-rotated"]


def test_vectors_are_fitted_as_kagent_fits_them() -> None:
    exact = [0.5] * 768
    assert fit([exact], 1)[0].tolist() == exact  # 768 as it is, not renormalized (kagent leaves it)
    [wider] = fit([[3.0] * 1024], 1)
    assert wider.shape == (768,) and math.isclose(float(numpy.linalg.norm(wider)), 1.0, abs_tol=1e-6)
    cases: list[tuple[list[object], Cause]] = [
        ([[1.0] * 767], Cause.WRONG_DIMENSIONS),
        ([exact, exact], Cause.WRONG_COUNT),
        ([["x"] * 768], Cause.BAD_ANSWER),
        ([[True] * 768], Cause.BAD_ANSWER),
        ([[float("nan")] * 768], Cause.BAD_ANSWER),
        ([[[1.0] * 768]], Cause.BAD_ANSWER),
        (["a text"], Cause.BAD_ANSWER),
        ([[[1.0], 2.0] + [1.0] * 766], Cause.BAD_ANSWER),  # ragged
        ([[0.0] * 768], Cause.BAD_ANSWER),  # no direction: the store could rank nothing by it
        ([[1e39] * 768], Cause.BAD_ANSWER),  # past single precision
    ]
    for bad, cause in cases:
        with pytest.raises(GovernedMemoryError) as refused:
            fit(bad, 1)
        assert (refused.value.reason, refused.value.cause) == (Reason.EMBEDDING_FAILED, cause)


@pytest.mark.parametrize(
    ("status", "raw", "cause"),
    [
        (500, json.dumps({"error": f"overloaded while embedding {SENTINEL}"}).encode(), Cause.STATUS_500),
        (400, json.dumps({"error": {"message": f"bad input: {SENTINEL}"}}).encode(), Cause.STATUS_400),
        (401, SENTINEL.encode(), Cause.PERMISSION_DENIED),
        (429, SENTINEL.encode(), Cause.RESOURCE_EXHAUSTED),
        (200, b"<html>" + SENTINEL.encode(), Cause.BAD_ANSWER),
        (200, json.dumps({"data": [{"embedding": SENTINEL}]}).encode(), Cause.BAD_ANSWER),
        (200, json.dumps({"data": []}).encode(), Cause.WRONG_COUNT),
        (200, json.dumps({"data": [{"index": 0, "embedding": [1.0] * 512}]}).encode(), Cause.WRONG_DIMENSIONS),
        (200, json.dumps({"data": [{"index": 1, "embedding": [1.0] * 768}]}).encode(), Cause.BAD_ANSWER),
        (200, b" " * 5000, Cause.ANSWER_TOO_LARGE),
    ],
)
async def test_a_failing_provider_is_embedding_failed_with_a_cause_and_none_of_its_text(
    status: int, raw: bytes, cause: Cause, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    async def answer(body: dict[str, object], headers: dict[str, str]) -> tuple[int, bytes]:
        return status, raw

    async with provider(answer) as (url, seen):
        embedder = OpenAIEmbedder(EmbeddingModel(url=url, model="m", max_answer_bytes=4096))
        refused = await failure(embedder([SENTINEL]))
        await embedder.aclose()
    assert seen and refused.cause is cause
    shown = f"{refused} {refused!r} {refused.explained()} {caplog.text}"
    assert "okapi" not in shown and "7781" not in shown


async def test_a_provider_down_or_slow_is_unreachable_or_a_timeout() -> None:
    async def slow(body: dict[str, object], headers: dict[str, str]) -> tuple[int, bytes]:
        await asyncio.sleep(5)  # past the embedder's bound: the call is abandoned, not waited for
        return 200, vectors(body)

    async def dripping(body: dict[str, object], headers: dict[str, str]) -> tuple[int, bytes]:
        return 200, vectors(body)

    async with provider(slow) as (url, _):
        embedder = OpenAIEmbedder(EmbeddingModel(url=url, model="m", timeout_seconds=0.3))
        assert (await failure(embedder(["x"]))).cause is Cause.TIMEOUT
        await embedder.aclose()
    async with provider(dripping, drip=0.05) as (drip_url, _):  # every byte on time, the whole too late
        embedder = OpenAIEmbedder(EmbeddingModel(url=drip_url, model="m", timeout_seconds=0.5))
        assert (await failure(embedder(["x"]))).cause is Cause.TIMEOUT
        await embedder.aclose()
    down = OpenAIEmbedder(EmbeddingModel(url=url, model="m"))  # the server is closed now
    assert (await failure(down(["x"]))).cause is Cause.UNREACHABLE
    await down.aclose()


def test_the_services_table_names_a_model_per_agent_and_refuses_without_quoting(tmp_path: Path) -> None:
    path = tmp_path / "embeddings.json"
    path.write_text(
        json.dumps(
            {
                "*": {"url": "http://127.0.0.1:1/v1", "model": "default-model"},
                "kagent/helper": {"url": "https://embed.example/v1", "model": "own", "dimensions": None},
            }
        )
    )
    table = load_table(path)
    assert table["kagent/helper"].model == "own" and table["kagent/helper"].dimensions is None
    embedders = Embedders(table)
    helper, other = embedders.for_agent("kagent/helper"), embedders.for_agent("kagent/other")
    assert helper is not None and other is not None and helper.model.model == "own"
    assert other.model.model == "default-model" and Embedders({}).for_agent("kagent/helper") is None
    for text, named in [
        ("{", "not JSON"),
        ("[]", "a JSON object"),
        (json.dumps({"kagent/helper": {"url": f"ftp://{SENTINEL}", "model": "m"}}), "'kagent/helper': invalid url"),
        (json.dumps({"kagent/helper": {"url": "http://x/v1", "model": "m", "secret": SENTINEL}}), "invalid secret"),
        (json.dumps({SENTINEL: {"url": "http://x/v1", "model": "m"}}), "a key that is not <namespace>/<name>"),
        (json.dumps({"kagent/helper": {"url": "http://x/v1"}}), "'kagent/helper': invalid model"),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigurationError) as refused:
            load_table(path)
        assert named in str(refused.value) and "okapi" not in str(refused.value)
    with pytest.raises(ConfigurationError, match="unreadable"):
        load_table(tmp_path / "missing.json")
