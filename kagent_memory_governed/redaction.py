"""The content boundary (R16, R17): inside memory work, logs, spans and errors carry no memory material.

"Memory work" is a context flag: set for an HTTP request that carries a scope assertion (before any
other code sees the request), kept when the assertion verifies, cleared when it does not, and
inherited by every task the request spawns (the agent run, its tools, a background auto-save).
Memory-free requests are left exactly as they were.

- Logs: a log-record factory, which no later logging configuration replaces, withholds the message,
  its arguments, exception and stack text of every record created inside memory work, from any
  logger, for any handler added at any time. Records keep logger, level and code location. This
  package's own records are content-free by construction and pass unchanged.
- Spans: content capture is switched off for ADK (``ADK_CAPTURE_MESSAGE_CONTENT_IN_SPANS``) and
  OpenLLMetry (``TRACELOOP_TRACE_CONTENT``); inside memory work, SDK spans also withhold every string
  attribute outside a small allowlist, exception messages and stack traces, and status descriptions.
- Errors: a failure inside memory work leaves the agent run as its exception type only, so the A2A
  answer (kagent reports ``str(error)``) holds no content.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any

OWN_LOGGERS = "kagent_memory_governed"
# The store's driver layer logs result rows at DEBUG (inspect and search rows are content), in or out
# of memory work: its records are always withheld. Parameters are hidden at the engine as well.
ALWAYS_WITHHELD = ("sqlalchemy.engine",)
WITHHELD = "[withheld]"
ACCESS_LOGGER = "uvicorn.access"
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
_HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
_ADDRESS = re.compile(r"[0-9A-Fa-f:.\[\]]{1,64}")
_SAFE_PATH = re.compile(r"/[A-Za-z0-9/._~-]{0,255}")
_HTTP_VERSION = re.compile(r"[0-9](\.[0-9])?")
# Span attributes whose string values are identifiers or fixed vocabulary, never content.
SAFE_SPAN_KEYS = frozenset(
    {
        "gen_ai.system",
        "gen_ai.operation.name",
        "gen_ai.request.model",
        "gen_ai.response.model",
        "gen_ai.agent.name",
        "gen_ai.tool.name",
        "gen_ai.tool.type",
        "gen_ai.tool.call.id",
        "gen_ai.conversation.id",
        "gcp.vertex.agent.invocation_id",
        "gcp.vertex.agent.session_id",
        "gcp.vertex.agent.event_id",
        "error.type",
        "exception.type",
        "http.method",
        "http.request.method",
        "http.route",
        "http.scheme",
        "rpc.method",
    }
)

_memory_work: ContextVar[bool] = ContextVar("governed_memory_work", default=False)
Arguments = tuple[tuple[Any, ...], dict[str, Any]]  # positional and keyword arguments of a wrapped SDK method


def in_memory_work() -> bool:
    return _memory_work.get()


def enter(active: bool = True) -> Any:
    """Mark (or unmark) the current context as memory work; returns a token for ``leave``."""
    return _memory_work.set(active)


def leave(token: Any) -> None:
    _memory_work.reset(token)


class WithheldError(RuntimeError):
    """What leaves a memory-bearing run instead of a failure whose text might hold content."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"{kind} during memory-enabled work (detail withheld)")


# -- logs -----------------------------------------------------------------------------------------


def scrub_record(record: logging.LogRecord) -> logging.LogRecord:
    """Withhold a record's content if it was created inside memory work (outside this package), or if it
    comes from the store's driver layer. The record keeps the shape every formatter expects (uvicorn's,
    kagent's, ``logging.basicConfig``'s, JSON formatters that print extra attributes): its message becomes
    a fixed text naming its code location, its arguments empty, its extra attributes ``[withheld]``; an
    access line keeps its method, content-free path, HTTP version and status."""
    name = record.name if isinstance(record.name, str) else ""  # logging.makeLogRecord makes one named None
    if name == OWN_LOGGERS or name.startswith(OWN_LOGGERS + "."):
        return record
    if not _memory_work.get() and not name.startswith(ALWAYS_WITHHELD):
        return record
    if name == ACCESS_LOGGER and isinstance(record.args, tuple) and len(record.args) == 5:
        record.args = _access_arguments(*record.args)
        return record
    kind = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else None
    record.msg = f"record withheld inside memory work ({record.module}:{record.lineno}{f', {kind}' if kind else ''})"
    record.args = ()
    record.exc_info = None
    record.exc_text = None
    record.stack_info = None
    for name in set(vars(record)) - _RECORD_ATTRIBUTES:  # extra={...}: some formatters print every one
        setattr(record, name, WITHHELD)
    if "color_message" in vars(record):  # uvicorn's coloured formatters print this instead of msg
        record.color_message = record.msg
    return record


def _access_arguments(
    client: object, method: object, path: object, version: object, status: object
) -> tuple[object, ...]:
    """uvicorn's access-line arguments, content-free: a path of a route that matched (no query string, only
    URL-safe characters: ``/`` or an opaque entry id), else withheld."""
    matched = isinstance(status, int) and status not in (404, 405)
    path = path.partition("?")[0] if isinstance(path, str) else ""
    return (
        client if isinstance(client, str) and _ADDRESS.fullmatch(client) else WITHHELD,
        method if method in _HTTP_METHODS else WITHHELD,
        path if matched and _SAFE_PATH.fullmatch(path) else WITHHELD,
        version if isinstance(version, str) and _HTTP_VERSION.fullmatch(version) else WITHHELD,
        status if isinstance(status, int) else 0,
    )


def install_log_boundary() -> None:
    """Wrap the log-record factory once; handlers and configuration added later are covered too."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "governed_memory", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        return scrub_record(previous(*args, **kwargs))

    factory.governed_memory = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
    install_thread_boundary()


def install_thread_boundary() -> None:
    """Work handed to a thread pool from inside memory work is memory work too. ``asyncio.to_thread`` copies
    the context into the thread, ``loop.run_in_executor`` does not: kagent's Bedrock adapter streams in an
    executor, where botocore logs every response body at DEBUG. Only this flag is carried, and only from
    inside memory work: other submissions run exactly as before."""
    if getattr(ThreadPoolExecutor.submit, "governed_memory", False):
        return
    upstream = ThreadPoolExecutor.submit

    def submit(self: ThreadPoolExecutor, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        if _memory_work.get():
            return upstream(self, _in_memory_work, fn, *args, **kwargs)
        return upstream(self, fn, *args, **kwargs)

    submit.governed_memory = True  # type: ignore[attr-defined]
    setattr(ThreadPoolExecutor, "submit", submit)  # noqa: B010  (the standard library's own class)


def _in_memory_work(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    token = _memory_work.set(True)
    try:
        return fn(*args, **kwargs)
    finally:
        _memory_work.reset(token)


# -- spans ----------------------------------------------------------------------------------------


def scrub_attributes(attributes: Any) -> Any:
    if not attributes or not _memory_work.get():
        return attributes
    return {key: _scrub_value(key, value) for key, value in dict(attributes).items()}


def _scrub_value(key: str, value: Any) -> Any:
    if isinstance(value, bool | int | float) or key in SAFE_SPAN_KEYS:
        return value
    if isinstance(value, list | tuple) and all(isinstance(item, bool | int | float) for item in value):
        return value
    return WITHHELD


def install_span_boundary() -> None:
    """Switch content capture off and make SDK spans withhold content inside memory work."""
    os.environ["ADK_CAPTURE_MESSAGE_CONTENT_IN_SPANS"] = "false"
    os.environ["TRACELOOP_TRACE_CONTENT"] = "false"
    from opentelemetry.sdk.trace import Span, Tracer
    from opentelemetry.trace import Status, StatusCode

    if getattr(Span, "governed_memory", False):
        return

    def wrap(method: Callable[..., Any], guard: Callable[..., Arguments]) -> Callable[..., Any]:
        def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _memory_work.get():
                args, kwargs = guard(*args, **kwargs)
            return method(self, *args, **kwargs)

        return guarded

    def attribute(key: str, value: Any) -> Arguments:
        return (key, _scrub_value(key, value)), {}

    def attributes(attributes: Any) -> Arguments:
        return (scrub_attributes(attributes),), {}

    def event(name: str, attributes: Any = None, timestamp: Any = None) -> Arguments:
        return (name, scrub_attributes(attributes), timestamp), {}

    def status(status: Any, description: str | None = None) -> Arguments:
        code = status.status_code if isinstance(status, Status) else status
        return (Status(code, WITHHELD) if code is StatusCode.ERROR else Status(code),), {}

    def start_span(name: str, *args: Any, **kwargs: Any) -> Arguments:
        if "attributes" in kwargs:
            kwargs["attributes"] = scrub_attributes(kwargs["attributes"])
        return (name, *args), kwargs

    def record_exception(
        self: Any, exception: BaseException, attributes: Any = None, timestamp: Any = None, escaped: bool = False
    ) -> None:
        if not _memory_work.get():
            upstream_record_exception(self, exception, attributes, timestamp, escaped)
            return
        self.add_event(
            "exception",
            {"exception.type": type(exception).__name__, "exception.message": WITHHELD, "exception.escaped": escaped},
            timestamp,
        )

    upstream_record_exception = Span.record_exception
    setattr(Span, "set_attribute", wrap(Span.set_attribute, attribute))  # noqa: B010  (the SDK's own class)
    setattr(Span, "set_attributes", wrap(Span.set_attributes, attributes))  # noqa: B010
    setattr(Span, "add_event", wrap(Span.add_event, event))  # noqa: B010
    setattr(Span, "set_status", wrap(Span.set_status, status))  # noqa: B010
    setattr(Span, "record_exception", record_exception)  # noqa: B010
    setattr(Tracer, "start_span", wrap(Tracer.start_span, start_span))  # noqa: B010
    setattr(Span, "governed_memory", True)  # noqa: B010


def install() -> None:
    install_log_boundary()
    install_span_boundary()


# -- the HTTP edge --------------------------------------------------------------------------------


class MemoryWorkMiddleware:
    """ASGI middleware: a request carrying a scope assertion is memory work from its first byte on,
    before a2a-sdk or kagent log anything about it (the assertion is verified later, in kagent's
    request context builder, which clears the mark if it fails)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        asserted = any(name.lower() == b"x-memory-scope" for name, _ in scope.get("headers", []))
        token = enter(asserted)
        try:
            await self.app(scope, receive, send)
        finally:
            leave(token)
