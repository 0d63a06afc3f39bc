"""Raw HTTP to a coordinator: its plain routes, or a Gradio app's call API, over one bounded ``httpx.Client``.

``POST {url}/hubgrpo/api/<name>`` (the coordinator's plain routes, ``hubgrpo.space.routes``: a fraction of Gradio's
server CPU per call), falling back to ``POST {url}/gradio_api/run/<name>`` (Gradio's one-round-trip API;
coordinators before the plain routes) and then to the queued ``POST /gradio_api/call/<name>`` + SSE ``GET`` when
``/run`` answers 404/405 (``route`` picks where to start: ``plain``, ``run`` or ``call``).

A coordinator's answers are untrusted (``hubgrpo.worker.bounded_http``): the token goes only to the coordinator's
origin, no redirect is followed (``redirect``), an answer is read up to ``MAX_ANSWER_BYTES`` (``too_large``) and each
attempt has an overall deadline.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import httpx

from hubgrpo import upload_body
from hubgrpo.errors import CoordinatorError, wire_text
from hubgrpo.worker.bounded_http import (
    MIN_BODY_RATE,
    Deadline,
    OriginToken,
    TooLarge,
    Unavailable,
    bounded_client,
    http_failure,
    read_capped,
    redirect_error,
)
from hubgrpo.worker.json_body import Base64Text, json_body

API_PREFIX = "/gradio_api"
PLAIN_PREFIX = "/hubgrpo/api"  # the coordinator's plain routes (hubgrpo.space.routes)
MAX_ANSWER_BYTES = 4 << 20  # the most of a coordinator's answer a worker reads (a lease, a verdict: a few KiB)
MAX_STATUS_BYTES = 16 << 20  # ... of a status (every version's row and the unsaved refusals: MiBs in long runs), or
# of a round's files for a verifier (round_files: a rollouts file in base64)


def _too_large(where: str, name: str, limit: int) -> CoordinatorError:
    return CoordinatorError(
        f"the coordinator at {where} answered {name} with more than {limit >> 20} MiB; the worker stopped reading",
        code="too_large",
        hint="a hubgrpo coordinator's answers are small: check the URL you were given",
    )


class HttpTransport:
    """Raw HTTP to the coordinator's plain routes (``/hubgrpo/api/<name>``) or a Gradio app's call API, over one
    persistent (thread-safe) ``httpx.Client`` that sends the token only to this origin (``OriginToken``), follows
    no redirect (a 3xx is the error ``redirect``), reads at most ``MAX_ANSWER_BYTES`` of an answer
    (``MAX_STATUS_BYTES`` of a status; more is ``too_large``) and gives each call ``timeout`` seconds in all (plus
    the time its body takes at ``MIN_BODY_RATE``), however the answer trickles in."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None,
        timeout: float,
        route: str = "plain",
        http_transport: httpx.BaseTransport | None = None,
    ):
        self.url = url.rstrip("/")
        self.route = route
        self._http_transport = http_transport
        self._auth = OriginToken(token, self.url)
        self._timeout = timeout
        self._deadline = Deadline()
        self._http: httpx.Client | None = None
        self._lock = threading.Lock()

    def _client(self) -> httpx.Client:
        with self._lock:
            if self._http is None:
                extra = {} if self._http_transport is None else {"transport": self._http_transport}
                self._http = bounded_client(
                    base_url=self.url, auth=self._auth, timeout=self._timeout, deadline=self._deadline, **extra
                )
            return self._http

    def _send(
        self, method: str, path: str, name: str, body: bytes | None = None, media: str = "application/json"
    ) -> tuple[int, bytes]:
        """(status, answer) of one request; a redirect or an oversized answer is refused."""
        limit = MAX_STATUS_BYTES if name in ("status", "round_files") else MAX_ANSWER_BYTES
        headers = {"Content-Type": media} if body is not None else {}
        with self._client().stream(method, path, content=body, headers=headers) as resp:
            if 300 <= resp.status_code < 400:
                raise redirect_error(self.url, resp.status_code, resp.headers.get("location"))
            try:
                return resp.status_code, read_capped(resp, limit, self._deadline)
            except TooLarge:
                raise _too_large(self.url, name, limit) from None

    def _check(self, status: int, data: bytes, path: str) -> bytes:
        if status >= 500 or status in (408, 429):
            raise Unavailable(f"HTTP {status}")
        if not 200 <= status < 300:
            code = "auth" if status in (401, 403) else "protocol"
            raise CoordinatorError(
                f"the coordinator at {self.url} answered HTTP {status} for {path}: "
                f"{wire_text(data[:200].decode(errors='replace'))}",
                code=code,
                hint="check the URL, the token, and that the app is a hubgrpo coordinator",
            )
        return data

    def call(self, name: str, args: list) -> Any:
        """POST ``args`` to endpoint ``name`` and return its (enveloped) answer."""
        body = json_body({"data": args})  # a round's files (``Base64Text``) go in without being scanned
        return self._guarded(body, lambda: self._call(name, body))

    def call_files(self, name: str, args: list) -> Any:
        """POST ``args`` of ``upload``, whose files are ``{file name: bytes}``: on the plain route as the binary body
        (``hubgrpo.upload_body``: the bytes as they are), elsewhere (Gradio's routes) as base64 in the JSON body."""
        if self.route != "plain":
            files = {k: Base64Text.of(v) for k, v in args[upload_body.FILES_AT].items()}
            return self.call(name, [*args[: upload_body.FILES_AT], files, *args[upload_body.FILES_AT + 1 :]])
        body = upload_body.pack(args)
        return self._guarded(body, lambda: self._plain_binary(name, body))

    def _plain_binary(self, name: str, body: bytes) -> Any:
        answer = self._plain(name, body, upload_body.MEDIA_TYPE)
        if answer is None:
            raise ValueError(f"no plain route {PLAIN_PREFIX}/{name} for a binary body")
        return answer

    def _guarded(self, body: bytes, send: Any) -> Any:
        """``send()`` within the call's deadline, its failures as the API's errors."""
        try:
            with self._deadline.within(self._timeout + len(body) / MIN_BODY_RATE):
                return send()
        except httpx.HTTPError as e:
            raise http_failure(e, self.url) from None
        except (ValueError, KeyError, IndexError, TypeError) as e:  # body not the JSON we expect
            raise CoordinatorError(
                f"unexpected answer from the coordinator at {self.url}: {wire_text(str(e), 300)}",
                code="protocol",
                hint="is this URL a hubgrpo coordinator?",
            ) from None

    def _plain(self, name: str, body: bytes, media: str = "application/json") -> Any:
        """The enveloped answer of the plain route ``name`` (also a 400/404/413 naming the problem); None when the
        coordinator has no such route (404/405 without an envelope)."""
        path = f"{PLAIN_PREFIX}/{name}"
        status, data = self._send("POST", path, name, body, media)
        answer = _envelope(status, data)
        if answer is None and status not in (404, 405):
            self._check(status, data, path)  # 5xx: Unavailable (retried); anything else: a protocol error
            raise ValueError(f"HTTP {status} without an envelope from {path}")
        return answer

    def _call(self, name: str, body: bytes) -> Any:
        if self.route == "plain":
            answer = self._plain(name, body)
            if answer is not None:
                return answer
            self.route = "run"  # a coordinator without plain routes (older hubgrpo): Gradio's API
        if self.route == "run":
            path = f"{API_PREFIX}/run/{name}"
            status, data = self._send("POST", path, name, body)
            if status not in (404, 405):
                return json.loads(self._check(status, data, path))["data"][0]
            self.route = "call"  # endpoint queued (e.g. on a Space): use the queue's call API
        return self._queued(name, body)

    def _queued(self, name: str, body: bytes) -> Any:
        """The queued path: POST /call/<name> → event id, then GET the SSE stream until ``complete``."""
        path = f"{API_PREFIX}/call/{name}"
        event_id = json.loads(self._check(*self._send("POST", path, name, body), path))["event_id"]
        if not isinstance(event_id, str) or not re.fullmatch(r"[\w-]{1,100}", event_id):
            raise ValueError(f"event id {str(event_id)[:40]!r}")
        text = self._check(*self._send("GET", f"{path}/{event_id}", name), path).decode(errors="replace")
        event = None
        for line in text.splitlines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == "complete":
                return json.loads(line[5:])[0]
            elif line.startswith("data:") and event == "error":
                raise CoordinatorError(
                    f"the app at {self.url} failed on {name!r}: {wire_text(line[5:].strip(), 200)}",
                    code="protocol",
                    hint="client and coordinator versions may differ",
                )
        raise Unavailable("the event stream ended without a result")

    def close(self) -> None:
        """Close the connection pool."""
        with self._lock:
            if self._http is not None:
                self._http.close()
                self._http = None


def _envelope(status: int, data: bytes) -> dict | None:
    """The envelope a plain route answered (any status below 500), or None (not a hubgrpo answer)."""
    if status >= 500:
        return None
    try:
        body = json.loads(data)
    except ValueError:
        return None
    return body if isinstance(body, dict) and "ok" in body else None
