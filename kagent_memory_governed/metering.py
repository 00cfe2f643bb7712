"""Bounded aggregate metrics of governed memory, apart from chat tokens (R27), and their export.

- ``governed_memory.operations`` (counter): memory work by operation, result and reason code.
- ``governed_memory.store.available`` (gauge): 1 while the store can serve (reachable, supported, at this
  package's schema head), else 0, labelled with the reason code (``none`` when available).
- ``governed_memory.erasures.unfinished`` (gauge): scopes of the database whose erasure is ``pending`` or
  ``failed`` (label ``state``); absent while the store cannot be asked.

Labels come from fixed sets only: an operation type, a result, a reason code, an erasure state. Never a
user, room, scope, entry id or any text. The instruments reach whatever meter provider the process
configures; when it has none, ``export_from_environment`` configures one from ``OTEL_METRICS_EXPORTER`` as
the OpenTelemetry specification reads it (a comma-separated list of ``otlp``, ``prometheus``, ``console``;
``none``), except that unset means ``none``: kagent configures no meter provider, and an exporter nobody
asked for would only log its failures.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics.export import MetricReader

from kagent_memory_governed.consent import Erasure
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
UNFINISHED = (Erasure.PENDING, Erasure.FAILED)

_meter = metrics.get_meter("kagent_memory_governed")
_counter = _meter.create_counter(
    "governed_memory.operations", unit="{operation}", description="Governed memory operations by result"
)


def count(operation: Operation, result: Result, reason: Reason | None = None, amount: int = 1) -> None:
    """Add ``amount`` to the counter for (operation, result, reason); unknown labels are a programming error."""
    if operation not in OPERATIONS or result not in RESULTS:
        raise ValueError("unbounded metric label")
    labels = {"operation": operation.value, "result": result.value, "reason": reason.value if reason else "none"}
    _counter.add(amount, labels)


@dataclass(frozen=True)
class StoreHealth:
    """What the last look at the store saw: ``refused`` is ``None`` when it could serve; ``erasures`` the
    unfinished erasures by state, ``None`` when they could not be counted."""

    refused: Reason | None
    erasures: Mapping[Erasure, int] | None


_health: StoreHealth | None = None  # nothing is reported before the first look


def observe_store(health: StoreHealth) -> None:
    """Record what a look at the store saw; the gauges report it until the next look. Unknown labels are a
    programming error."""
    global _health
    if (health.refused is not None and not isinstance(health.refused, Reason)) or (
        health.erasures is not None and set(health.erasures) != set(UNFINISHED)
    ):
        raise ValueError("unbounded metric label")
    _health = health


def _availability(options: CallbackOptions) -> Iterable[Observation]:
    if _health is not None:
        reason = _health.refused.value if _health.refused else "none"
        yield Observation(0 if _health.refused else 1, {"reason": reason})


def _erasures(options: CallbackOptions) -> Iterable[Observation]:
    if _health is not None and _health.erasures is not None:
        for state, scopes in _health.erasures.items():
            yield Observation(scopes, {"state": state.value})


_meter.create_observable_gauge(
    "governed_memory.store.available",
    callbacks=[_availability],
    description="1 while the governed memory store can serve, else 0; reason: why not",
)
_meter.create_observable_gauge(
    "governed_memory.erasures.unfinished",
    callbacks=[_erasures],
    unit="{scope}",
    description="Scopes whose erasure is pending or failed (they stay disabled until it is verified)",
)

EXPORTERS = ("otlp", "prometheus", "console", "none")
PROMETHEUS_PACKAGE = "opentelemetry-exporter-prometheus"
_EXPORTER_NAME = re.compile(r"[a-z][a-z0-9_.-]{0,31}")


def exporters_from(value: str | None) -> tuple[str, ...]:
    """The exporters ``OTEL_METRICS_EXPORTER`` names, in order, once each; ``()`` for unset, empty or ``none``.
    Refuses (``ConfigurationError`` naming the variable) an exporter this package does not know, and ``none``
    beside another."""
    names = tuple(dict.fromkeys(part.strip().lower() for part in (value or "").split(",") if part.strip()))
    for name in names:
        if name not in EXPORTERS:
            shown = f" {name}" if _EXPORTER_NAME.fullmatch(name) else ""
            raise ConfigurationError(f"OTEL_METRICS_EXPORTER: unknown exporter{shown} (one of {', '.join(EXPORTERS)})")
    if "none" in names and len(names) > 1:
        raise ConfigurationError("OTEL_METRICS_EXPORTER: none cannot be combined with another exporter")
    return () if names == ("none",) else names


def export_from_environment() -> None:
    """Configure a meter provider with the readers ``OTEL_METRICS_EXPORTER`` asks for, unless the process
    already has one. ``otlp`` follows ``OTEL_EXPORTER_OTLP_[METRICS_]PROTOCOL`` (gRPC by default) and the
    other ``OTEL_EXPORTER_OTLP_*`` variables; ``prometheus`` serves ``/metrics`` on
    ``OTEL_EXPORTER_PROMETHEUS_HOST``:``OTEL_EXPORTER_PROMETHEUS_PORT`` (localhost:9464) and needs the
    ``opentelemetry-exporter-prometheus`` package (the ``prometheus`` extra). Refuses, with a one-line
    ``ConfigurationError``, an unknown exporter, ``none`` in a list, a missing package and a bad port."""
    wanted = exporters_from(os.environ.get("OTEL_METRICS_EXPORTER"))
    from opentelemetry.sdk.metrics import MeterProvider

    if not wanted or isinstance(metrics.get_meter_provider(), MeterProvider):
        return  # not asked for, or the process configured its own
    readers = [_reader(name) for name in wanted]
    metrics.set_meter_provider(MeterProvider(metric_readers=readers))


def _reader(name: str) -> MetricReader:
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

    if name == "console":
        return PeriodicExportingMetricReader(ConsoleMetricExporter())
    if name == "prometheus":
        return _prometheus()
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol in ("http/protobuf", "http/json"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as OverHttp

        return PeriodicExportingMetricReader(OverHttp())
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as OverGrpc

    return PeriodicExportingMetricReader(OverGrpc())


def _prometheus() -> MetricReader:
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server
    except ImportError:
        raise ConfigurationError(
            f"OTEL_METRICS_EXPORTER=prometheus needs the package {PROMETHEUS_PACKAGE}"
            " (pip install 'kagent-memory-governed[prometheus]')"
        ) from None
    host = os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST") or "localhost"
    port = os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT") or "9464"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigurationError("OTEL_EXPORTER_PROMETHEUS_PORT: not a port number")
    try:
        start_http_server(port=int(port), addr=host)
    except OSError:
        raise ConfigurationError("OTEL_EXPORTER_PROMETHEUS_HOST/PORT: cannot listen there") from None
    return PrometheusMetricReader()
