"""The coordinator's HTTP API: a thin Gradio layer over a ``Coordinator`` (leases, heartbeats, submissions).

Six ``gr.api`` endpoints, named exactly ``lease``, ``heartbeat``, ``release``, ``submit``, ``status`` and
``record_eval`` (an evaluator's held-out score of a version), take and return plain JSON. Every answer is an envelope, never a raw exception or a traceback::

    {"ok": true,  "result": ...}
    {"ok": false, "error": {"error": "LeaseError", "code": "lease", "message": "...", "hint": "..."}}

``error`` is ``HubGrpoError.to_dict()`` (plus ``wait_s`` when the refusal carries a wait, e.g. a rate limit);
``hubgrpo.errors.from_dict`` rebuilds it on the worker's side. Anything that is not a ``HubGrpoError`` is logged
here (with tokens redacted) and answered as ``CoordinatorError`` with code ``internal``.

Thread safety lives here, not in the coordinator: one lock serialises ``lease``/``heartbeat``/``release``/
``submit``/``tick``; ``status`` runs unlocked. No network I/O ever runs under the lock: ``submit`` reads the
submission from the store before taking it, merges commit without it, and the repo scan and the refusal flush
(``coord.housekeeping``) take it only to update the state — a Hub answering 429 with a long Retry-After delays
a merge commit, never a heartbeat. A daemon thread calls ``coord.tick()`` every ``tick_interval``
seconds while the app runs (started by the app's startup event, so ``blocks.launch()`` on a Space ticks too).

Merges run in that same thread, off the request path: ``submit`` only admits (the answer says ``merge_due``) and
wakes the thread, which plans the merge under the lock, computes it WITHOUT the lock (heartbeats and other
submissions go on meanwhile) and commits it under the lock again. A ``lease`` asked while a merge is due or
running waits for it, up to ``coordinator.lease_waits_for_merge_s`` (``merge_wait_s``) in all, so that a worker
does not start a round on a version about to be replaced (a staleness the merge would then have to discount). A
request holds a server thread for at most ``LEASE_HOLD_S`` of that wait; then it is answered with a ``merging``
refusal carrying a short ``wait_s`` and the worker loop asks again (a long merge must not tie up Gradio's worker
threads that heartbeats need). Past the whole wait the worker gets the current version (with ``max_staleness:
0``: ``merging`` refusals until the merge is done).

The endpoints are registered with ``queue=False``: on this machine that made no difference to gradio_client
latency but lets the raw-HTTP client use ``POST /gradio_api/run/<name>`` (one round trip, ~4x faster than the
queued ``/call`` POST + SSE GET), which Gradio serves even on Spaces (where ``api_open`` is off) because the
endpoints skip the queue. See ``benchmarks/results/api_latency.md``.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import traceback
from typing import Any, Callable, Protocol

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # before gradio is imported: no phoning home

import gradio as gr  # noqa: E402
from pydantic import BaseModel, ValidationError  # noqa: E402

from hubgrpo.errors import CoordinatorError, HubGrpoError, InvalidSubmission, LeaseError, Refused  # noqa: E402
from hubgrpo import __version__  # noqa: E402
from hubgrpo.layout import PROTOCOL_VERSION, Lease  # noqa: E402

log = logging.getLogger("hubgrpo.space.api")

ENDPOINTS = ("lease", "heartbeat", "release", "submit", "status", "record_eval")
LEASE_HOLD_S = 2.0  # longest a lease request holds a server thread waiting for a merge
LEASE_RETRY_S = 1.0  # the wait_s of a ``merging`` refusal: when the worker asks again

AuthHook = Callable[[Any, Any], str]
"""``auth(token: str | None, request: gr.Request) -> user name``; raises ``Refused("auth", ...)`` to refuse."""


class CoordinatorLike(Protocol):
    """What the server needs from ``hubgrpo.coordinator.core.Coordinator`` (not thread-safe by itself)."""

    def lease(self, worker: str, user: str | None = None) -> Lease: ...
    def heartbeat(self, lease: Lease) -> Lease: ...
    def release(self, lease: Lease) -> None: ...
    def submit(self, lease: Lease, commit: str, *, lock: Any = None) -> dict: ...  # store reads outside lock
    def status(self) -> dict: ...
    def record_eval(self, version: Any, reward: Any, samples: Any) -> dict: ...  # checks its hostile input
    def tick(self) -> None: ...
    def housekeeping(self, lock: Any = None) -> None: ...  # repo scan, refusal flush (store I/O outside lock)
    def plan_merge(self) -> Any: ...  # None when no merge is due; else an object with compute()
    def finish_merge(self, plan: Any, result: Any, *, lock: Any = None) -> bool: ...  # commit outside lock
    def abort_merge(self, plan: Any) -> None: ...
    merge_wait_s: float  # how long a lease may wait for a due or running merge


# ------------------------------------------------------------------------------------------------ wire helpers


def plain(value: Any) -> Any:
    """Make ``value`` strict JSON: pydantic models dumped, tuples as lists, NaN/inf as null; else TypeError."""
    if isinstance(value, BaseModel):
        return plain(value.model_dump(mode="json"))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def error_dict(err: HubGrpoError) -> dict:
    """``err.to_dict()``, plus ``wait_s`` when the error says how long to wait before retrying."""
    d = err.to_dict()
    wait = getattr(err, "wait_s", None)
    if wait is not None:
        d["wait_s"] = float(wait)
    return d


def check_protocol(protocol: Any) -> None:
    """Refuse a worker that speaks another wire protocol (or does not say), with the install that matches."""
    if protocol == PROTOCOL_VERSION and not isinstance(protocol, bool):
        return
    from hubgrpo.space.view import install_line

    install = install_line(os.environ.get("SPACE_ID"), os.environ.get("HF_ENDPOINT"))
    raise Refused("version", f"this coordinator speaks hubgrpo protocol {PROTOCOL_VERSION} (hubgrpo {__version__}); "
                  f"the worker sent {str(protocol)[:40]!r}", hint=f"{install}, then start the worker again")


def parse_lease(value: Any) -> Lease:
    """Validate a lease sent by a worker; anything malformed is a ``LeaseError`` refusal."""
    try:
        return Lease.model_validate(value)
    except ValidationError as e:
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())) or "lease"
        raise LeaseError(f"malformed lease ({where}: {first.get('msg', 'invalid')})",
                         hint="send the lease exactly as the coordinator returned it") from None


def _redact(text: str, secrets: tuple[str | None, ...]) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


# ------------------------------------------------------------------------------------------------ endpoints


class CoordinatorApi:
    """The five endpoint functions, bound to one coordinator, one lock and an optional auth hook."""

    def __init__(self, coord: CoordinatorLike, auth: AuthHook | None = None):
        self.coord = coord
        self.auth = auth
        self.lock = threading.Lock()
        self.merge_wanted = threading.Event()  # set by submit when a merge is due: wakes the tick thread
        self.merge_busy = False  # a merge is due or running (guarded by merge_done)
        self.merge_done = threading.Condition()
        self.lease_waiters: dict[str, float] = {}  # worker -> when it first asked for a lease during merges

    def _answer(self, name: str, token: str | None, fn: Callable[[], Any]) -> dict:
        """Run ``fn`` and wrap its result or error in the wire envelope; never raises."""
        try:
            return {"ok": True, "result": plain(fn())}
        except HubGrpoError as e:
            log.debug("%s refused: %s (%s)", name, e.code, _redact(e.message, (token,)))
            return {"ok": False, "error": error_dict(e)}
        except Exception as e:  # deliberate: nothing unexpected may cross the wire as a traceback
            text = _redact("".join(traceback.format_exception(e)), (token,))
            log.error("internal error in %s endpoint:\n%s", name, text)
            message = _redact(f"{type(e).__name__}: {e}", (token,))[:500]
            err = CoordinatorError(f"the coordinator failed while handling {name!r}: {message}",
                                   hint="this is a coordinator bug or outage; it is logged on the server, "
                                        "retry later", code="internal")
            return {"ok": False, "error": error_dict(err)}

    def _user(self, token: str | None, request: Any) -> str | None:
        """The authenticated user name (None when no auth hook is configured)."""
        if self.auth is None:
            return None
        user = self.auth(token, request)
        if not isinstance(user, str) or not user:
            raise TypeError("auth hook returned no user name")
        return user

    def _owned_lease(self, lease: Any, token: str | None, request: Any) -> Lease:
        """Parse the lease and, with auth, check that it was issued to the caller."""
        parsed = parse_lease(lease)
        user = self._user(token, request)
        if user is not None and parsed.user is not None and parsed.user != user:
            raise Refused("auth", f"lease {parsed.lease_id} was issued to another user",
                          hint="heartbeat and submit with the token that leased the round")
        return parsed

    def lease(self, worker: str, user: str | None = None, token: str | None = None, protocol: int | None = None,
              request: gr.Request = None) -> dict:
        """Lease a round to ``worker``. With an auth hook the authenticated name replaces ``user``. ``protocol``
        is the worker's wire protocol version; any other than this coordinator's is refused (code ``version``)."""
        def run():
            check_protocol(protocol)
            who = self._user(token, request) if self.auth is not None else user
            asked, key = time.monotonic(), str(worker)[:200]
            if not self.wait_for_merge(min(LEASE_HOLD_S, self.coord.merge_wait_s)):
                self._refuse_while_merging(key, asked)
            with self.lock:
                self.lease_waiters.pop(key, None)
                lease = self.coord.lease(worker, who)
            return self._with_uploads(lease)
        return self._answer("lease", token, run)

    def _with_uploads(self, lease: Lease) -> Lease:
        """The lease with presigned upload URLs, when submissions go to an S3 box (signed outside the lock)."""
        attach = getattr(self.coord, "with_uploads", None)
        return attach(lease) if attach is not None else lease

    def wait_for_merge(self, timeout: float) -> bool:
        """Block (lock released) while a merge is due or running, up to ``timeout`` s; True if none is."""
        with self.merge_done:
            return self.merge_done.wait_for(lambda: not self.merge_busy, timeout=timeout)

    def _refuse_while_merging(self, worker: str, asked: float) -> None:
        """Past the hold: refuse with ``merging`` while this worker's whole wait (since its first ask during
        merges, ``asked`` for a first one) is under ``merge_wait_s``; return (lease the current version) once
        it is spent."""
        now = time.monotonic()
        with self.lock:
            for w, since in list(self.lease_waiters.items()):  # forget workers that stopped asking
                if now - since > 2 * self.coord.merge_wait_s + 60:
                    del self.lease_waiters[w]
            left = self.coord.merge_wait_s - (now - self.lease_waiters.setdefault(worker, asked))
        if left > 0:
            wait = round(min(LEASE_RETRY_S, left), 2)
            err = Refused("merging", f"a new version is being merged; ask again in {wait} s",
                          hint=f"wait_s={wait}")
            err.wait_s = wait
            raise err

    def merge_is_due(self) -> None:
        """A submit completed a quorum: leases wait from now on, and the tick thread wakes up to merge."""
        self.set_merge_busy(True)
        self.merge_wanted.set()

    def set_merge_busy(self, busy: bool) -> None:
        with self.merge_done:
            self.merge_busy = busy
            if not busy:
                self.merge_done.notify_all()

    def heartbeat(self, lease: dict, token: str | None = None, request: gr.Request = None) -> dict:
        """Extend a lease's deadline; the answer is the re-signed lease."""
        def run():
            parsed = self._owned_lease(lease, token, request)
            with self.lock:
                renewed = self.coord.heartbeat(parsed)
            return self._with_uploads(renewed)  # fresh URLs: they expire, the lease lives on
        return self._answer("heartbeat", token, run)

    def release(self, lease: dict, token: str | None = None, request: gr.Request = None) -> dict:
        """Give a lease back (the worker stopped); its prompts return to the pool."""
        def run():
            parsed = self._owned_lease(lease, token, request)
            with self.lock:
                self.coord.release(parsed)
        return self._answer("release", token, run)

    def submit(self, lease: dict, commit: str, token: str | None = None, request: gr.Request = None) -> dict:
        """Report the commit holding a round's submission; answers admitted / merged / duplicate."""
        def run():
            parsed = self._owned_lease(lease, token, request)
            if not isinstance(commit, str) or not commit or len(commit) > 200:
                raise InvalidSubmission("bad_commit", f"commit {str(commit)[:80]!r} is not a commit id",
                                        hint="send the commit sha returned by the upload")
            answer = self.coord.submit(parsed, commit, lock=self.lock)  # reads the store without the lock
            if isinstance(answer, dict) and answer.get("merge_due"):
                self.merge_is_due()
            return answer
        return self._answer("submit", token, run)

    def status(self, token: str | None = None, request: gr.Request = None) -> dict:
        """Run status (public, read-only, not serialised behind the lock)."""
        return self._answer("status", token, self.coord.status)

    def record_eval(self, version: int, reward: float, samples: int, token: str | None = None,
                    protocol: int | None = None, request: gr.Request = None) -> dict:
        """Record the held-out reward of a version (``hubgrpo evaluate``): ``{status: recorded | duplicate,
        version}``. With auth, only ``coordinator.evaluators`` (default: the repo owner) may call it."""
        def run():
            check_protocol(protocol)
            if self.auth is not None:
                evaluator = getattr(self.auth, "evaluator", None)
                evaluator(token, request) if evaluator is not None else self._user(token, request)
            with self.lock:
                return self.coord.record_eval(version, reward, samples)
        return self._answer("record_eval", token, run)


# ------------------------------------------------------------------------------------------------ tick thread


class Ticker:
    """Calls ``coord.tick()`` under the API lock every ``interval`` seconds while ``blocks`` is running, and runs
    due merges (woken at once by a submit that completes a quorum) with the lock released during the compute."""

    def __init__(self, api: CoordinatorApi, blocks: gr.Blocks, interval: float):
        self.api, self.blocks, self.interval = api, blocks, float(interval)
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the daemon thread unless one is already alive (idempotent)."""
        with self._guard:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._run, name="hubgrpo-tick", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            self.api.merge_wanted.wait(self.interval)
            self.api.merge_wanted.clear()
            if not self.blocks.is_running:
                return
            try:
                self.step()
            except Exception:  # deliberate: housekeeping must survive one bad tick
                log.exception("coordinator tick failed")

    def step(self) -> bool:
        """One tick, then the due merge if any (compute and commit outside the lock), then housekeeping (repo
        scan, refusal flush; store I/O outside the lock). True when a version was merged."""
        api, coord = self.api, self.api.coord
        with api.lock:
            coord.tick()
            plan = coord.plan_merge()
            api.set_merge_busy(plan is not None)  # under the lock: a submit cannot make one due in between
        merged = False
        if plan is None and hasattr(coord, "prefold"):
            coord.prefold(lock=api.lock)  # FFA: fold what is pending now, so the merge at the quorum is short
        if plan is not None:
            try:
                result = plan.compute()
            except BaseException:
                with api.lock:
                    coord.abort_merge(plan)
                api.set_merge_busy(False)
                raise
            try:
                merged = coord.finish_merge(plan, result, lock=api.lock)
            finally:
                api.set_merge_busy(False)
        coord.housekeeping(lock=api.lock)
        return merged

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (it ends within one interval of the app closing)."""
        if self._thread is not None:
            self._thread.join(timeout)


# ------------------------------------------------------------------------------------------------ app


def build_app(coord: CoordinatorLike, *, tick_interval: float = 1.0, blocks: gr.Blocks | None = None,
              auth: AuthHook | None = None, queue: bool = False) -> gr.Blocks:
    """Add the coordinator API endpoints to ``blocks`` (a new ``gr.Blocks`` when None) and return it.

    ``auth(token, request) -> user`` authenticates mutating calls (``status`` stays public). The tick thread
    starts when the app starts (``launch()`` or a mounted app's startup) and stops when it closes.
    ``queue=True`` routes calls through Gradio's queue instead (kept for benchmarks).
    """
    api = CoordinatorApi(coord, auth=auth)
    coord.background_merges = True  # merges run in the tick thread, off the request path
    blocks = blocks if blocks is not None else gr.Blocks(title="hubgrpo coordinator")
    with blocks:
        for name in ENDPOINTS:
            gr.api(getattr(api, name), api_name=name, queue=queue, concurrency_limit=None,
                   api_description=getattr(api, name).__doc__)
    ticker = Ticker(api, blocks, tick_interval)

    async def _start_ticker() -> None:
        ticker.start()

    blocks.extra_startup_events.append(_start_ticker)
    blocks.hubgrpo_ticker = ticker  # serve() starts it too, in case a Gradio version skips startup events
    return blocks


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def serve(coord: CoordinatorLike, host: str = "127.0.0.1", port: int = 0, *, tick_interval: float = 1.0,
          auth: AuthHook | None = None, blocks: gr.Blocks | None = None, queue: bool = False,
          **launch_kw: Any) -> tuple[gr.Blocks, str]:
    """Build and launch the app without blocking; returns ``(app, url)``. ``port=0`` picks a free port.

    Close it with ``app.close()`` (the tick thread then stops). Extra keyword arguments go to ``launch()``.
    """
    app = build_app(coord, tick_interval=tick_interval, blocks=blocks, auth=auth, queue=queue)
    launch_kw = {"prevent_thread_lock": True, "quiet": True, "ssr_mode": False, **launch_kw}
    app.launch(server_name=host, server_port=port or free_port(host), **launch_kw)
    app.hubgrpo_ticker.start()
    return app, app.local_url.rstrip("/")
