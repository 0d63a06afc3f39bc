"""A hostile coordinator: a small HTTP server on 127.0.0.1 that speaks the coordinator's wire protocol (the plain
routes ``POST /hubgrpo/api/<name>`` with ``{"data": [...]}``, answered ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": {...}}``) and misbehaves as told, per endpoint; and a ``Recorder``, a server that answers
nothing useful and records every request that reaches it (what a redirect or an upload URL points at).

Every request either server receives is kept (method, path, headers, the first MiB of the body), so a test can
check where a token went. A behaviour is a function ``(handler, args) -> None`` that writes the whole answer;
``answer``, ``refuse``, ``redirect``, ``huge``, ``trickle`` and ``gradio_config`` make the usual ones;
``token_stayed_home`` checks that ``TOKEN`` went nowhere else.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

Behaviour = Callable[["_Handler", list], None]
SHA = "ab" * 20
TOKEN = "hf_hostile_suite_fake_token_0123456789"  # the participant's token the suites watch for
RECORDED_BODY = 1 << 20  # bytes of each request body kept for the assertions


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes = b""

    def carries(self, secret: str) -> bool:
        """Whether ``secret`` is anywhere in this request (headers or body)."""
        return secret in json.dumps(self.headers) or secret.encode() in self.body


@dataclass
class _State:
    behaviours: dict[str, Behaviour]
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: _State  # set per server class

    def _record(self) -> Request:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        req = Request(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                      body[:RECORDED_BODY])
        with self.state.lock:
            self.state.requests.append(req)
        return req

    def _serve(self) -> None:
        req = self._record()
        name = req.path.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
        behaviour = self.state.behaviours.get(name) or self.state.behaviours.get("*")
        if behaviour is None:
            return send(self, 404, {"detail": f"no endpoint {name}"})
        try:
            args = json.loads(req.body or b"{}").get("data", [])
        except (ValueError, AttributeError):
            args = []
        try:
            behaviour(self, args)
        except (BrokenPipeError, ConnectionResetError):  # the worker hung up on us: what a hostile answer earns
            self.close_connection = True

    do_GET = do_POST = do_PUT = _serve  # noqa: N815 (http.server API)

    def log_message(self, *args) -> None:
        pass


class _Server:
    def __init__(self, behaviours: dict[str, Behaviour]):
        self.state = _State(dict(behaviours))
        handler = type("Handler", (_Handler,), {"state": self.state})
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def requests(self) -> list[Request]:
        with self.state.lock:
            return list(self.state.requests)

    def on(self, name: str, behaviour: Behaviour) -> None:
        self.state.behaviours[name] = behaviour

    def start(self):
        threading.Thread(target=self._httpd.serve_forever, name="hostile-server", daemon=True).start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class HostileCoordinator(_Server):
    """The coordinator's plain routes, each answered by the behaviour named for its endpoint (``*``: any other)."""

    def __init__(self, **behaviours: Behaviour):
        super().__init__(behaviours)


class Recorder(_Server):
    """Records what reaches it and answers 404: the target of redirects and upload URLs."""

    def __init__(self):
        super().__init__({"*": lambda h, args: send(h, 404, {"detail": "nothing here"})})


# ------------------------------------------------------------------------------------------------ answers


def send(h: _Handler, status: int, body, headers: dict | None = None) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    h.send_response(status)
    for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})}.items():
        h.send_header(k, v)
    h.end_headers()
    h.wfile.write(data)


def answer(result) -> Behaviour:
    """``{"ok": true, "result": result}`` (``result`` may be a function of the call's args)."""
    return lambda h, args: send(h, 200, {"ok": True, "result": result(args) if callable(result) else result})


def refuse(error) -> Behaviour:
    """``{"ok": false, "error": error}``: whatever ``error`` is (a dict, or junk)."""
    return lambda h, args: send(h, 200, {"ok": False, "error": error})


def sequence(*behaviours: Behaviour) -> Behaviour:
    """Each call the next behaviour; the last one repeats."""
    left = list(behaviours)

    def behave(h, args):
        (left.pop(0) if len(left) > 1 else left[0])(h, args)

    return behave


def redirect(status: int, location: str) -> Behaviour:
    return lambda h, args: send(h, status, b"", {"Location": location})


def huge(n_bytes: int, *, declared: bool = True, status: int = 200, chunk: int = 1 << 20) -> Behaviour:
    """An answer of ``n_bytes`` (a JSON string that never ends), with its Content-Length or chunked."""

    def behave(h, args):
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        if declared:
            h.send_header("Content-Length", str(n_bytes))
        else:
            h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        block, sent = b'{"ok": true, "result": "' + b"a" * chunk, 0
        while sent < n_bytes:
            piece = block[:min(len(block), n_bytes - sent)]
            h.wfile.write(piece if declared else b"%x\r\n%s\r\n" % (len(piece), piece))
            sent += len(piece)
            block = b"a" * chunk
        if not declared:
            h.wfile.write(b"0\r\n\r\n")
        h.close_connection = True

    return behave


def trickle(*, interval: float = 0.2, for_s: float = 15.0, headers_too: bool = False) -> Behaviour:
    """An answer that arrives one byte per ``interval`` for ``for_s`` seconds (the headers too, if asked), then
    the connection closes: every read is quick, the whole answer never comes."""

    def behave(h, args):
        end = time.monotonic() + for_s
        if headers_too:
            head = b"HTTP/1.1 200 OK\r\nX-Padding: " + b"a" * 100_000
            for b in head:
                if time.monotonic() > end:
                    break
                h.wfile.write(bytes([b]))
                h.wfile.flush()
                time.sleep(interval)
        else:
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", "1000000")
            h.end_headers()
            h.wfile.flush()
            while time.monotonic() < end:
                h.wfile.write(b" ")
                h.wfile.flush()
                time.sleep(interval)
        h.close_connection = True
        try:
            h.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    return behave


def gradio_config(api_prefix: str, version: str = "5.0.0") -> Behaviour:
    """A Gradio app's ``/config`` whose ``api_prefix`` points wherever the coordinator likes."""
    return lambda h, args: send(h, 200, {"version": version, "protocol": "sse_v3", "api_prefix": api_prefix,
                                         "components": [], "dependencies": [], "mode": "blocks"})


# ------------------------------------------------------------------------------------------------ records


def lease_dict(**fields) -> dict:
    """A well-formed lease as the wire carries it, with ``fields`` replaced (no validation: hostile on purpose)."""
    now = time.time()
    lease = {"schema_version": 1, "lease_id": "L000001", "run_id": "run", "round_id": 1, "worker": "w1",
             "user": None, "base_version": 0, "base_sha": SHA, "prompt_indices": [0, 1], "steps": 1, "seed": 0,
             "params": {}, "issued_at": now, "deadline": now + 600, "signature": "0" * 64, "uploads": {}}
    lease.update(fields)
    return lease


def refusal(code: str = "budget", wait_s=None, hint: str | None = None, error: str = "Refused") -> dict:
    out = {"error": error, "code": code, "message": f"{code} refusal", "hint": hint}
    if wait_s is not None:
        out["wait_s"] = wait_s
    return out


def token_stayed_home(coord: HostileCoordinator, *others: Recorder) -> None:
    """The token reached only the coordinator it was given, only in its Authorization header; nothing else was
    asked anything."""
    for req in coord.requests:
        assert TOKEN.encode() not in req.body, f"the token travelled in the body of {req.method} {req.path}"
        assert req.headers.get("authorization") in (f"Bearer {TOKEN}", None), req.headers
    for other in others:
        assert other.requests == [], f"a request reached {other.url}: {other.requests[0].path}"
