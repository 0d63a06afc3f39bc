"""A local Hugging Face Hub emulator: real HTTP on 127.0.0.1 that the unmodified ``huggingface_hub`` client talks to.

It serves what ``HfApi``/``hf_hub_download``/``snapshot_download`` use: repo create and
delete, repo info, validate-yaml, preupload (always ``regular``, so content arrives base64 in the commit NDJSON),
the NDJSON commit (412 on a stale ``parentCommit``, 409 while another commit on the repo is being applied), tree,
paths-info, refs, commits, branches, tags, ``/resolve/``, ``whoami-v2`` (orgs from ``api.orgs``), Space
variables/secrets (``hub_emulator_spaces``) and HF Jobs run as local processes (``hub_emulator_jobs``). Endpoint code lives in
``hub_emulator_api``, the data model in ``hub_emulator_state``; this module is the server, the fault injector and
the command line::

    python -m tests.support.hub_emulator --port 8123 --data /tmp/bucket --user hf_test_alice_token=alice

Faults (``set_faults`` for a random rate, ``fail_next`` for exact sequences, ``fail_at`` for the Nth request of
any endpoint, optionally with the server down from there on: a client that crashed at that call), per endpoint name:
``429`` (``RateLimit: "api";r=0;t=<ratelimit_reset_s>``), ``409`` (the busy answer), ``500`` (not applied),
``timeout`` (sleeps ``timeout_s`` then closes the connection without answering; not applied), ``lost`` (APPLIED,
then the answer is dropped: alternately a 500 and a connection reset; ``lost-500``/``lost-reset`` pick one),
and, only on request, ``late`` (the connection is reset at once and the commit lands just before the next commit
request is handled: a commit that landed after its client gave up). ``set_commit_quota`` gives every repo the
Hub's hourly commit quota (off by default): past it a commit is answered 429 with the Hub's message.
"""

from __future__ import annotations

import argparse
import collections
import random
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

from tests.support.hub_emulator_api import BUSY_MESSAGE, HubApi, Request, Resp, error_resp, json_resp
from tests.support.hub_emulator_state import HubError, HubState

ALL_FAULTS = ("429", "409", "500", "timeout", "lost")
_LOST = ("lost", "lost-500", "lost-reset")


class HubEmulator:
    """The emulator. ``users`` maps tokens to user names; a user may write only to repos in its own namespace."""

    def __init__(self, users: dict[str, str] | None = None, latency_s: float = 0.0, host: str = "127.0.0.1",
                 port: int = 0, *, data_dir: str | None = None, initial_commit: bool = True,
                 tree_page_size: int = 1000, commits_page_size: int = 50):
        """``data_dir`` persists repos across restarts; ``initial_commit`` mimics the Hub's first commit."""
        self.state = HubState(data_dir)
        self.api = HubApi(self.state, users or {}, initial_commit=initial_commit, tree_page_size=tree_page_size,
                          commits_page_size=commits_page_size)
        self.api.latency_s = latency_s
        self.host, self.port = host, port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._requests = 0
        self._faults_done: collections.Counter = collections.Counter()
        self._forced: list[tuple[str, tuple[str, ...]]] = []
        self._lost_toggle = 0
        self._late: list = []
        self._fail_at: tuple[int, str, bool] | None = None  # (requests left before the fault, kind, down after it)
        self._down = False
        self.calls: list[tuple[str, str]] | None = None  # (method, endpoint) of each request, after record_calls()
        self.set_faults()

    # -- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> "HubEmulator":
        """Bind and serve in a daemon thread; ``self.url`` is then ``http://host:port``."""
        server = _Server((self.host, self.port), _Handler)
        server.emulator = self
        self._server, self.port = server, server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name=f"hub-emulator:{self.port}",
                                        daemon=True)
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        """Stop serving, close every open client connection and end the jobs' processes."""
        self.api.jobs.stop_all()
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._server = None

    def __enter__(self) -> "HubEmulator":
        return self if self._server else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- knobs ---------------------------------------------------------------------------------------------
    def set_latency(self, s: float) -> None:
        """Seconds slept inside the commit critical section (makes concurrent commits see 409)."""
        self.api.latency_s = float(s)

    def set_commit_quota(self, per_hour: int | None, clock=time.time) -> None:
        """Answer a commit with the Hub's 429 once a repo made ``per_hour`` commits in the rolling hour of ``clock``
        (None: no quota, the default)."""
        self.api.commit_quota, self.api.quota_clock = (None if per_hour is None else int(per_hour)), clock

    def set_faults(self, rate: float = 0.0, kinds=ALL_FAULTS, seed: int = 0, paths=("commit",), *,
                   ratelimit_reset_s: int = 1, timeout_s: float = 0.2) -> None:
        """Inject faults on a fraction ``rate`` of requests to the endpoints named in ``paths`` ('*' = all)."""
        with self._lock:
            self.fault_rate, self.fault_kinds = float(rate), tuple(kinds)
            self.fault_paths = tuple(paths)
            self.ratelimit_reset_s, self.timeout_s = int(ratelimit_reset_s), float(timeout_s)
            self._rng = random.Random(seed)

    def fail_next(self, kind: str, count: int = 1, paths=("commit",)) -> None:
        """Force ``kind`` on the next ``count`` requests to ``paths`` (before any random fault)."""
        with self._lock:
            self._forced.extend([(kind, tuple(paths))] * count)

    def fail_at(self, n: int, kind: str = "500", *, down: bool = False) -> None:
        """Force ``kind`` on request number ``n`` (1-based) from now, whatever its endpoint; with ``down`` every
        later request answers 500 as well, until ``clear_faults`` (as if the client crashed at that call)."""
        with self._lock:
            self._fail_at, self._down = (int(n), kind, bool(down)), False

    def record_calls(self) -> list[tuple[str, str]]:
        """Start a fresh list of the (method, endpoint) of every request from now on (off by default: unbounded)."""
        with self._lock:
            self.calls = []
            return self.calls

    def clear_faults(self) -> None:
        """Forget every forced fault and the random rate, and bring a ``fail_at(down=True)`` server back up."""
        with self._lock:
            self._forced, self._fail_at, self._down = [], None, False
        self.set_faults()

    @property
    def stats(self) -> dict:
        """requests, commits_applied, busy_409 (real lock contention) and faults injected per kind."""
        with self._lock:
            return {"requests": self._requests, **self.api.counts, "faults": dict(self._faults_done)}

    # -- fault injection -----------------------------------------------------------------------------------
    def _draw_fault(self, endpoint: str, method: str = "GET") -> str | None:
        """Count the request and pick its fault: ``fail_at`` first, then a forced one, else random at ``fault_rate``."""
        with self._lock:
            self._requests += 1
            if self.calls is not None:
                self.calls.append((method, endpoint))
            kind = self._scheduled()
            if kind is not None:
                self._faults_done[kind.split("-")[0]] += 1
                return kind
            for i, (kind, paths) in enumerate(self._forced):
                if endpoint in paths or "*" in paths:
                    del self._forced[i]
                    break
            else:
                hit = endpoint in self.fault_paths or "*" in self.fault_paths
                if not (hit and self.fault_kinds and self._rng.random() < self.fault_rate):
                    return None
                kind = self._rng.choice(self.fault_kinds)
            if kind == "lost":
                self._lost_toggle += 1
                kind = "lost-500" if self._lost_toggle % 2 else "lost-reset"
            self._faults_done[kind.split("-")[0]] += 1
            return kind

    def _scheduled(self) -> str | None:
        """The ``fail_at`` fault of this request, if any (under the lock); 'lost' alternates like random faults."""
        if self._down:
            return "500"
        if self._fail_at is None:
            return None
        left, kind, down = self._fail_at
        if left > 1:
            self._fail_at = (left - 1, kind, down)
            return None
        self._fail_at, self._down = None, down
        if kind == "lost":
            self._lost_toggle += 1
            kind = "lost-500" if self._lost_toggle % 2 else "lost-reset"
        return kind

    def _land_late_commits(self) -> None:
        """Apply the commits held back by ``late`` faults (their clients already saw a dropped connection)."""
        with self._lock:
            late, self._late = self._late, []
        for thunk in late:
            try:
                thunk()
            except HubError:
                pass

    def _fault_resp(self, kind: str) -> Resp:
        """The answer for an unapplied fault: 429 with ``RateLimit``, the 409 busy text, or a 500."""
        if kind == "429":
            t = self.ratelimit_reset_s
            return json_resp({"error": f"You have been rate-limited; you can retry this action in {t} seconds."},
                             429, {"RateLimit": f'"api";r=0;t={t}',
                                   "RateLimit-Policy": '"fixed window";"api";q=1000;w=300'})
        if kind == "409":
            return json_resp({"error": BUSY_MESSAGE}, 409)
        return json_resp({"error": "Internal Error - We're working hard to fix this as soon as possible!"}, 500)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False
    emulator: HubEmulator


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "HubEmulator/1.0"
    server: _Server

    def log_message(self, *args) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms Nagle/delayed-ACK stall
        with self.server.emulator._lock:
            self.server.emulator._conns.add(self.connection)

    def finish(self) -> None:
        with self.server.emulator._lock:
            self.server.emulator._conns.discard(self.connection)
        super().finish()

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_HEAD = do_DELETE = do_PUT = do_GET

    def _handle(self) -> None:
        """Read the request, maybe inject a fault, run the endpoint and write the answer."""
        emu = self.server.emulator
        body = self._read_body()
        path, _, qs = self.path.partition("?")
        req = Request(self.command, path, parse_qs(qs, keep_blank_values=True), self.headers, body,
                      f"http://{self.headers.get('Host') or f'{emu.host}:{emu.port}'}")
        endpoint, thunk = emu.api.route(req)
        if endpoint == "commit":
            emu._land_late_commits()
        fault = emu._draw_fault(endpoint, self.command)
        if fault == "late":
            with emu._lock:
                emu._late.append(thunk)
            return self._drop()
        if fault == "timeout":
            time.sleep(emu.timeout_s)
            return self._drop()
        if fault in ("429", "409", "500"):
            return self._send(emu._fault_resp(fault))
        try:
            resp = thunk()
        except HubError as e:
            resp = error_resp(e)
        except Exception as e:  # a bug in the emulator: answer 500 with the traceback, like a real server would
            resp = json_resp({"error": f"emulator bug: {e!r}", "trace": traceback.format_exc()}, 500)
        if fault == "lost-reset":
            return self._drop()
        self._send(emu._fault_resp("500") if fault == "lost-500" else resp)

    def _read_body(self) -> bytes:
        """The request body (Content-Length or chunked), read fully so keep-alive stays in sync."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
                if size == 0:
                    return b"".join(chunks)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, resp: Resp) -> None:
        """Write ``resp``; HEAD answers carry the headers only (and no body at all on errors)."""
        head = self.command == "HEAD"
        body = b"" if head and resp.status >= 400 else resp.body
        self.send_response(resp.status)
        for k, v in resp.headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _drop(self) -> None:
        """Close the connection without an answer (RST), as when a gateway gives up on a request."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass


def main(argv: list[str] | None = None) -> None:
    """Run the emulator in the foreground, print its URL, serve until SIGINT/SIGTERM."""
    ap = argparse.ArgumentParser(prog="python -m tests.support.hub_emulator", description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--data", default=None, help="directory that keeps the repos across restarts")
    ap.add_argument("--user", action="append", default=[], metavar="TOKEN=NAME",
                    help="a token and its user name (repeatable; default hf_test_alice_token=alice)")
    ap.add_argument("--latency", type=float, default=0.0, help="seconds slept inside each commit")
    ap.add_argument("--fault-rate", type=float, default=0.0)
    ap.add_argument("--fault-kinds", default=",".join(ALL_FAULTS))
    ap.add_argument("--fault-paths", default="commit", help="comma-separated endpoint names, or *")
    ap.add_argument("--commit-quota", type=int, default=None, help="commits per repo per rolling hour (the Hub: ~128)")
    args = ap.parse_args(argv)
    users = dict(u.split("=", 1) for u in args.user) or {"hf_test_alice_token": "alice"}
    emu = HubEmulator(users, args.latency, args.host, args.port, data_dir=args.data)
    emu.set_faults(args.fault_rate, tuple(args.fault_kinds.split(",")), paths=tuple(args.fault_paths.split(",")))
    emu.set_commit_quota(args.commit_quota)
    emu.start()
    print(emu.url, flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    emu.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
