"""Bodies before authentication: an ASGI middleware in front of every route of the coordinator's app.

The coordinator's endpoints are served three ways — the plain routes (``/hubgrpo/api/<name>``), Gradio's own
(``/gradio_api/run|call|api/<name>``, ``/gradio_api/queue/join``) and Gradio's file ``/gradio_api/upload`` —
and Gradio reads and parses a whole body before any endpoint function (and its auth) runs. ``BodyGuard`` sits in
front of all of them and decides, from the headers alone, how much body a request may send:

- anonymous (no token, a token that is refused, or one that cannot be checked now): ``PRE_AUTH_BODY`` (64 KiB —
  a lease, a heartbeat, a status, the page's own calls);
- a user of the run (``HubAuth.identify`` on the ``Authorization`` / ``X-HF-Authorization`` header: an allowed
  user or an evaluator, checked before the body is read): the run's upload limit on the routes that carry an
  ``upload`` (``UPLOAD_PATHS``), ``MAX_BODY`` (1 MiB) elsewhere;
- no auth at all (a repo with no Hub owner, served on loopback): as a user.

A declared ``Content-Length`` over the limit is refused at once (413, no byte read); a chunked body is cut when it
passes the limit (413). Every body must arrive at ``MIN_BODY_RATE`` bytes/s on average after ``BODY_GRACE_S``
(408 otherwise), so a slow body holds nothing for long. A user's large bodies on the upload routes take one of
their ``SLOTS_PER_USER`` slots (and one of ``SLOTS`` in all) — after authentication, so an anonymous visitor never
takes one. Refusals are the API's envelope, code ``protocol`` (``rate`` for a slot, with ``wait_s``).

Before any of this, the request line and headers: uvicorn's httptools protocol keeps a head of any size in memory,
so the app is served with its h11 protocol, which refuses a head over 16 KiB (``bound_heads``). Gradio's file route
``/gradio_api/upload`` takes no body at all (this app has no file component; each file sent there stayed on disk).
Gradio's queued routes (``QUEUED``: ``/gradio_api/call/<name>``, ``/gradio_api/queue/join``) keep every call, its
body and its answer, until the answer is read: with auth, a body there must come from a user of the run (401
before the body otherwise); the public ``status`` is served where nothing is kept (``/hubgrpo/api/status``,
``/gradio_api/run/status``).

Installed by ``install(blocks)`` (``hubgrpo.space.api.build_app``): ``blocks.launch`` then passes the middleware to
the FastAPI app it creates (``app_kwargs``), on a Space too, and refuses to serve a non-loopback address without
auth (``check_exposure``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import anyio

log = logging.getLogger("hubgrpo.space.guard")

PRE_AUTH_BODY = 64 << 10  # bytes a request may send before it is known whose it is
MAX_BODY = 1 << 20  # a user's body on a route that carries no upload
MIN_BODY_RATE = 32 << 10  # bytes per second a body must average ...
BODY_GRACE_S = 10.0  # ... after this many seconds
SLOTS_PER_USER = 4  # a user's large upload bodies in flight at once
SLOTS = 16  # large upload bodies in flight at once, all users
SLOT_WAIT_S = 30.0  # longest a large body waits for a slot before it is refused with `rate`
IDENTIFY_THREADS = 8  # header checks (whoami on a cache miss) running at once
FILE_ROUTE = "/gradio_api/upload"  # Gradio's file upload: this app has no file component, so it takes no body
QUEUED = ("/gradio_api/call/", "/gradio_api/queue/join")  # Gradio keeps each call there until its answer is read
UPLOAD_PATHS = frozenset(
    {
        "/hubgrpo/api/upload",
        "/gradio_api/run/upload",
        "/gradio_api/api/upload",
        "/gradio_api/call/upload",
        "/gradio_api/call/v2/upload",
        "/gradio_api/queue/join",
    }
)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass
class Policy:
    """What a served app allows: the auth hook (None: no auth) and the upload routes' body limit."""

    auth: Any
    upload_limit: int = MAX_BODY


def envelope(status: int, message: str, hint: str, code: str = "protocol", wait_s: float | None = None) -> Any:
    """The API's error envelope as a JSON response."""
    from starlette.responses import JSONResponse

    error: dict[str, Any] = {
        "error": "CoordinatorError" if code == "protocol" else "Refused",
        "code": code,
        "message": message,
        "hint": hint,
    }
    if wait_s is not None:
        error["wait_s"] = round(float(wait_s), 2)
    return JSONResponse({"ok": False, "error": error}, status_code=status)


def refusal(err: Any) -> Any:
    """A refusal of the auth hook (a ``HubGrpoError``) as the API's envelope: 401 for ``auth``, 429 for ``rate``
    (with its ``wait_s``), 503 otherwise (the Hub could not be asked)."""
    from starlette.responses import JSONResponse

    from hubgrpo.space.wire import error_dict

    error = error_dict(err)
    if "wait_s" in error:
        error["wait_s"] = round(error["wait_s"], 2)
    return JSONResponse({"ok": False, "error": error}, status_code={"auth": 401, "rate": 429}.get(err.code, 503))


def is_loopback(host: str | None) -> bool:
    import ipaddress

    host = (host or "").strip("[]")
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str | None, auth: Any) -> None:
    """Refuse to serve a coordinator without auth anywhere but a loopback address."""
    from hubgrpo.errors import ConfigError

    if auth is None and not is_loopback(host):
        raise ConfigError(
            f"refusing to serve the coordinator on {host} without auth: anyone who reaches it could "
            "lease, submit and record held-out scores",
            hint="name the users in coordinator.allowed_users (and coordinator.evaluators) of the "
            "run's config, or serve on 127.0.0.1",
        )


class Slots:
    """Large upload bodies in flight, per user and in all (event-loop only: no lock)."""

    def __init__(self, per_user: int = SLOTS_PER_USER, total: int = SLOTS):
        self.per_user, self.total = per_user, total
        self.held: dict[str, int] = {}

    async def take(self, user: str, wait_s: float = SLOT_WAIT_S) -> bool:
        import anyio

        deadline = time.monotonic() + wait_s
        while self.held.get(user, 0) >= self.per_user or sum(self.held.values()) >= self.total:
            if time.monotonic() >= deadline:
                return False
            await anyio.sleep(0.05)
        self.held[user] = self.held.get(user, 0) + 1
        return True

    def give(self, user: str) -> None:
        self.held[user] -= 1
        if not self.held[user]:
            del self.held[user]


class BodyGuard:
    """The ASGI middleware (see the module docstring); ``policy()`` is read per request (None: pass through)."""

    def __init__(self, app: Any, policy: Callable[[], Policy | None]):
        self.app, self.policy = app, policy
        self.slots = Slots()
        self._threads: anyio.CapacityLimiter | None = None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        policy = self.policy() if scope["type"] == "http" else None
        if policy is None:
            return await self.app(scope, receive, send)
        from starlette.datastructures import Headers

        headers = Headers(scope=scope)
        declared, chunked = headers.get("content-length"), "chunked" in headers.get("transfer-encoding", "").lower()
        if not chunked and (declared is None or declared.strip() == "0"):
            return await self.app(scope, receive, send)  # no body
        if not chunked and not (declared or "").strip().isdigit():  # (set: without one, it returned above)
            return await envelope(400, "the Content-Length header is not a number", "send a valid HTTP request")(
                scope, receive, send
            )
        size = None if chunked else int(declared or 0)
        if scope["path"].rstrip("/") == FILE_ROUTE:
            return await self._no_files(size)(scope, receive, send)
        upload = scope["path"].rstrip("/") in UPLOAD_PATHS
        queued = scope["path"].startswith(QUEUED)
        user = await self._user(policy, scope, size, queued)
        limit = PRE_AUTH_BODY if user is None else policy.upload_limit if upload else MAX_BODY
        if size is not None and size > limit:
            return await self._too_large(size, limit, user, upload)(scope, receive, send)
        if queued and user is None:
            failed = scope.get("hubgrpo.identify_error")
            if failed is not None and failed.code != "auth":  # rate-limited, or the Hub could not be asked
                return await refusal(failed)(scope, receive, send)
            return await envelope(
                401,
                f"{scope['path'][:80]} is for the run's users: Gradio keeps every call there until its answer is read",
                "send your Hugging Face token in the Authorization: "
                "Bearer header; anyone may read the status at /hubgrpo/api/status",
                code="auth",
            )(scope, receive, send)
        cut = self._too_large(None, limit, user, upload)
        if user is None or not upload or (size is not None and size <= PRE_AUTH_BODY):
            return await self._guarded(scope, receive, send, limit, size, cut)
        if not await self.slots.take(user):
            return await envelope(
                429,
                f"{user} has {self.slots.per_user} uploads in progress already (or the coordinator {self.slots.total})",
                f"wait_s={SLOT_WAIT_S:g}; upload again later",
                code="rate",
                wait_s=SLOT_WAIT_S,
            )(scope, receive, send)
        try:
            await self._guarded(scope, receive, send, limit, size, cut)
        finally:
            self.slots.give(user)

    async def _user(self, policy: Policy, scope: dict, size: int | None, queued: bool = False) -> str | None:
        """Whose request this is, from its headers: a user of the run, the caller's address when there is no
        auth, or None (anonymous) — asked only when the body may be larger than anonymous bodies may be, or on
        Gradio's queued routes (``QUEUED``)."""
        from starlette.requests import Request

        from hubgrpo.space.auth import client_address, request_token

        request = Request(scope)
        if policy.auth is None:
            return f"address {client_address(request)}"
        identify = getattr(policy.auth, "identify", None)
        token = request_token(request)
        if identify is None or not token or (size is not None and size <= PRE_AUTH_BODY and not queued):
            return None
        import anyio

        if self._threads is None:
            self._threads = anyio.CapacityLimiter(IDENTIFY_THREADS)
        try:
            return await anyio.to_thread.run_sync(identify, token, request, limiter=self._threads)
        except Exception as e:  # deliberate: refused, rate-limited or unavailable all mean "anonymous" here
            log.debug("body of an unidentified caller: %s", type(e).__name__)
            if getattr(e, "code", None):
                scope["hubgrpo.identify_error"] = e  # a queued route answers why (``__call__``)
            return None

    @staticmethod
    def _no_files(size: int | None) -> Any:
        """The refusal of any body on Gradio's file route: each file sent there stayed on the server's disk."""
        what = f"the body ({size:,} bytes)" if size is not None else "the body"
        return envelope(
            413,
            f"{what} is larger than the limit of 0 bytes: this coordinator takes no files on {FILE_ROUTE}",
            "a round goes to the upload endpoint as JSON, with the token in the "
            f"Authorization: Bearer header (bodies before authentication are limited to "
            f"{PRE_AUTH_BODY:,} bytes)",
        )

    @staticmethod
    def _too_large(size: int | None, limit: int, user: str | None, upload: bool) -> Any:
        what = f"the body ({size:,} bytes)" if size is not None else "the body"
        if user is None:
            hint = (
                f"bodies before authentication are limited to {PRE_AUTH_BODY:,} bytes: send your Hugging Face "
                "token in the Authorization: Bearer header"
            )
        elif upload:
            hint = "an upload holds one round of this run: its adapter (the global adapter's size) and its rollouts"
        else:
            hint = "send what the hubgrpo client sends"
        return envelope(413, f"{what} is larger than the limit of {limit:,} bytes", hint)

    async def _guarded(
        self, scope: dict, receive: Callable, send: Callable, limit: int, size: int | None, too_large: Any
    ) -> None:
        """Run the app with a receive that counts the body and times it; a body cut short is answered here
        (``too_large``, or 408), unless the app has begun its answer, and the app sees a disconnect."""
        started = time.monotonic()
        deadline = started + BODY_GRACE_S + (size if size is not None else limit) / MIN_BODY_RATE
        state = {"got": 0, "done": False, "cut": False, "answered": False, "app_answers": False}

        async def cut(response: Any) -> dict:
            state["cut"] = True
            if not state["app_answers"]:
                state["answered"] = True
                await response(scope, receive, send)
            return {"type": "http.disconnect"}

        async def guarded_receive() -> dict:
            import anyio

            if state["cut"]:
                return {"type": "http.disconnect"}
            if state["done"]:
                return await receive()  # the body is in: what follows (a disconnect) is not timed
            message = None
            with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
                message = await receive()
            if message is None:
                return await cut(
                    envelope(
                        408,
                        f"the body came too slowly: {state['got']:,} bytes in {time.monotonic() - started:.0f} s",
                        f"a body must average {MIN_BODY_RATE:,} bytes/s after {BODY_GRACE_S:g} s",
                    )
                )
            if message["type"] == "http.request":
                state["got"] += len(message.get("body", b""))
                state["done"] = not message.get("more_body", False)
                if state["got"] > limit:
                    return await cut(too_large)
            return message

        async def guarded_send(message: dict) -> None:
            if state["answered"]:
                return  # the refusal is the answer
            state["app_answers"] = True
            await send(message)

        try:
            await self.app(scope, guarded_receive, guarded_send)
        except Exception:
            if not state["cut"]:
                raise  # the app's own failure, not a body cut short


def bound_heads() -> None:
    """Serve with uvicorn's h11 protocol, which answers 400 to a request line and headers over 16 KiB (h11's
    ``max_incomplete_event_size``): the ``auto`` choice, httptools when it is installed, keeps a head of any size
    in memory (one 300 MiB header: +600 MiB, before any middleware runs). Gradio builds its ``uvicorn.Config``
    itself, with ``auto``."""
    from uvicorn import config

    config.HTTP_PROTOCOLS["auto"] = config.HTTP_PROTOCOLS["h11"]


def install(blocks: Any, auth: Any) -> None:
    """Serve ``blocks`` behind ``BodyGuard`` (policy ``blocks.hubgrpo_guard``): every later ``blocks.launch()``
    passes the middleware to the app it creates and refuses a non-loopback address without auth."""
    from starlette.middleware import Middleware

    blocks.hubgrpo_guard = Policy(auth=auth)
    if getattr(blocks, "hubgrpo_guarded", False):
        return
    bound_heads()
    launch = blocks.launch

    def guarded_launch(*args: Any, **kwargs: Any) -> Any:
        check_exposure(
            kwargs.get("server_name") or os.environ.get("GRADIO_SERVER_NAME") or "127.0.0.1", blocks.hubgrpo_guard.auth
        )
        app_kwargs = dict(kwargs.get("app_kwargs") or {})
        app_kwargs["middleware"] = [
            *app_kwargs.get("middleware", []),
            Middleware(BodyGuard, policy=lambda: getattr(blocks, "hubgrpo_guard", None)),
        ]
        return launch(*args, **{**kwargs, "app_kwargs": app_kwargs})

    blocks.launch = guarded_launch
    blocks.hubgrpo_guarded = True
