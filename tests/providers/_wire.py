"""What every protocol shares on the wire: a framed response (JSON, server-sent events, or chunks of the
protocol's own framing), the pieces a streamed answer is cut into, the ids the provider assigns, and the
interface each protocol implements."""

from __future__ import annotations

import itertools
import json
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ._script import Failure, Reply, ToolCall, View

CREATED = 1_767_225_600  # a fixed timestamp: answers are byte-for-byte reproducible


@dataclass(frozen=True)
class Response:
    """An HTTP answer: its chunks sent as one body with a length, or with ``stream`` one write each, chunked."""

    status: int
    content_type: str
    chunks: tuple[bytes, ...]
    headers: tuple[tuple[str, str], ...] = ()
    stream: bool = False


def json_response(status: int, value: Any, *headers: tuple[str, str]) -> Response:
    """``value`` as a JSON body."""
    return Response(status, "application/json", (json.dumps(value).encode(),), headers)


def sse_response(events: Iterable[tuple[str | None, Any]], *, separator: str = "\n\n", done: bool = False) -> Response:
    """Server-sent events, one chunk an event (``event:`` line when named), ``data: [DONE]`` last if ``done``."""
    chunks = []
    for event, data in events:
        head = f"event: {event}\n" if event else ""
        chunks.append(f"{head}data: {json.dumps(data)}{separator}".encode())
    if done:
        chunks.append(f"data: [DONE]{separator}".encode())
    return Response(200, "text/event-stream", tuple(chunks), stream=True)


def pieces(text: str) -> list[str]:
    """Text cut in two, so a streaming client aggregates deltas."""
    if len(text) < 2:
        return [text] if text else []
    return [text[: len(text) // 2], text[len(text) // 2 :]]


def content_text(value: Any) -> str:
    """The text of a message content: a string, or a list of text blocks (``text``/``input_text``...)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(item["text"] for item in value if isinstance(item, dict) and isinstance(item.get("text"), str))
    return ""


def token_counts(view: View, reply: Reply) -> tuple[int, int]:
    """Plausible prompt and completion token counts for the usage a service reports."""
    return len(view.system + view.user_text) // 4 + 1, len(reply.text) // 4 + len(reply.calls) + 1


class Ids:
    """Ids a provider assigns, numbered from 1 across every protocol: ``ids("call_")`` is ``call_1``, then..."""

    def __init__(self) -> None:
        self._next = itertools.count(1)

    def __call__(self, prefix: str) -> str:
        return f"{prefix}{next(self._next)}"


def identified_calls(reply: Reply, ids: Ids, prefix: str) -> list[ToolCall]:
    """The reply's tool calls, each without an id given one with ``prefix``."""
    return [ToolCall(c.name, dict(c.args), c.id or ids(prefix)) for c in reply.calls]


class WireProtocol(ABC):
    """One service's wire protocol: parses a request into a :class:`View`, frames a reply or a failure as that
    service does. ``name`` is the protocol's name in ``Adapter.protocol`` and ``View.protocol``."""

    name: str

    @abstractmethod
    def view(self, path: str, body: Any) -> View:
        """The request at ``path`` with the JSON ``body``, as the script sees it."""

    @abstractmethod
    def reply(self, view: View, reply: Reply, ids: Ids) -> Response:
        """``reply`` framed as the service answers ``view`` (whole or streamed, as the request asked)."""

    @abstractmethod
    def failure(self, view: View, failure: Failure) -> Response:
        """``failure`` framed as the service reports an error to ``view``."""
