"""Sentinels: memory material never reaches logs, spans, metrics, ledger or errors (R16, R17).

Every logger at DEBUG is captured by a handler added after kagent reconfigured logging, spans go to an
in-memory exporter on a real SDK tracer provider, metrics to an in-memory reader. Each test injects its
own sentinel into one path, proves the sentinel travelled that path, and then proves it is nowhere.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import asyncpg
import httpx
import pytest
from kagent.adk.types import EmbeddingConfig
from kagent.core._logging import configure_logging
from support import facts

from kagent_memory_governed.adk.service import kagent_embedder
from kagent_memory_governed.assertion import verify
from kagent_memory_governed.clock import now
from kagent_memory_governed.redaction import scrub_record
from kagent_memory_governed.scope import ScopeKey
from kagent_memory_governed.store import Store
from kagent_memory_governed.store.plane import LocalPlane
from kagent_memory_governed.testing import (
    HOMESERVER,
    A2AClient,
    Bridge,
    CountingEmbedder,
    ScriptedModel,
    build_app,
    new_context,
    system_instruction,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from kagent_memory_governed import Runtime

ALICE = f"@alice:{HOMESERVER}"


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.texts: list[str] = []
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.texts.append(self.format(record))  # the message with its arguments, exception and stack text


@pytest.fixture
def logs() -> Iterator[Capture]:
    configure_logging()  # kagent (like uvicorn) reconfigures logging after activation
    capture = Capture()
    loggers = [logging.getLogger()] + [
        logging.getLogger(name) for name in list(logging.root.manager.loggerDict) if not name.startswith("pytest")
    ]
    for name in ("google_adk", "kagent", "kagent_adk", "httpx", "asyncpg", "sqlalchemy", "uvicorn", "a2a"):
        loggers.append(logging.getLogger(name))
    levels = [(logger, logger.level) for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.DEBUG)
    logging.getLogger().addHandler(capture)
    yield capture
    logging.getLogger().removeHandler(capture)
    for logger, level in levels:
        logger.setLevel(level)


@pytest.fixture
async def sinks(
    runtime: Runtime,
    logs: Capture,
    span_exporter: InMemorySpanExporter,
    metric_reader: InMemoryMetricReader,
    sql: asyncpg.Connection,
    embedder: CountingEmbedder,
) -> Sinks:
    span_exporter.clear()
    embedder.calls = embedder.items = 0
    embedder.fail_with = None
    embedder.batches.clear()
    return Sinks(logs, span_exporter, metric_reader, sql)


class Sinks:
    def __init__(
        self, logs: Capture, spans: InMemorySpanExporter, metrics: InMemoryMetricReader, sql: asyncpg.Connection
    ) -> None:
        self.logs, self.spans, self.metrics, self.sql = logs, spans, metrics, sql
        self.responses: list[str] = []

    def span_texts(self) -> list[str]:
        texts: list[str] = []
        for span in self.spans.get_finished_spans():
            texts.append(span.name)
            texts += [f"{k}={v}" for k, v in (span.attributes or {}).items()]
            for event in span.events:
                texts.append(event.name)
                texts += [f"{k}={v}" for k, v in (event.attributes or {}).items()]
            texts.append(span.status.description or "")
        return texts

    def metric_labels(self) -> list[str]:
        data = self.metrics.get_metrics_data()
        return [
            f"{k}={v}"
            for resource in (data.resource_metrics if data else [])
            for scope in resource.scope_metrics
            for metric in scope.metrics
            for point in metric.data.data_points
            for k, v in point.attributes.items()
        ]

    async def evidence(self) -> str | None:
        evidence: str | None = await self.sql.fetchval(
            "SELECT concat_ws('|', (SELECT string_agg(l::text, ',') FROM governed_memory.ledger l),"
            " (SELECT string_agg(u::text, ',') FROM governed_memory.usage u),"
            " (SELECT string_agg(s::text, ',') FROM governed_memory.scopes s))"
        )
        return evidence

    async def assert_absent(self, sentinel: str) -> None:
        assert not [t for t in self.logs.texts if sentinel in t], "sentinel in a log record"
        assert not [t for t in self.span_texts() if sentinel in t], "sentinel in a span"
        assert not [t for t in self.metric_labels() if sentinel in t], "sentinel in a metric label"
        assert sentinel not in (await self.evidence() or ""), "sentinel in the ledger"
        assert not [r for r in self.responses if sentinel in r], "sentinel in an answer"


@pytest.fixture
def model() -> ScriptedModel:
    return ScriptedModel()


@pytest.fixture
async def agent(runtime: Runtime, model: ScriptedModel) -> AsyncIterator[A2AClient]:
    app = build_app(model)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
        yield A2AClient(http)
    await runtime.service.drain()


async def consent(store: Store, bridge: Bridge) -> tuple[ScopeKey, int]:
    key = verify(bridge.sign(time.time()), bridge.trust(), now=now(), user_id=ALICE).key
    assert key is not None  # a scope token, not an offboarding one
    return key, (await store.grant(key, purpose="assist", policy_version="v1")).generation


def without_tool_calls(value: object) -> object:
    """An A2A answer minus the model's own tool-call arguments, which are the subject's conversation, not
    material from the memory path; tool results, the agent's text and error messages all stay."""
    if isinstance(value, dict):
        if (value.get("metadata") or {}).get("kagent_type") == "function_call":
            return None
        return {k: without_tool_calls(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_tool_calls(v) for v in value]
    return value


async def send(
    agent: A2AClient, sinks: Sinks, bridge: Bridge, text: str, generation: int, context: str | None = None
) -> dict[str, Any]:
    answer = await agent.send(
        text, context_id=context or new_context(), user=ALICE, scope=bridge.sign(time.time(), gen=generation)
    )
    sinks.responses.append(json.dumps(without_tool_calls(answer)))
    return answer


async def test_a_search_query_never_leaves_the_memory_path(
    sinks: Sinks, agent: A2AClient, model: ScriptedModel, store: Store, bridge: Bridge, embedder: CountingEmbedder
) -> None:
    sentinel_prefetch, sentinel_load = "SENTINEL-QRY-PREFETCH-4b1e", "SENTINEL-QRY-LOAD-9c2d"
    _, generation = await consent(store, bridge)
    model.script(on_user=lambda text: [("load_memory", {"query": f"what about {sentinel_load}"})])
    await send(agent, sinks, bridge, f"Tell me what you remember about {sentinel_prefetch} please, thanks.", generation)
    batches = " ".join(text for batch in embedder.batches for text in batch)
    assert sentinel_prefetch in batches and sentinel_load in batches  # both searches ran with them
    await sinks.assert_absent(sentinel_load)
    assert not [t for t in sinks.logs.texts if sentinel_prefetch in t]
    assert not [t for t in sinks.span_texts() if sentinel_prefetch in t]


@pytest.mark.parametrize(
    "shape", ["SENTINEL-SUM-{n} is not json", '{{"facts": ["SENTINEL-SUM-{n}"]}}', '["ok", 7, "SENTINEL-SUM-{n}"]']
)
async def test_malformed_summarizer_output_is_never_logged_or_stored(
    sinks: Sinks, runtime: Runtime, agent: A2AClient, model: ScriptedModel, store: Store, bridge: Bridge, shape: str
) -> None:
    sentinel = f"SENTINEL-SUM-{abs(hash(shape)) % 1000}"
    _, generation = await consent(store, bridge)
    model.script(on_user=lambda text: [], summary=shape.format(n=sentinel.rsplit("-", 1)[1]))
    context = new_context()
    for turn in range(5):
        await send(agent, sinks, bridge, f"turn {turn}", generation, context)
    await runtime.service.drain()
    assert len(model.summaries) == 1  # the summarizer answered with the sentinel
    assert await sinks.sql.fetchval("SELECT count(*) FROM governed_memory.entries") == 0
    await sinks.assert_absent(sentinel)


async def test_a_failing_model_response_body_is_withheld(
    sinks: Sinks, agent: A2AClient, model: ScriptedModel, store: Store, bridge: Bridge
) -> None:
    sentinel = "SENTINEL-MODEL-BODY-77aa"
    _, generation = await consent(store, bridge)
    model.script(fail_chat=sentinel)
    answer = await send(agent, sinks, bridge, "hello, a question that fails", generation)
    assert model.chats  # the model was called and raised with the body
    assert answer["result"]["status"]["state"] == "failed"
    assert "model_failed" in json.dumps(answer)  # the model raised: google-adk's on_model_error, the boundary's
    await sinks.assert_absent(sentinel)


async def test_a_failing_embedding_provider_body_is_withheld(
    sinks: Sinks, agent: A2AClient, model: ScriptedModel, store: Store, bridge: Bridge, runtime: Runtime
) -> None:
    sentinel = "SENTINEL-EMBED-BODY-31ff"
    hits: list[bytes] = []

    async def provider(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hits.append(await reader.read(65536))
        body = json.dumps({"error": f"model overloaded while embedding; {sentinel}"}).encode()
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n")
        writer.write(b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(provider, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    config = EmbeddingConfig(provider="ollama", model="nomic-embed-text", base_url=f"http://127.0.0.1:{port}")
    plane = runtime.service.plane
    assert isinstance(plane, LocalPlane)
    original, plane._embedder = plane._embedder, kagent_embedder(config)  # upstream's client
    try:
        _, generation = await consent(store, bridge)
        model.script(on_user=lambda text: [("save_memory", {"content": "likes tea"})])
        answer = await send(agent, sinks, bridge, "hello there", generation)
    finally:
        plane._embedder = original
        server.close()
    assert hits  # upstream's embedding client called the provider, which answered with the sentinel
    assert "Memory unavailable: embedding_failed" in json.dumps(answer)
    await sinks.assert_absent(sentinel)


async def test_a_database_error_echoing_the_fact_is_withheld(
    sinks: Sinks, agent: A2AClient, model: ScriptedModel, store: Store, bridge: Bridge
) -> None:
    sentinel = "SENTINEL-DB-ERROR-5e5e"
    await sinks.sql.execute(
        "CREATE FUNCTION governed_memory.echo() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN RAISE EXCEPTION 'rejected row: %', NEW.plain_text; END; $$;"
        "CREATE TRIGGER echo BEFORE INSERT ON governed_memory.entries"
        " FOR EACH ROW EXECUTE FUNCTION governed_memory.echo()"
    )
    try:
        key, generation = await consent(store, bridge)
        with pytest.raises(asyncpg.RaiseError, match=sentinel):  # the database really echoes the fact
            await sinks.sql.execute(
                "INSERT INTO governed_memory.entries"
                " VALUES ($1, gen_random_uuid(), $2, $3, 1, now(), now() + interval '1h')",
                key.scope_id,
                sentinel,
                str([1.0] * 768),
            )
        model.script(on_user=lambda text: [("save_memory", {"content": f"remember {sentinel}"})])
        answer = await send(agent, sinks, bridge, "hello there", generation)
        assert "Memory unavailable: store_unavailable" in json.dumps(answer)
    finally:
        await sinks.sql.execute("DROP TRIGGER echo ON governed_memory.entries; DROP FUNCTION governed_memory.echo()")
    await sinks.assert_absent(sentinel)


async def test_a_stored_fact_injected_by_prefetch_stays_out_of_logs_and_spans(
    sinks: Sinks, agent: A2AClient, model: ScriptedModel, store: Store, bridge: Bridge
) -> None:
    sentinel = "SENTINEL-FACT-PREFETCHED-0d0d"
    key, generation = await consent(store, bridge)
    await store.write(key, generation, facts(f"the user's locker code is {sentinel}"))
    model.script(on_user=lambda text: [])
    answer = await send(agent, sinks, bridge, "What is my locker code? Please tell me the locker code.", generation)
    assert sentinel in system_instruction(model.chats[0])  # prefetch injected it into the model request
    assert not [t for t in sinks.logs.texts if sentinel in t]
    assert not [t for t in sinks.span_texts() if sentinel in t]
    assert not [t for t in sinks.metric_labels() if sentinel in t]
    assert sentinel not in (await sinks.evidence() or "")
    assert sentinel not in json.dumps(answer)


async def test_records_of_memory_free_requests_are_untouched(
    sinks: Sinks, agent: A2AClient, model: ScriptedModel
) -> None:
    model.script(fail_chat="MEMORY-FREE-BODY-1234")
    answer = await agent.send("hello", context_id=new_context(), user=ALICE, scope=None)
    assert "MEMORY-FREE-BODY-1234" in json.dumps(answer)  # upstream behaviour, unchanged without memory
    assert [t for t in sinks.logs.texts if "MEMORY-FREE-BODY-1234" in t]
    assert not [t for t in sinks.logs.texts if "withheld" in t]


def test_a_record_made_inside_memory_work_keeps_only_its_location() -> None:
    from kagent_memory_governed import redaction

    token = redaction.enter(True)
    try:
        try:
            raise ValueError("SENTINEL-EXC")
        except ValueError:
            import sys

            record = logging.LogRecord(
                "some.lib", logging.ERROR, "/x/lib.py", 42, "query %s", ("SENTINEL",), sys.exc_info()
            )
        scrubbed = scrub_record(record)
        own = scrub_record(
            logging.LogRecord("kagent_memory_governed.store", logging.INFO, "f", 1, "refused: %s", ("x",), None)
        )
    finally:
        redaction.leave(token)
    assert scrubbed.getMessage() == "record withheld inside memory work (lib:42, ValueError)"
    assert scrubbed.exc_info is None and scrubbed.args == ()
    assert own.getMessage() == "refused: x"


class JsonFormatter(logging.Formatter):
    """Like python-json-logger: the message and every attribute a record carries beyond the standard ones."""

    STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        extra = {k: v for k, v in vars(record).items() if k not in self.STANDARD}
        return json.dumps({"message": record.getMessage(), "level": record.levelname, **extra}, default=str)


def formatters() -> list[logging.Formatter]:
    from kagent.core._logging import LOG_FORMAT
    from uvicorn.logging import AccessFormatter, DefaultFormatter

    return [
        AccessFormatter('%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s', use_colors=False),
        AccessFormatter('%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s', use_colors=True),
        DefaultFormatter("%(levelprefix)s %(message)s", use_colors=True),
        logging.Formatter(LOG_FORMAT),  # kagent's
        logging.Formatter(logging.BASIC_FORMAT),
        JsonFormatter(),
    ]


def made_inside_memory_work(name: str, msg: str, args: object, **extra: object) -> logging.LogRecord:
    from kagent_memory_governed import redaction

    token = redaction.enter(True)
    try:
        record = logging.getLogRecordFactory()(name, logging.INFO, "/x/h11_impl.py", 7, msg, args, None)
        record.__dict__.update(extra)
        return scrub_record(record)
    finally:
        redaction.leave(token)


@pytest.mark.parametrize(
    ("path", "status", "shown"),
    [
        ("/", 200, '"POST / HTTP/1.1" 200'),
        (
            "/memory/v1/entries/0b8e4f5a-6d0c-4f7e-9a41-5f2b8c1d9e30",
            200,
            "/entries/0b8e4f5a-6d0c-4f7e-9a41-5f2b8c1d9e30 ",
        ),
        ("/memory/v1/entries?limit=5&cursor=SENTINEL-QUERY", 200, '"POST /memory/v1/entries HTTP/1.1" 200'),
        ("/SENTINEL-PATH-no-such-route", 404, '"POST [withheld] HTTP/1.1" 404'),
        ("/has spaces SENTINEL", 200, '"POST [withheld] HTTP/1.1" 200'),
    ],
)
def test_an_access_line_inside_memory_work_keeps_method_route_and_status_for_every_formatter(
    path: str, status: int, shown: str
) -> None:
    record = made_inside_memory_work(
        "uvicorn.access", '%s - "%s %s HTTP/%s" %d', ("127.0.0.1:5000", "POST", path, "1.1", status)
    )
    for formatter in formatters()[:2]:
        line = re.sub(r"\x1b\[[0-9;]*m", "", formatter.format(logging.makeLogRecord(vars(record))))  # colours
        assert shown in line and "SENTINEL" not in line and "127.0.0.1:5000" in line
    for formatter in formatters()[2:]:
        assert "SENTINEL" not in formatter.format(logging.makeLogRecord(vars(record)))


def test_every_formatter_formats_a_withheld_record_with_extras_and_colours(capsys: pytest.CaptureFixture[str]) -> None:
    record = made_inside_memory_work(
        "a2a.server.apps", "Request body: %s", ("SENTINEL-BODY",), color_message="body %s", query="SENTINEL-EXTRA"
    )
    for formatter in formatters()[2:]:
        line = formatter.format(logging.makeLogRecord(vars(record)))
        assert "record withheld inside memory work" in line and "SENTINEL" not in line
    odd = made_inside_memory_work("uvicorn.access", "%s %s", ("SENTINEL-A", "SENTINEL-B"))  # not uvicorn's shape
    assert "SENTINEL" not in logging.Formatter(logging.BASIC_FORMAT).format(odd)


async def test_a_record_made_in_a_thread_pool_on_behalf_of_memory_work_is_withheld(
    runtime: Runtime, logs: Capture
) -> None:
    """``loop.run_in_executor`` does not copy the context (kagent's Bedrock adapter streams that way)."""
    import asyncio

    from kagent_memory_governed import redaction

    def log(text: str) -> None:
        logging.getLogger("botocore.parsers").debug("Response body: %s", text)

    token = redaction.enter(True)
    try:
        await asyncio.get_running_loop().run_in_executor(None, log, "SENTINEL-IN-A-THREAD")
    finally:
        redaction.leave(token)
    await asyncio.get_running_loop().run_in_executor(None, log, "MEMORY-FREE-IN-A-THREAD")
    assert not [t for t in logs.texts if "SENTINEL-IN-A-THREAD" in t]
    assert [t for t in logs.texts if "MEMORY-FREE-IN-A-THREAD" in t]  # outside memory work: as it was
