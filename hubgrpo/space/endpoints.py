"""The coordinator's endpoint functions (``CoordinatorApi``), bound to one coordinator (``CoordinatorLike``), an
optional auth hook and the admission queue; ``hubgrpo.space.api`` serves them (the wire format is described there).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # before gradio is imported: no phoning home

import gradio as gr  # noqa: E402

from hubgrpo import layout  # noqa: E402
from hubgrpo.coordinator.inflight import InFlight  # noqa: E402
from hubgrpo.errors import CoordinatorError, HubGrpoError, InvalidSubmission, Refused  # noqa: E402
from hubgrpo.layout import Lease  # noqa: E402
from hubgrpo.space.admission_queue import AdmissionQueue  # noqa: E402
from hubgrpo.space.wire import caller_token, check_protocol, error_dict, parse_lease, plain, redact  # noqa: E402

if TYPE_CHECKING:
    pass

log = logging.getLogger("hubgrpo.space.api")

ENDPOINTS = (
    "lease",
    "heartbeat",
    "release",
    "submit",
    "verdict",
    "status",
    "record_eval",
    "record_verdict",
    "round_files",
)
LEASE_HOLD_S = 2.0  # longest a lease request holds a server thread waiting for a merge
LEASE_RETRY_S = 1.0  # the wait_s of a ``merging`` refusal: when the worker asks again
SYNC_SUBMIT_S = 600.0  # longest the synchronous (Gradio) submit waits for its round's check

AuthHook = Callable[[Any, Any], str]
"""``auth(token: str | None, request: gr.Request) -> user name``; raises ``Refused("auth", ...)`` to refuse."""


class CoordinatorLike(Protocol):
    """What the server needs from ``hubgrpo.coordinator.core.Coordinator``, which takes its own lock in each call
    (none of them is called with it held) and runs store I/O outside it."""

    in_flight: InFlight  # the rounds queued for their check: the admission queue reports them here

    @property
    def merge_wait_s(self) -> float: ...  # how long a lease may wait for a due or running merge

    def use_merge_thread(self) -> None: ...  # merges, scans and checkpoints are the server's threads' from now on
    def lease(self, worker: str, user: str | None = None) -> Lease: ...
    def with_uploads(self, lease: Lease) -> Lease: ...  # presigned upload URLs (signed without the lock)
    def heartbeat(self, lease: Lease) -> Lease: ...
    def release(self, lease: Lease) -> None: ...
    def precheck(self, lease: Lease) -> None: ...  # the lease's signature: a forged lease is refused at once
    def hand_in(self, lease: Lease) -> None: ...  # a round queued for its check: its lease is no longer live
    def submit(self, lease: Lease, commit: str) -> dict: ...  # store reads and checks outside the lock
    def status(self) -> dict: ...
    def record_eval(self, version: Any, reward: Any, samples: Any) -> dict: ...  # checks its hostile input
    def record_verdict(self, submission_id: Any, report: Any) -> dict: ...  # checks its hostile input
    def round_files(self, submission_id: Any, base_version: Any) -> dict: ...  # checks its hostile input
    def tick(self) -> None: ...
    def warm_up(self) -> None: ...  # load what the first admission would (called before the launch)
    def scan_pass(self, *, force: bool = False) -> int: ...  # the repo scan when due (or now)
    def flush(self, *, force: bool = True) -> bool: ...  # a checkpoint: versions, refusals, scores to the repo
    def plan_merge(self, on_planned: Callable[[bool], None] | None = None) -> Any: ...  # None, or has compute()
    def finish_merge(self, plan: Any, result: Any) -> bool: ...  # the render and commit outside the lock
    def abort_merge(self, plan: Any) -> None: ...
    def prefold(self) -> int: ...  # FFA: fold pending rounds in before the merge is due
    def checkpoints_inline(self) -> bool: ...  # every version checkpointed right after its merge
    def version_dir(self, version: int, adapter_id: str) -> Path: ...  # what the adapter route serves
    def rounds_via_upload(self) -> bool: ...  # rounds come only through the upload route


class CoordinatorApi:
    """The endpoint functions, bound to one coordinator, an optional auth hook and the admission queue."""

    def __init__(
        self,
        coord: CoordinatorLike,
        auth: AuthHook | None = None,
        *,
        alive: Callable[[], bool] = lambda: True,
        admission_threads: int = 2,
    ):
        self.coord = coord
        self.auth = auth
        self.admission_queue = AdmissionQueue(
            self._admit, threads=admission_threads, alive=alive, in_flight=coord.in_flight
        )
        self.merge_wanted = threading.Event()  # set by submit when a merge is due: wakes the tick thread
        self.merge_busy = False  # a merge is due or running (guarded by merge_done)
        self.merge_done = threading.Condition()
        self.lease_waiters: dict[str, float] = {}  # worker -> when it first asked for a lease during merges
        self._waiters_lock = threading.Lock()  # guards lease_waiters

    def _answer(self, name: str, token: str | None, fn: Callable[[], Any]) -> dict:
        """Run ``fn`` and wrap its result or error in the wire envelope; never raises."""
        return self._guarded(name, token, lambda: {"ok": True, "result": plain(fn())})

    def _guarded(self, name: str, token: str | None, fn: Callable[[], dict]) -> dict:
        """Run ``fn`` (which answers an envelope) and answer its error as an envelope instead; never raises."""
        try:
            return fn()
        except HubGrpoError as e:
            log.debug("%s refused: %s (%s)", name, e.code, redact(e.message, (token,)))
            return {"ok": False, "error": error_dict(e)}
        except Exception as e:  # deliberate: nothing unexpected may cross the wire as a traceback
            text = redact("".join(traceback.format_exception(e)), (token,))
            log.error("internal error in %s endpoint:\n%s", name, text)
            message = redact(f"{type(e).__name__}: {e}", (token,))[:500]
            err = CoordinatorError(
                f"the coordinator failed while handling {name!r}: {message}",
                hint="this is a coordinator bug or outage; it is logged on the server, retry later",
                code="internal",
            )
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
            raise Refused(
                "auth",
                f"lease {parsed.lease_id} was issued to another user",
                hint="heartbeat and submit with the token that leased the round",
            )
        return parsed

    def lease(
        self,
        worker: str,
        user: str | None = None,
        token: str | None = None,
        protocol: Any = None,
        request: gr.Request | None = None,
    ) -> dict:
        """Lease a round to ``worker``. With an auth hook the authenticated name replaces ``user``. ``protocol``
        is the worker's wire protocol version; any other than this coordinator's is refused (code ``version``)."""
        token = caller_token(token, request)

        def run():
            check_protocol(protocol)
            who = self._user(token, request) if self.auth is not None else user
            asked, key = time.monotonic(), str(worker)[:200]
            if not self.wait_for_merge(min(LEASE_HOLD_S, self.coord.merge_wait_s)):
                self._refuse_while_merging(key, asked)
            with self._waiters_lock:
                self.lease_waiters.pop(key, None)
            return self.coord.with_uploads(self.coord.lease(worker, who))  # URLs signed outside the lock

        return self._answer("lease", token, run)

    def wait_for_merge(self, timeout: float) -> bool:
        """Block (lock released) while a merge is due or running, up to ``timeout`` s; True if none is."""
        with self.merge_done:
            return self.merge_done.wait_for(lambda: not self.merge_busy, timeout=timeout)

    def _refuse_while_merging(self, worker: str, asked: float) -> None:
        """Past the hold: refuse with ``merging`` while this worker's whole wait (since its first ask during
        merges, ``asked`` for a first one) is under ``merge_wait_s``; return (lease the current version) once
        it is spent."""
        now = time.monotonic()
        with self._waiters_lock:
            for w, since in list(self.lease_waiters.items()):  # forget workers that stopped asking
                if now - since > 2 * self.coord.merge_wait_s + 60:
                    del self.lease_waiters[w]
            left = self.coord.merge_wait_s - (now - self.lease_waiters.setdefault(worker, asked))
        if left > 0:
            wait = round(min(LEASE_RETRY_S, left), 2)
            raise Refused(
                "merging", f"a new version is being merged; ask again in {wait} s", hint=f"wait_s={wait}", wait_s=wait
            )

    def merge_is_due(self) -> None:
        """A submit completed a quorum: leases wait from now on, and the tick thread wakes up to merge."""
        self.set_merge_busy(True)
        self.merge_wanted.set()

    def set_merge_busy(self, busy: bool) -> None:
        with self.merge_done:
            self.merge_busy = busy
            if not busy:
                self.merge_done.notify_all()

    def heartbeat(self, lease: dict, token: str | None = None, request: gr.Request | None = None) -> dict:
        """Extend a lease's deadline; the answer is the re-signed lease."""
        token = caller_token(token, request)

        def run():
            parsed = self._owned_lease(lease, token, request)
            return self.coord.with_uploads(self.coord.heartbeat(parsed))  # fresh URLs: they expire, the lease lives

        return self._answer("heartbeat", token, run)

    def release(self, lease: dict, token: str | None = None, request: gr.Request | None = None) -> dict:
        """Give a lease back (the worker stopped); its prompts return to the pool."""
        token = caller_token(token, request)

        def run():
            self.coord.release(self._owned_lease(lease, token, request))

        return self._answer("release", token, run)

    def submit(self, lease: dict, commit: str, token: str | None = None, request: gr.Request | None = None) -> dict:
        """Report the commit holding a round's submission; answers admitted / merged / duplicate (synchronous: the
        answer waits for the round's check; the plain route ``/hubgrpo/api/submit`` answers at once instead)."""
        token = caller_token(token, request)

        def run():
            first = self._queue_round(lease, commit, token, request)
            result = first.get("result") if first.get("ok") else None
            if isinstance(result, dict) and result.get("status") == "checking":
                return self.admission_queue.wait(result["submission_id"], SYNC_SUBMIT_S)
            return first

        return self._guarded("submit", token, run)

    def submit_queued(
        self, lease: dict, commit: str, token: str | None = None, request: gr.Request | None = None
    ) -> dict:
        """Report a round's commit; answers ``{status: checking, submission_id, wait_s}`` at once, after the cheap
        checks (lease signature and owner, the commit id); ``verdict`` then tells how the check went."""
        token = caller_token(token, request)
        return self._guarded("submit", token, lambda: self._queue_round(lease, commit, token, request))

    def _queue_round(self, lease: Any, commit: Any, token: str | None, request: Any) -> dict:
        """The cheap checks of a submit (lease form, owner and signature; the commit id's form), then the round
        queued for its check: the ``AdmissionQueue.enqueue`` envelope."""
        parsed = self._owned_lease(lease, token, request)
        if not isinstance(commit, str) or not commit or len(commit) > 200:
            raise InvalidSubmission(
                "bad_commit",
                f"commit {str(commit)[:80]!r} is not a commit id",
                hint="send the commit sha returned by the upload",
            )
        self.coord.precheck(parsed)  # the lease's signature: a forged lease is refused before it is queued
        answer = self.admission_queue.enqueue(parsed, commit)
        result = answer.get("result") if answer.get("ok") else None
        if isinstance(result, dict) and result.get("status") == "checking":
            self.coord.hand_in(parsed)  # delivered: the lease is no longer live (the worker may lease its next round)
        return answer

    def _admit(self, lease: Lease, commit: str) -> dict:
        """One queued round's check (an admission thread): ``coord.submit`` reads the store without its lock."""

        def run():
            answer = self.coord.submit(lease, commit)
            if isinstance(answer, dict) and answer.get("merge_due"):
                self.merge_is_due()
            return answer

        return self._answer("submit", None, run)

    def verdict(self, lease: dict, token: str | None = None, request: gr.Request | None = None) -> dict:
        """How the check of a submitted round went: the answer ``submit`` would have given (admitted / merged /
        duplicate, or the refusal), ``checking`` while it waits, ``unknown`` for a round never submitted here."""
        token = caller_token(token, request)

        def run():
            parsed = self._owned_lease(lease, token, request)
            self.coord.precheck(parsed)  # the lease's signature, as for a heartbeat: no verdict for a forged lease
            return self.admission_queue.verdict(layout.submission_id(parsed.worker, parsed.lease_id))

        return self._guarded("verdict", token, run)

    def status(self, token: str | None = None, request: gr.Request | None = None) -> dict:
        """Run status (public, read-only, not serialised behind the lock)."""
        token = caller_token(token, request)
        return self._answer("status", token, self.coord.status)

    def record_eval(
        self,
        version: int,
        reward: float,
        samples: int,
        token: str | None = None,
        protocol: Any = None,
        request: gr.Request | None = None,
    ) -> dict:
        """Record the held-out reward of a version (``hubgrpo evaluate``): ``{status: recorded | duplicate,
        version}``. With auth, only ``coordinator.evaluators`` (default: the repo owner) may call it."""
        return self._as_evaluator(
            "record_eval", token, protocol, request, lambda: self.coord.record_eval(version, reward, samples)
        )

    def record_verdict(
        self,
        submission_id: str,
        report: dict,
        token: str | None = None,
        protocol: Any = None,
        request: gr.Request | None = None,
    ) -> dict:
        """Record a proof-of-rollouts verdict on an admitted round (``hubgrpo evaluate --verify``): ``{status:
        recorded | duplicate, submission_id, passed, excluded}``. With auth, only ``coordinator.evaluators``
        (default: the repo owner) may call it."""
        return self._as_evaluator(
            "record_verdict", token, protocol, request, lambda: self.coord.record_verdict(submission_id, report)
        )

    def round_files(
        self,
        submission_id: str,
        base_version: int,
        token: str | None = None,
        protocol: Any = None,
        request: gr.Request | None = None,
    ) -> dict:
        """The record and rollouts of a round awaiting its verdict (``hubgrpo evaluate --verify`` on a run whose
        rounds are in an inbox it cannot read): ``{submission_id, files: {name: base64}}``. With auth, only
        ``coordinator.evaluators`` may call it."""
        return self._as_evaluator(
            "round_files", token, protocol, request, lambda: self.coord.round_files(submission_id, base_version)
        )

    def _as_evaluator(self, name: str, token: str | None, protocol: Any, request: Any, call: Callable) -> dict:
        """Answer ``call()`` for a caller in ``coordinator.evaluators`` (with auth) who speaks our protocol."""
        token = caller_token(token, request)

        def run():
            check_protocol(protocol)
            if self.auth is not None:
                evaluator = getattr(self.auth, "evaluator", None)
                evaluator(token, request) if evaluator is not None else self._user(token, request)
            return call()

        return self._answer(name, token, run)
