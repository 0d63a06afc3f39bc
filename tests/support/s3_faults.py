"""A fault-injecting HTTP proxy in front of the test S3 server: a real local server (127.0.0.1, a free port) that
forwards every request unchanged, except the ones a ``Fault`` matches.

A fault matches on the method and a regex searched in the request path; it lets the first ``skip`` matching
requests through, then ``times`` says how many it hits (then it is spent). What it does:

- ``status``: answer that HTTP status with an S3 error body (``SlowDown`` for 503, ``PreconditionFailed`` for 412,
  ``ConditionalRequestConflict`` for 409) without forwarding: the write did not happen;
- ``drop_after``: forward the request, then close the connection without answering: the write DID happen;
- ``drop_before``: close the connection without forwarding;
- ``delay_s``: wait that long, then forward and answer (a client with a shorter read timeout gives up first, and
  the write still lands);
- ``before``: call this function first (e.g. another writer commits), then forward;
- ``strip_conditions``: forward without ``If-None-Match`` / ``If-Match`` (a backend that ignores conditional
  headers: the write always lands). moto checks no signatures, so the stripped headers go unnoticed.

``proxy.seen`` lists (method, path) of every request, ``proxy.answered`` (method, path, status, body bytes) of
every answer it forwarded; ``fault.hits`` counts what each fault did.
"""

from __future__ import annotations

import http.client
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import urlsplit

import pytest

_CODES = {503: "SlowDown", 412: "PreconditionFailed", 409: "ConditionalRequestConflict", 500: "InternalError"}


@dataclass
class Fault:
    method: str
    path: str  # a regex, searched in the request path (which includes the bucket and the key)
    status: int | None = None
    drop_after: bool = False
    drop_before: bool = False
    delay_s: float = 0.0
    before: Callable[[], None] | None = None
    strip_conditions: bool = False
    times: int = 1
    skip: int = 0
    hits: int = field(default=0, init=False)

    def matches(self, method: str, path: str) -> bool:
        if self.hits >= self.times or method != self.method or re.search(self.path, path) is None:
            return False
        if self.skip > 0:
            self.skip -= 1
            return False
        return True


class FaultProxy:
    """``FaultProxy(upstream_url).start()``; ``url`` is what clients use; ``add(Fault(...))`` arms a fault."""

    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.faults: list[Fault] = []
        self.seen: list[tuple[str, str]] = []
        self.answered: list[tuple[str, str, int, int]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def _take(self, method: str, path: str) -> Fault | None:
        with self._lock:
            self.seen.append((method, path))
            for f in self.faults:
                if f.matches(method, path):
                    f.hits += 1
                    return f
        return None

    def start(self) -> "FaultProxy":
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, and 100-continue for large PUTs

            def log_message(self, *args) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fault = proxy._take(self.command, self.path)
                if fault is not None and fault.status is not None:
                    return self._error(fault.status)
                if fault is not None and fault.drop_before:
                    return self._drop()
                if fault is not None and fault.before is not None:
                    fault.before()
                if fault is not None and fault.delay_s:
                    time.sleep(fault.delay_s)
                drop = ("if-none-match", "if-match") if fault is not None and fault.strip_conditions else ()
                status, headers, answer = proxy._forward(self.command, self.path, self.headers, body, drop)
                with proxy._lock:
                    proxy.answered.append((self.command, self.path, status, len(answer)))
                if fault is not None and fault.drop_after:
                    return self._drop()
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(answer)

            def _error(self, status: int) -> None:
                code = _CODES.get(status, "InjectedFault")
                body = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code>"
                        f"<Message>injected by the test proxy</Message></Error>").encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _drop(self) -> None:
                self.close_connection = True
                self.connection.shutdown(2)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True).start()
        return self

    def _forward(self, method: str, path: str, headers, body: bytes, drop=()) -> tuple[int, list, bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for k, v in headers.items():
                if k.lower() not in ("expect", "content-length", "connection", *drop):
                    conn.putheader(k, v)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@pytest.fixture
def proxy(s3_server):
    """A ``FaultProxy`` in front of the session's S3 server (import it into a test module to use it)."""
    p = FaultProxy(s3_server.url).start()
    try:
        yield p
    finally:
        p.stop()
