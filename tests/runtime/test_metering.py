"""Admitted and refused memory work is counted apart from chat tokens, with bounded labels only (R27)."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from sqlalchemy import event
from support import free_port

from kagent_memory_governed import metering
from kagent_memory_governed.errors import ConfigurationError, Reason
from kagent_memory_governed.testing import (
    HOMESERVER,
    A2AClient,
    Bridge,
    CountingEmbedder,
    ScriptedModel,
    build_app,
    new_context,
    reply_text,
)

if TYPE_CHECKING:
    import asyncpg

    from kagent_memory_governed import Runtime
    from kagent_memory_governed.scope import ScopeKey
    from kagent_memory_governed.store import Store

ALICE = f"@alice:{HOMESERVER}"


def counts(reader: InMemoryMetricReader) -> dict[tuple[str, str, str], int]:
    found: dict[tuple[str, str, str], int] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope_metrics in resource.scope_metrics:
            if scope_metrics.scope.name != "kagent_memory_governed":
                continue  # this package's meter only: google-adk 1.39 emits gen_ai.tool.execution.duration
            for metric in scope_metrics.metrics:
                assert metric.name == "governed_memory.operations"
                for point in metric.data.data_points:
                    labels = dict(point.attributes)
                    assert set(labels) == {"operation", "result", "reason"}
                    assert labels["operation"] in metering.OPERATIONS
                    assert labels["result"] in metering.RESULTS
                    assert labels["reason"] in {r.value for r in Reason} | {"none"}
                    found[(labels["operation"], labels["result"], labels["reason"])] = point.value
    return found


Counts = dict[tuple[str, str, str], int]


def delta(before: Counts, after: Counts) -> Counts:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


async def test_memory_work_is_counted_by_operation_result_and_reason(
    metric_reader: InMemoryMetricReader, runtime: Runtime, store: Store, bridge: Bridge, embedder: CountingEmbedder
) -> None:
    model = ScriptedModel().script(on_user=lambda text: [("save_memory", {"content": "likes tea"})])
    app = build_app(model)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
        agent = A2AClient(http)
        before = counts(metric_reader)
        await agent.send("hello there", context_id=new_context(), user=ALICE, scope=None)
        key_token = bridge.sign(time.time(), "control", op="consent")
        grant = await http.post(
            "/memory/v1/consent",
            json={"purpose": "assist", "policy_version": "v1"},
            headers={"Authorization": f"Bearer {key_token}"},
        )
        generation = grant.json()["generation"]
        await agent.send(
            "hello again", context_id=new_context(), user=ALICE, scope=bridge.sign(time.time(), gen=generation)
        )
        after = counts(metric_reader)
    assert delta(before, after) == {
        ("assertion", "refused", "no_assertion"): 1,
        ("assertion", "admitted", "none"): 1,
        ("prefetch", "ok", "none"): 1,
        ("save", "ok", "none"): 1,
        ("embed", "ok", "none"): 2,  # one prefetch subquery, one fact
    }


def untyped(label: object) -> Any:
    """A label as an untyped caller passes it: the type checker refuses it in typed code, the run-time check
    is what these tests are about."""
    return label


def test_an_unbounded_label_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        metering.count(untyped("@alice:example.org"), untyped("ok"))
    with pytest.raises(ValueError):
        metering.count(untyped("save"), untyped("sentinel text"))


async def test_a_generation_past_bigint_is_a_bad_assertion_that_reaches_no_statement(
    metric_reader: InMemoryMetricReader, runtime: Runtime, store: Store, bridge: Bridge, embedder: CountingEmbedder
) -> None:
    model = ScriptedModel().script(on_user=lambda text: [("save_memory", {"content": "likes tea"})])
    app = build_app(model)
    statements: list[str] = []

    def seen(
        conn: object, cursor: object, statement: str, parameters: object, context: object, executemany: bool
    ) -> None:
        statements.append(statement)

    engine = store._engine.sync_engine  # observation only: package code never reaches the engine
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as http:
        before = counts(metric_reader)
        event.listen(engine, "before_cursor_execute", seen)
        try:
            answer = await A2AClient(http).send(
                "remember that I like tea",
                context_id=new_context(),
                user=ALICE,
                scope=bridge.sign(time.time(), gen=2**70),
            )
        finally:
            event.remove(engine, "before_cursor_execute", seen)
        after = counts(metric_reader)
    assert answer["result"]["status"]["state"] == "completed"  # the chat still runs, memory-free
    assert "Memory unavailable" in reply_text(answer)
    assert delta(before, after) == {("assertion", "refused", "bad_assertion"): 1}
    assert statements == []


EXPORTING = """
from opentelemetry import metrics
from kagent_memory_governed import metering
from kagent_memory_governed.errors import Operation, Result
metering.export_from_environment()
metering.count(Operation.LOAD, Result.OK)
metrics.get_meter_provider().force_flush()
"""


def export(env: dict[str, str], script: str = EXPORTING) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-c", script], env={**clean, **env}, capture_output=True, text=True, timeout=60
    )


class Collector(http.server.BaseHTTPRequestHandler):
    received: list[bytes] = []

    def do_POST(self) -> None:
        self.received.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


def test_an_exporter_list_exports_to_each_the_standard_opentelemetry_way() -> None:
    Collector.received = []
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector) as collector:
        threading.Thread(target=collector.serve_forever, daemon=True).start()
        result = export(
            {
                "OTEL_METRICS_EXPORTER": "otlp, console",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"http://127.0.0.1:{collector.server_address[1]}/v1/metrics",
            }
        )
        collector.shutdown()
    assert result.returncode == 0, result.stderr
    assert any(b"governed_memory.operations" in body and b"load" in body for body in Collector.received)
    assert '"name": "governed_memory.operations"' in result.stdout  # the console exporter's JSON


def test_the_prometheus_exporter_serves_the_counter_when_its_package_is_installed() -> None:
    port = free_port()
    script = EXPORTING + f"print(httpx.get('http://127.0.0.1:{port}/metrics').text)\n"
    result = export(
        {"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT": str(port)}, "import httpx\n" + script
    )
    assert result.returncode == 0, result.stderr
    assert 'governed_memory_operations_total{operation="load",reason="none",result="ok"} 1.0' in result.stdout


def test_without_its_package_the_prometheus_exporter_is_one_line_naming_the_package() -> None:
    script = (
        "import sys; sys.modules['opentelemetry.exporter.prometheus'] = None\n"  # as if it were not installed
        "from kagent_memory_governed import metering\n"
        "try:\n    metering.export_from_environment()\n"
        "except metering.ConfigurationError as error:\n    print(error)\n"
    )
    result = export({"OTEL_METRICS_EXPORTER": "otlp,prometheus"}, script)
    assert (result.returncode, result.stdout) == (
        0,
        "OTEL_METRICS_EXPORTER=prometheus needs the package opentelemetry-exporter-prometheus"
        " (pip install 'kagent-memory-governed[prometheus]')\n",
    )


@pytest.mark.parametrize(
    ("value", "exporters"),
    [
        (None, ()),
        ("", ()),
        ("none", ()),
        ("otlp", ("otlp",)),
        ("otlp,console", ("otlp", "console")),
        (" OTLP , console,otlp,", ("otlp", "console")),
        ("prometheus,otlp", ("prometheus", "otlp")),
    ],
)
def test_the_exporter_variable_is_a_comma_separated_list(value: str | None, exporters: tuple[str, ...]) -> None:
    assert metering.exporters_from(value) == exporters


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("zipkin", "OTEL_METRICS_EXPORTER: unknown exporter zipkin (one of otlp, prometheus, console, none)"),
        ("otlp,SECRET VALUE", "OTEL_METRICS_EXPORTER: unknown exporter (one of otlp, prometheus, console, none)"),
        ("none,otlp", "OTEL_METRICS_EXPORTER: none cannot be combined with another exporter"),
    ],
)
def test_an_unknown_exporter_or_none_in_a_list_is_refused_in_one_line(value: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        metering.exporters_from(value)
    assert str(refused.value) == message


def gauges(reader: InMemoryMetricReader) -> dict[tuple[str, str], float]:
    found: dict[tuple[str, str], float] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope_metrics in resource.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name.startswith(("governed_memory.store", "governed_memory.erasures")):
                    for point in metric.data.data_points:
                        (label,) = point.attributes.values()
                        found[(metric.name, label)] = point.value
    return found


async def test_the_gauges_report_store_availability_and_unfinished_erasures(
    metric_reader: InMemoryMetricReader, store: Store, key: ScopeKey, sql: asyncpg.Connection, tmp_path: Path
) -> None:
    from kagent_memory_governed import health
    from kagent_memory_governed.policy import Policy
    from kagent_memory_governed.store import Store

    assert await health.observe(store) is None
    assert gauges(metric_reader) == {
        ("governed_memory.store.available", "none"): 1,
        ("governed_memory.erasures.unfinished", "pending"): 0,
        ("governed_memory.erasures.unfinished", "failed"): 0,
    }
    await store.grant(key, purpose="assist", policy_version="v1")
    await sql.execute(
        "UPDATE governed_memory.scopes SET enabled = false, erasure = 'failed' WHERE scope_id = $1", key.scope_id
    )
    await health.observe(store)
    assert gauges(metric_reader)[("governed_memory.erasures.unfinished", "failed")] == 1
    gone = Store.connect(f"postgresql+asyncpg://postgres@/postgres?host={tmp_path}", Policy(), keys=store.key_store)
    try:
        assert await health.observe(gone) is Reason.STORE_UNAVAILABLE
    finally:
        await gone.close()
    assert gauges(metric_reader) == {("governed_memory.store.available", "store_unavailable"): 0}


def test_a_health_label_outside_its_set_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        metering.observe_store(metering.StoreHealth(untyped("@alice:example.org"), None))
    with pytest.raises(ValueError):
        metering.observe_store(metering.StoreHealth(None, {untyped("room"): 1}))
