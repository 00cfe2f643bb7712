"""The loopback provider: a server on ``127.0.0.1`` that records each request's raw bytes, routes it to the
protocol that serves it, and answers by its script (plus OAuth tokens for the clients that fetch one)."""

from __future__ import annotations

import functools
import itertools
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest

from kagent_memory_governed.adk.conversation import SUMMARY_MARKER

from ._http import Handler, Server
from ._openai import embeddings_response
from ._routing import PROTOCOLS, route_of
from ._sap import deployments_response
from ._script import Failure, Script, View, as_reply, default_script
from ._wire import Ids, Response, json_response


@dataclass(frozen=True)
class Request:
    """One request as it arrived: ``path`` holds the query; ``body`` the bytes, undecoded.

    ``kind`` is ``chat`` or ``summary`` (model requests, ``view`` set), ``embedding`` (OpenAI's embeddings
    API, answered with ``testing.embed``), ``token`` (an OAuth token request),
    ``deployments`` (SAP AI Core's deployment listing) or ``unknown`` (no protocol serves its route, or its
    body did not parse: answered 404 or 500, and the test fails)."""

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    kind: str
    view: View | None = None

    def header(self, name: str) -> str | None:
        """The value of the header ``name`` (any case), None when it was not sent."""
        return next((value for key, value in self.headers if key.lower() == name.lower()), None)

    def json(self) -> Any:
        """The body decoded as JSON."""
        return json.loads(self.body)


@functools.cache
def _signing_key() -> str:
    """An RSA key for the service-account file of the Vertex adapters (made once a process: it is slow)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


class Provider:
    """A model provider on ``127.0.0.1`` (a free port), served from a background thread while the context is
    open. ``script`` answers each model request (``default_script`` when none); it may be replaced at any
    time. A script that raises, and any request to a route no protocol knows, fail the test when the
    context closes."""

    def __init__(self, script: Script | None = None, *, summary_marker: str = SUMMARY_MARKER) -> None:
        self.script: Script = script or default_script
        self.summary_marker = summary_marker
        self._requests: list[Request] = []
        self._errors: list[BaseException | str] = []
        self._lock = threading.Lock()
        self._ids = Ids()
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self._directory: str | None = None

    # lifecycle

    def __enter__(self) -> Provider:
        self._server = Server(self._handle)
        # a short poll: closing waits for the serving loop to look up from its select
        serve = functools.partial(self._server.serve_forever, poll_interval=0.02)
        self._thread = threading.Thread(target=serve, name="loopback-provider", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
        if exc_info[0] is None and self._errors:
            error = self._errors[0]
            raise AssertionError(f"the loopback provider failed: {error!r}") from (
                error if isinstance(error, BaseException) else None
            )

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, no trailing slash."""
        assert self._server is not None, "the provider is not running"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # what was received

    @property
    def requests(self) -> list[Request]:
        """Every request so far, in arrival order (a copy)."""
        with self._lock:
            return list(self._requests)

    def of(self, kind: str | None = "chat") -> list[Request]:
        """The requests of one ``kind`` (``chat``, ``summary``, ``token``, ``deployments``); all with None."""
        return [r for r in self.requests if kind is None or r.kind == kind]

    def bodies(self, kind: str | None = "chat") -> list[bytes]:
        """The raw bodies of the requests of one ``kind``."""
        return [r.body for r in self.of(kind)]

    def views(self, kind: str | None = "chat") -> list[View]:
        """The views of the model requests of one ``kind``."""
        return [r.view for r in self.of(kind) if r.view is not None]

    def received(self, text: str, kind: str | None = None) -> bool:
        """Whether ``text`` is in the raw body of any request of ``kind`` (every request with None): as is, or
        JSON-escaped once or twice (a tool result serialized into a JSON string inside a JSON body)."""
        forms = _forms(text)
        return any(form in body for body in self.bodies(kind) for form in forms)

    def clear(self) -> None:
        """Forget the requests received so far."""
        with self._lock:
            self._requests.clear()

    # environment

    def service_account_file(self) -> str:
        """A Google service-account key file whose ``token_uri`` is this provider's ``/token``: google-auth
        signs a JWT with it and fetches its access token here."""
        if self._directory is None:
            self._directory = tempfile.mkdtemp(prefix="loopback-provider-")
        path = os.path.join(self._directory, "service-account.json")
        info = {
            "type": "service_account",
            "project_id": "loopback-project",
            "private_key_id": "loopback",
            "private_key": _signing_key(),
            "client_email": "agent@loopback-project.iam.gserviceaccount.com",
            "client_id": "1",
            "token_uri": f"{self.url}/token",
        }
        with open(path, "w") as file:
            json.dump(info, file)
        return path

    # serving

    def _handle(self, handler: Handler) -> None:
        request = Request(handler.command, handler.path, tuple(handler.headers.items()), handler.read_body(), "unknown")
        try:
            request, response = self._answer(request)
        except Exception as error:  # a body its protocol could not parse: answer 500, fail the test at close
            self._errors.append(error)
            response = json_response(500, {"error": {"message": f"loopback provider: {error!r}"}})
        with self._lock:
            self._requests.append(request)
        handler.send(response)

    def _answer(self, request: Request) -> tuple[Request, Response]:
        route = route_of(request.method, request.path)
        if route is None:
            self._errors.append(f"no protocol serves {request.method} {request.path}")
            return request, json_response(404, {"error": "no protocol serves this route"})
        if route == "token":
            token = {"access_token": f"loopback-token-{self._ids('')}", "token_type": "Bearer", "expires_in": 3600}
            return replace(request, kind="token"), json_response(200, token)
        if route == "deployments":
            return replace(request, kind="deployments"), deployments_response(self.url, request.path)
        if route == "embeddings":  # OpenAI's embeddings API, for the Agent's memory.embedding
            return replace(request, kind="embedding"), embeddings_response(request.json())
        protocol = PROTOCOLS[route]
        view = protocol.view(request.path, request.json())
        view = replace(view, summary=self.summary_marker in view.user_text)
        request = replace(request, kind="summary" if view.summary else "chat", view=view)
        try:
            answer = as_reply(self.script(view))
        except Exception as error:
            self._errors.append(error)
            return request, json_response(500, {"error": {"message": f"loopback provider script: {error!r}"}})
        if isinstance(answer, Failure):
            return request, protocol.failure(view, answer)
        return request, protocol.reply(view, answer, self._ids)


def _forms(text: str) -> set[bytes]:
    """``text`` as is, and JSON-escaped once and twice, with and without ``\\uXXXX`` escapes."""
    forms = {text}
    for outer, inner in itertools.product((True, False), repeat=2):
        once = json.dumps(text, ensure_ascii=inner)[1:-1]
        forms |= {once, json.dumps(once, ensure_ascii=outer)[1:-1]}
    return {form.encode() for form in forms}


@pytest.fixture(name="provider")
def provider_fixture() -> Iterator[Provider]:
    """``provider``: a running :class:`Provider` with the default script, for one test (import this name)."""
    with Provider() as running:
        yield running
