"""HTTP to servers a worker does not trust: its coordinator (just a URL it was given) and the upload URLs the
coordinator's leases carry.

- ``OriginToken``: the token goes only to the one origin it was given (and only over https or to loopback), as
  an ``Authorization`` header, never in a body; a request to any other origin is refused before it is sent
  (code ``redirect``). Redirects are never followed (``bounded_client``).
- ``Deadline``: httpx's timeout bounds each read, so a server trickling a byte a second holds a call for ever.
  ``bounded_client`` wraps the connections' network streams so that every connect, read and write of a request
  also stops at the deadline its caller set (``with deadline.within(seconds):``); the timeout is an httpx
  ``ReadTimeout``/``WriteTimeout``/``ConnectTimeout``, like any other.
- ``read_capped``: an answer is read up to a size limit (compressed answers are inflated within the same limit),
  then ``TooLarge``: a 200 MiB answer costs the worker at most the limit.
- ``http_failure``: a transport library's exception as ``Unavailable`` (retry) or a ``CoordinatorError``.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import CancelledError
from contextlib import contextmanager
from urllib.parse import urljoin, urlsplit

import httpcore
import httpx

from hubgrpo.errors import CoordinatorError, wire_text

log = logging.getLogger(__name__)
MIN_BODY_RATE = 256 * 1024  # bytes/s a request body may take on top of the timeout (a large upload is slow)


def on_this_machine(url: str) -> bool:
    """Whether ``url``'s host is a loopback address (or ``localhost``)."""
    host = (urlsplit(url).hostname or "").strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_may_go_to(url: str) -> bool:
    """Whether a token may travel to ``url``: https anywhere, plain http only to a loopback address."""
    scheme = urlsplit(url).scheme
    return scheme == "https" or (scheme == "http" and on_this_machine(url))


def origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url`` (what a token is bound to); a readable placeholder if it is junk."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
        return wire_text(f"{parts.scheme}://{parts.hostname or ''}{port}", 200) if parts.scheme else "a relative URL"
    except ValueError:
        return "an unreadable URL"


def redirect_error(url: str, status: int, location: str | None) -> CoordinatorError:
    """The error for a 3xx answer from ``url``: never followed, the target's origin named."""
    where = origin(urljoin(url, location)) if location else "nowhere"
    return CoordinatorError(
        f"the coordinator at {origin(url)} answered HTTP {status}, redirecting to {where}; "
        "hubgrpo never follows a coordinator's redirect (your token and rounds would go where "
        "it says)",
        code="redirect",
        hint="use the coordinator's final https URL (--coordinator / coordinator.url) or its Space id user/space",
    )


class Unavailable(Exception):
    """Internal: the coordinator did not answer (connection, timeout, 5xx); the caller may retry."""


def http_failure(e: BaseException, where: str) -> Exception:
    """Classify a transport-library exception as ``Unavailable`` (retry) or ``CoordinatorError`` (give up)."""
    status = getattr(getattr(e, "response", None), "status_code", None)
    if status is not None:
        if status >= 500 or status in (408, 429):
            return Unavailable(f"HTTP {status}")
        code = "auth" if status in (401, 403) else "protocol"
        return CoordinatorError(
            f"the coordinator at {where} answered HTTP {status}",
            code=code,
            hint="check the URL or Space id, and the token for a private Space",
        )
    if isinstance(e, (httpx.TransportError, TimeoutError, ConnectionError)):
        return Unavailable(f"{type(e).__name__}: {e}")
    if isinstance(e, CancelledError):  # gradio_client: the app's event stream ended before the job's answer
        return Unavailable("the coordinator's event stream closed before the answer came (CancelledError)")
    if isinstance(e, KeyError) and e.args == ("unexpected_error",):  # gradio_client has no status for it
        return Unavailable("the app's event stream failed before the answer (it stopped or broke)")
    return CoordinatorError(
        f"unexpected answer from the coordinator at {where}: {type(e).__name__}: {wire_text(str(e), 300)}",
        code="protocol",
        hint="client and coordinator versions may differ",
    )


class OriginToken(httpx.Auth):
    """Adds ``Authorization: Bearer <token>`` (and gradio_client's ``X-HF-Authorization``, with ``hf_header``) to
    requests for ``url``'s origin, and refuses every request to another origin, token or not."""

    def __init__(self, token: str | None, url: str, *, hf_header: bool = False):
        self._token, self._origin, self._hf_header = token, origin(url), hf_header

    def __repr__(self) -> str:  # never shows the token
        return f"OriginToken({self._origin!r})"

    def auth_flow(self, request: httpx.Request):
        url = str(request.url)
        if origin(url) != self._origin:
            raise CoordinatorError(
                f"refusing a request to {origin(url)}: the coordinator is {self._origin}, and "
                "nothing is ever sent to another origin it names",
                code="redirect",
                hint="the coordinator (or its Gradio config) points elsewhere; use the final "
                "https URL of a coordinator you trust",
            )
        if self._token:
            if not token_may_go_to(url):
                raise CoordinatorError(
                    f"refusing to send your token to {origin(url)} over plain http",
                    code="config",
                    hint="use the coordinator's https URL or its Space id",
                )
            request.headers["Authorization"] = f"Bearer {self._token}"
            if self._hf_header:
                request.headers["X-HF-Authorization"] = f"Bearer {self._token}"
        yield request


class Deadline(threading.local):
    """The instant the current thread's request must be done by (None: no deadline)."""

    at: float | None = None

    @contextmanager
    def within(self, seconds: float) -> Iterator[None]:
        previous, self.at = self.at, time.monotonic() + seconds
        try:
            yield
        finally:
            self.at = previous

    def left(self, timeout: float | None, timed_out: type[Exception]) -> float | None:
        """``timeout`` shortened to what is left, or ``timed_out`` once the deadline has passed."""
        if self.at is None:
            return timeout
        left = self.at - time.monotonic()
        if left <= 0:
            raise timed_out("the whole request took longer than its deadline")
        return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream, deadline: Deadline):
        self._inner, self._deadline = inner, deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._deadline.left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        return self._inner.write(buffer, self._deadline.left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        left = self._deadline.left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, left), self._deadline)

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend, deadline: Deadline):
        self._inner, self._deadline = inner, deadline

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        left = self._deadline.left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_tcp(host, port, left, local_address, socket_options), self._deadline)

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        left = self._deadline.left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_unix_socket(path, left, socket_options), self._deadline)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def bounded_client(*, timeout: float, deadline: Deadline, **kwargs) -> httpx.Client:
    """An ``httpx.Client`` that never follows redirects, asks for uncompressed answers, and whose connections
    stop at ``deadline`` (every transport of the client, env proxies included)."""
    headers = {"Accept-Encoding": "identity", **kwargs.pop("headers", {})}
    client = httpx.Client(timeout=timeout, follow_redirects=False, headers=headers, **kwargs)
    pools = [getattr(t, "_pool", None) for t in [client._transport, *client._mounts.values()] if t is not None]
    wrapped = 0
    for pool in pools:  # httpcore pools (direct, HTTP and SOCKS proxies) make connections with this backend
        if pool is not None and hasattr(pool, "_network_backend"):
            pool._network_backend = _Backend(pool._network_backend, deadline)
            wrapped += 1
    if not wrapped and "transport" not in kwargs:  # a transport of the caller's (tests) is the caller's to bound
        log.warning("httpx %s: cannot bound whole requests in time (only each read is)", httpx.__version__)
    return client


class TooLarge(Exception):
    """An answer went past the size limit its reader set."""

    def __init__(self, limit: int):
        super().__init__(f"more than {limit / 2**20:.0f} MiB")
        self.limit = limit


def read_capped(resp: httpx.Response, limit: int, deadline: Deadline | None = None) -> bytes:
    """The body of a streamed ``resp``, at most ``limit`` bytes once decoded (else ``TooLarge``); the deadline is
    checked between chunks too."""
    if resp.is_stream_consumed:  # read already by the transport (one made in memory: ``httpx.MockTransport``)
        if len(resp.content) > limit:
            raise TooLarge(limit)
        return resp.content
    declared = resp.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge(limit)
    encoding = resp.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity", "gzip", "deflate"):
        raise httpx.DecodingError(f"unsupported content-encoding {wire_text(encoding, 40)!r}")
    inflate = zlib.decompressobj(wbits=47) if encoding in ("gzip", "deflate") else None  # 47: gzip or zlib
    chunks, total = [], 0
    for raw in resp.iter_raw():
        if deadline is not None:
            deadline.left(None, httpx.ReadTimeout)
        try:
            data = inflate.decompress(raw, limit + 1 - total) if inflate else raw
        except zlib.error as e:
            raise httpx.DecodingError(f"a corrupt {encoding} answer: {e}") from None
        total += len(data)
        if total > limit or (inflate and inflate.unconsumed_tail):
            raise TooLarge(limit)
        chunks.append(data)
    return b"".join(chunks)
