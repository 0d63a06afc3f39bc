"""What an anonymous visitor can send a served Space, as raw HTTP on a socket (no tests here): oversized bodies,
declared or chunked, sent as fast as the server reads them; slow bodies; and the server's memory while it happens.

Used by ``tests/system/test_anonymous_visitor.py`` and ``benchmarks/load/anonymous_memory.py``. A body is never held whole on
this side: one chunk is sent again and again, so a 600 MiB attack costs the sender a megabyte.
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


@dataclass
class Outcome:
    """What one request got: the HTTP status (None: no answer), the JSON body if any, the body bytes sent before
    the answer (or the end), and the seconds it took."""

    status: int | None
    body: dict | None
    sent: int
    seconds: float
    error: str | None = None

    @property
    def code(self) -> str | None:
        error = (self.body or {}).get("error")
        return error.get("code") if isinstance(error, dict) else None

    @property
    def message(self) -> str:
        error = (self.body or {}).get("error")
        return f"{error.get('message')} / {error.get('hint')}" if isinstance(error, dict) else str(self.body)[:300]


def _read_answer(sock: socket.socket, deadline: float) -> tuple[int | None, dict | None]:
    """The status and JSON body of the HTTP answer on ``sock`` (read until the body is complete or closed)."""
    data = b""
    while time.monotonic() < deadline:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep:
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), None)
            if length is not None and len(rest) >= length:
                break
        ready, _, _ = select.select([sock], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        try:
            got = sock.recv(65536)
        except OSError:
            break
        if not got:
            break
        data += got
    head, _, rest = data.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None, None
    try:
        body = json.loads(rest) if rest.strip() else None
    except ValueError:
        body = {"raw": rest[:300].decode(errors="replace")}
    return status, body if isinstance(body, dict) else {"raw": body}


def body_bytes(prefix: bytes, suffix: bytes, size: int, offset: int, n: int) -> bytes:
    """Bytes ``offset .. offset + n`` of the body ``prefix + b"A" * … + suffix`` that is ``size`` bytes long."""
    end = min(size, offset + n)
    head = prefix[offset:end]
    tail_start = size - len(suffix)
    middle = max(0, min(end, tail_start) - max(offset, len(prefix)))
    tail = suffix[max(0, offset - tail_start): max(0, end - tail_start)]
    return head + b"A" * middle + tail


def send(url: str, path: str, *, size: int, declared: bool = True, headers: dict | None = None,
         prefix: bytes = b'{"data": ["', suffix: bytes = b'"]}', content_type: str | None = "application/json",
         chunk: int = MiB, rate_bps: float | None = None, early_wait_s: float = 0.3,
         timeout_s: float = 120.0, body: bool = True) -> Outcome:
    """POST a body of ``size`` bytes (``prefix``, filler, ``suffix``: valid JSON by default) to ``path``: with a
    Content-Length (``declared``) or chunked; at ``rate_bps`` bytes per second (a slow body) or as fast as the
    server reads. Stops sending as soon as the server answers (or closes), and reports what it answered.
    ``body=False``: send only the headers and wait ``early_wait_s`` for an answer to them."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout_s)
    t0, sent, deadline = time.monotonic(), 0, time.monotonic() + timeout_s
    lines = [f"POST {path} HTTP/1.1", f"Host: {parts.hostname}:{parts.port}"]
    lines += [f"Content-Type: {content_type}"] if content_type else []
    lines += [f"Content-Length: {size}"] if declared else ["Transfer-Encoding: chunked"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    try:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        sock.setblocking(False)
        if select.select([sock], [], [], early_wait_s)[0] or not body:  # refused on its headers alone
            return _answered(sock, min(deadline, time.monotonic() + 1.0), sent, t0)
        step = chunk if rate_bps is None else max(1, int(rate_bps / 10))  # a slow body: a piece every 0.1 s
        while sent < size and time.monotonic() < deadline:
            piece = body_bytes(prefix, suffix, size, sent, step)
            framed = piece if declared else b"%x\r\n" % len(piece) + piece + b"\r\n"
            view = memoryview(framed)
            while view and time.monotonic() < deadline:
                readable, writable, _ = select.select([sock], [sock], [], 1.0)
                if readable:
                    return _answered(sock, deadline, sent, t0)
                if writable:
                    n = sock.send(view)
                    view = view[n:]
            sent += len(piece)
            if rate_bps is not None:
                time.sleep(0.1)
                if select.select([sock], [], [], 0)[0]:
                    return _answered(sock, deadline, sent, t0)
        if not declared:
            _send_all(sock, b"0\r\n\r\n", deadline)
        return _answered(sock, deadline, sent, t0)
    except OSError as e:  # the server closed the connection while the body was being sent
        status, body = _read_answer(sock, time.monotonic() + 2) if sock.fileno() >= 0 else (None, None)
        return Outcome(status, body, sent, time.monotonic() - t0, f"{type(e).__name__}: {e}")
    finally:
        sock.close()


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view and time.monotonic() < deadline:
        if select.select([], [sock], [], 1.0)[1]:
            view = view[sock.send(view):]


def _answered(sock: socket.socket, deadline: float, sent: int, t0: float) -> Outcome:
    status, body = _read_answer(sock, deadline)
    return Outcome(status, body, sent, time.monotonic() - t0)


def concurrently(calls: list) -> list[Outcome]:
    """Run the zero-argument ``calls`` at once (one thread each); their outcomes in order."""
    out: list = [None] * len(calls)

    def run(i, fn):
        out[i] = fn()

    threads = [threading.Thread(target=run, args=(i, fn), daemon=True) for i, fn in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def count_whoami(emu, delay_s: float = 0.0) -> list[int]:
    """Count the requests the Hub emulator ``emu`` routes to whoami-v2 from now on (those it refuses with 401
    too), each answered ``delay_s`` late: a one-element list that grows."""
    counter, original, lock = [0], emu.api.route, threading.Lock()

    def route(req):
        kind, thunk = original(req)
        if kind != "whoami":
            return kind, thunk
        with lock:
            counter[0] += 1

        def slow():
            time.sleep(delay_s)
            return thunk()
        return kind, slow if delay_s else thunk

    emu.api.route = route
    return counter


# ------------------------------------------------------------------------------------------------ memory


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """A ``/proc/<pid>/status`` memory field in KiB (VmRSS: now; VmHWM: the peak since the last reset)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak(pid: int) -> bool:
    """Reset the process's peak RSS (VmHWM) to its current RSS (Linux: ``echo 5 > /proc/<pid>/clear_refs``)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class PeakSampler:
    """Samples a process's RSS every ``interval`` seconds in a thread; ``peak`` in KiB (with VmHWM when reset
    works, which also catches a spike between two samples)."""

    def __init__(self, pid: int, interval: float = 0.01):
        self.pid, self.interval = pid, interval
        self.samples_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.hwm_reset = False

    def __enter__(self) -> "PeakSampler":
        self.hwm_reset = reset_peak(self.pid)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples_peak = max(self.samples_peak, rss_kib(self.pid))
            except (OSError, KeyError):
                return
            time.sleep(self.interval)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak(self) -> int:
        hwm = rss_kib(self.pid, "VmHWM") if self.hwm_reset else 0
        return max(self.samples_peak, hwm)


# ------------------------------------------------------------------------------------------------ the server


def start_space(repo_id: str, port: int, env: dict, log: Path, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    """``hubgrpo space --repo REPO_ID --host 127.0.0.1 --port PORT`` in its own session (``env`` names the Hub,
    the coordinator's token and secret); wait for its line saying it serves."""
    cmd = [sys.executable, "-m", "hubgrpo.cli", "space", "--repo", repo_id, "--host", "127.0.0.1", "--port",
           str(port), "--batch-wait-s", "0.2", *extra]
    out = open(log, "ab")
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=str(ROOT),
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if "coordinator + UI for" in log.read_text(errors="replace"):
            return proc
        if proc.poll() is not None:
            raise RuntimeError(f"hubgrpo space exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"hubgrpo space did not start:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    """End the server process we started (its process group), and reap it."""
    from tests.support.chaos_helpers import kill

    kill(proc)


# ------------------------------------------------------------------------------------------------ the attacks

UPLOAD_PREFIX = b'{"data": [{"lease_id": "x"}, {"adapter_model.safetensors": "'
UPLOAD_SUFFIX = b'"}]}'
JOIN_PREFIX = b'{"fn_index": 0, "session_hash": "visitor", "data": ["'
JOIN_SUFFIX = b'"]}'
MULTIPART = "multipart/form-data; boundary=visitorboundary"
FILE_PREFIX = (b'--visitorboundary\r\nContent-Disposition: form-data; name="files"; filename="a.bin"\r\n'
               b"Content-Type: application/octet-stream\r\n\r\n")
FILE_SUFFIX = b"\r\n--visitorboundary--\r\n"


def big_bodies(scale: float = 1.0) -> list[tuple[str, dict]]:
    """The oversized anonymous bodies, one request each: (label, ``send`` keyword arguments). ``scale`` 1.0: the
    issue's sizes (600 MiB on the upload route, 400 MiB on Gradio's)."""
    up, gr = int(600 * MiB * scale), int(400 * MiB * scale)
    upload = {"prefix": UPLOAD_PREFIX, "suffix": UPLOAD_SUFFIX}
    return [
        ("plain upload, declared", {"path": "/hubgrpo/api/upload", "size": up, **upload}),
        ("plain upload, chunked", {"path": "/hubgrpo/api/upload", "size": up, "declared": False, **upload}),
        ("plain lease, chunked", {"path": "/hubgrpo/api/lease", "size": gr, "declared": False}),
        ("plain status, declared", {"path": "/hubgrpo/api/status", "size": gr}),
        ("gradio /run/upload, declared", {"path": "/gradio_api/run/upload", "size": gr, **upload}),
        ("gradio /run/upload, chunked", {"path": "/gradio_api/run/upload", "size": gr, "declared": False, **upload}),
        ("gradio /call/upload, declared", {"path": "/gradio_api/call/upload", "size": gr, **upload}),
        ("gradio /queue/join, declared", {"path": "/gradio_api/queue/join", "size": gr, "prefix": JOIN_PREFIX,
                                          "suffix": JOIN_SUFFIX}),
        ("gradio /upload (files), declared", {"path": "/gradio_api/upload", "size": gr, "prefix": FILE_PREFIX,
                                              "suffix": FILE_SUFFIX, "content_type": MULTIPART}),
        ("gradio /upload (files), chunked", {"path": "/gradio_api/upload", "size": gr, "prefix": FILE_PREFIX,
                                             "suffix": FILE_SUFFIX, "content_type": MULTIPART, "declared": False}),
    ]


def concurrent_bodies(scale: float = 1.0, n: int = 6) -> list[tuple[str, dict]]:
    """``n`` big anonymous bodies meant to be sent at once, on the upload routes (plain and Gradio's)."""
    size = int(200 * MiB * scale)
    upload = {"prefix": UPLOAD_PREFIX, "suffix": UPLOAD_SUFFIX}
    paths = ["/hubgrpo/api/upload", "/gradio_api/run/upload", "/gradio_api/queue/join"]
    return [(f"concurrent {i}: {paths[i % 3]}", {"path": paths[i % 3], "size": size, **upload}) for i in range(n)]


def send_head(port: int, start: bytes, total: int, timeout_s: float = 60.0) -> tuple[int, bytes]:
    """Send ``start`` then ``total`` bytes of ``a`` (a request line or a header that never ends) as fast as the
    server reads them; stop when it answers or closes. The bytes sent and what it answered."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    sent, answer, deadline = 0, b"", time.monotonic() + timeout_s
    piece = memoryview(b"a" * MiB)
    try:
        sock.sendall(start)
        sock.setblocking(False)
        while sent < total and time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [sock], [], 1.0)
            if readable:
                break
            if writable:
                sent += sock.send(piece[: min(MiB, total - sent)])
        if select.select([sock], [], [], 5.0)[0]:
            answer = sock.recv(65536)
    except OSError:  # the server closed the connection while the head was being sent
        pass
    finally:
        sock.close()
    return sent, answer


def queued_call(url: str, i: int) -> int:
    """One anonymous 60 KB call on Gradio's queued routes (``/gradio_api/call/status`` for odd ``i``, else
    ``/gradio_api/queue/join``), its answer never read; the HTTP status."""
    import httpx

    path = "/gradio_api/call/status" if i % 2 else "/gradio_api/queue/join"
    extra = {} if i % 2 else {"fn_index": 0, "session_hash": f"visitor{i}"}
    with httpx.Client(timeout=30) as c:
        return c.post(url + path, json={"data": ["x" * 60_000], **extra}).status_code
