"""A stand-in for kagent's Go controller (sessions and tasks only), served through an httpx transport.

Any request to ``/api/memories`` is recorded, answered 500, and fails the test that checks for it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx


class FakeController:
    def __init__(self) -> None:
        self.sessions: dict[str, dict[str, Any]] = {}
        self.tasks: dict[str, dict[str, Any]] = {}
        self.memory_requests: list[str] = []
        self.paths: list[str] = []
        self.bodies: list[str] = []  # every request body, as received

    def received(self, text: str, since: int = 0) -> bool:
        """Whether ``text`` is in any request the controller received (path, query or body, JSON-escaped
        too), counting from the ``since``-th request."""
        escaped = json.dumps(text)[1:-1]
        return any(text in body or escaped in body for body in [*self.bodies[since:], *self.paths[since:]])

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.paths.append(f"{request.method} {path}?{request.url.query.decode()}")
        self.bodies.append(request.content.decode("utf-8", errors="replace"))
        parts = path.strip("/").split("/")
        body = json.loads(request.content) if request.content else None
        if path.startswith("/api/memories"):
            self.memory_requests.append(path)
            return httpx.Response(500, json={"error": True, "message": "governed memory must never call this"})
        if parts[:2] == ["api", "sessions"]:
            return self._sessions(request.method, parts[2:], body, request.url.params.get("user_id"))
        if parts[:2] == ["api", "tasks"]:
            return self._tasks(request.method, parts[2:], body)
        return httpx.Response(404, json={"error": True})

    def _sessions(self, method: str, rest: list[str], body: Any, user_id: str | None) -> httpx.Response:
        if method == "POST" and not rest:
            self.sessions[body["id"]] = {"user_id": body["user_id"], "events": []}
            return httpx.Response(200, json={"data": {"id": body["id"], "user_id": body["user_id"]}})
        session = self.sessions.get(rest[0]) if rest else None
        if session is None:
            return httpx.Response(404, json={"error": True})
        if method == "GET" and len(rest) == 1:
            events = [{"data": data} for data in session["events"]]
            found = {"session": {"id": rest[0], "user_id": session["user_id"]}, "events": events}
            return httpx.Response(200, json={"data": found})
        if method == "POST" and rest[1:] == ["events"]:
            session["events"].append(body["data"])
            return httpx.Response(200, json={"data": {}})
        return httpx.Response(404, json={"error": True})

    def _tasks(self, method: str, rest: list[str], body: Any) -> httpx.Response:
        if method == "POST" and not rest:
            self.tasks[body["id"]] = body
            return httpx.Response(200, json={"error": False, "data": body})
        if method == "GET" and rest and rest[0] in self.tasks:
            return httpx.Response(200, json={"error": False, "data": self.tasks[rest[0]]})
        if method == "DELETE" and rest:
            self.tasks.pop(rest[0], None)
            return httpx.Response(200, json={"error": False})
        return httpx.Response(404, json={"error": True})


@contextmanager
def listening(fake: FakeController) -> Iterator[str]:
    """``fake`` served over HTTP on a loopback port, for an agent server running as another process; yields
    its base URL (``KAGENT_URL``)."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            request = httpx.Request(
                self.command, f"http://controller{self.path}", headers=dict(self.headers), content=body
            )
            response = fake(request)
            self.send_response(response.status_code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(response.content)))
            self.end_headers()
            self.wfile.write(response.content)

        do_GET = do_POST = do_DELETE = do_PUT = _answer

        def log_message(self, format: str, *args: object) -> None:  # the test reads the agent's log, not ours
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
