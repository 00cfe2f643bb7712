"""The HTTP/1.1 transport: a threading server on a free loopback port whose handler reads each request's body
(with a length or chunked) and writes a framed :class:`Response`, one connection a request."""

from __future__ import annotations

from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ._wire import Response


class Handler(BaseHTTPRequestHandler):
    """Hands every ``GET`` and ``POST`` to its server's ``answer``, which replies through :meth:`send`."""

    protocol_version = "HTTP/1.1"
    timeout = 30  # an idle keep-alive connection's thread ends by itself
    server: Server

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.server.answer(self)

    def do_POST(self) -> None:  # noqa: N802
        self.server.answer(self)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def read_body(self) -> bytes:
        """The request's body, undecoded, whether sent with a ``Content-Length`` or chunked."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return body
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def send(self, response: Response) -> None:
        """``response`` whole with its length, or chunked when it streams, then the connection closes."""
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        # One connection a request. The adapters' clients are never closed: a pooled keep-alive connection is
        # closed later by the garbage collector (asyncio's transport __del__), which closes the socket without
        # leaving the event loop's selector, and a later socket given the same descriptor can then wait forever.
        self.send_header("Connection", "close")
        for name, value in response.headers:
            self.send_header(name, value)
        if not response.stream:
            body = b"".join(response.chunks)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        for chunk in response.chunks:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.write(b"0\r\n\r\n")


class Server(ThreadingHTTPServer):
    """Serves ``127.0.0.1`` on a free port, a thread a connection, each request handed to ``answer``."""

    daemon_threads = True

    def __init__(self, answer: Callable[[Handler], None]) -> None:
        self.answer = answer
        super().__init__(("127.0.0.1", 0), Handler)
