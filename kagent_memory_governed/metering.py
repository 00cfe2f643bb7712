"""Bounded aggregate counters of memory operations, apart from chat tokens (R27).

Labels come from fixed sets only: an operation type, a result, a reason code. Never a user, room,
scope, entry id or any text. The counter reaches whatever meter provider the process configures; when
none is and ``OTEL_METRICS_EXPORTER`` asks for one, ``export_from_environment`` configures it the
standard OpenTelemetry way (OTLP over gRPC or HTTP, ``OTEL_EXPORTER_OTLP_*``). Otherwise counting is a no-op.
"""

from __future__ import annotations

import os

from opentelemetry import metrics

from kagent_memory_governed.errors import ConfigurationError, Operation, Reason, Result

OPERATIONS = frozenset(
    {
        Operation.ASSERTION,
        Operation.PREFETCH,
        Operation.LOAD,
        Operation.SAVE,
        Operation.AUTOSAVE,
        Operation.SUMMARIZE,
        Operation.EMBED,
        Operation.TURN,
    }
)
RESULTS = frozenset(Result)

_counter = metrics.get_meter("kagent_memory_governed").create_counter(
    "governed_memory.operations", unit="{operation}", description="Governed memory operations by result"
)


def count(operation: Operation, result: Result, reason: Reason | None = None, amount: int = 1) -> None:
    """Add ``amount`` to the counter for (operation, result, reason); unknown labels are a programming error."""
    if operation not in OPERATIONS or result not in RESULTS:
        raise ValueError("unbounded metric label")
    labels = {"operation": operation.value, "result": result.value, "reason": reason.value if reason else "none"}
    _counter.add(amount, labels)


EXPORTERS = ("otlp", "console", "none")


def export_from_environment() -> None:
    """Configure a meter provider from ``OTEL_METRICS_EXPORTER`` (``otlp``, ``console`` or ``none``) unless
    the process already has one. Another exporter is a configuration error naming the variable."""
    wanted = os.environ.get("OTEL_METRICS_EXPORTER", "none").strip().lower()
    if wanted not in EXPORTERS:
        raise ConfigurationError(f"OTEL_METRICS_EXPORTER: one of {', '.join(EXPORTERS)}")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

    if wanted == "none" or isinstance(metrics.get_meter_provider(), MeterProvider):
        return  # not asked for, or the process configured its own

    if wanted == "console":
        exporter = ConsoleMetricExporter()
    else:
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") or os.environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL"
        )
        if protocol in ("http/protobuf", "http/json"):
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        else:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        exporter = OTLPMetricExporter()
    metrics.set_meter_provider(MeterProvider(metric_readers=[PeriodicExportingMetricReader(exporter)]))
