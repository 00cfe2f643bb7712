"""Admitted and refused memory work is counted apart from chat tokens, with bounded labels only (R27)."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from sqlalchemy import event

from kagent_memory_governed import metering
from kagent_memory_governed.errors import ConfigurationError, Reason
from kagent_memory_governed.testing import HOMESERVER, A2AClient, ScriptedModel, build_app, new_context, reply_text

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


def delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


async def test_memory_work_is_counted_by_operation_result_and_reason(metric_reader, runtime, store, bridge, embedder):
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


def test_an_unbounded_label_is_a_programming_error():
    with pytest.raises(ValueError):
        metering.count("@alice:example.org", "ok")
    with pytest.raises(ValueError):
        metering.count("save", "sentinel text")


async def test_a_generation_past_bigint_is_a_bad_assertion_that_reaches_no_statement(
    metric_reader, runtime, store, bridge, embedder
):
    model = ScriptedModel().script(on_user=lambda text: [("save_memory", {"content": "likes tea"})])
    app = build_app(model)
    statements: list[str] = []

    def seen(conn, cursor, statement, parameters, context, executemany):
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


def test_the_counter_is_exported_the_standard_opentelemetry_way():
    received: list[bytes] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args) -> None:
            return None

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector) as collector:
        threading.Thread(target=collector.serve_forever, daemon=True).start()
        env = {
            **os.environ,
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"http://127.0.0.1:{collector.server_address[1]}/v1/metrics",
        }
        result = subprocess.run([sys.executable, "-c", EXPORTING], env=env, capture_output=True, text=True, timeout=60)
        collector.shutdown()
    assert result.returncode == 0, result.stderr
    assert any(b"governed_memory.operations" in body and b"load" in body for body in received)


def test_an_exporter_that_is_not_installed_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    with pytest.raises(ConfigurationError, match="^OTEL_METRICS_EXPORTER"):
        metering.export_from_environment()
