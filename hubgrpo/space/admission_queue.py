"""Submissions answered at once and admitted in the background, so that no request waits for an adapter check.

A round is in the store (the run repo or the inbox) before its worker calls ``submit``; what costs is checking it:
reading a megabytes-large adapter and its rollouts, parsing, bounds, norms, the rewards recomputed. ``AdmissionQueue``
takes that off the request path:

- ``enqueue(lease, commit)`` (the request thread) queues the round after the cheap checks the API did (lease
  signature and owner, the commit id's form) and answers ``{"status": "checking", "submission_id", "wait_s"}``;
- admission threads take rounds in arrival order and run ``coord.submit(lease, commit)`` (store reads and every
  check without the coordinator's lock, the state change under it), keep the answer as the round's **verdict**
  (the envelope ``submit`` would have answered: admitted / merged / duplicate, or the refusal) and wake the merge
  thread when a quorum is due;
- ``verdict(sub_id)`` answers that envelope, ``checking`` while the round waits, or ``unknown`` for a round this
  process never queued (after a restart: the worker submits again and learns ``duplicate`` when the repo scan
  already admitted it, or gets a fresh verdict);
- a submit of a round already decided is answered from its verdict without a second check (``duplicate`` when
  admitted, the same refusal when refused); a check that failed for want of the store, or a round submitted
  again with another commit (a worker that fixed its delivery), is checked again.

Nothing is lost by answering early: a queued round is still in the store, a restarted coordinator finds every
round neither merged nor refused by its scan, and a round queued twice (a retried submit) is checked once.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hubgrpo import layout
from hubgrpo.coordinator.inflight import InFlight
from hubgrpo.errors import Refused

log = logging.getLogger("hubgrpo.space.admission_queue")

MAX_QUEUED = 20_000  # rounds waiting for their check; past it submits are refused with `rate` and a wait
SETTLING_ERRORS = ("InvalidSubmission", "LeaseError")  # refusals that decide a round (``settled``)
KEEP_VERDICTS = 50_000  # verdicts kept for `verdict` (oldest forgotten first; a forgotten one is `unknown`)


@dataclass
class Job:
    lease: Any  # layout.Lease, already parsed and owned by the caller
    commit: str
    queued_at: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)


def settled(envelope: dict) -> bool:
    """Whether a verdict decides its round: admitted (merged, duplicate) or refused as a submission or a lease;
    not an outage or an internal failure (those are checked again when the worker submits again)."""
    if envelope.get("ok"):
        return True
    error = envelope.get("error")
    return isinstance(error, dict) and error.get("error") in SETTLING_ERRORS


class AdmissionQueue:
    """A FIFO of submitted rounds, admitted by ``threads`` daemon threads (``start``); verdicts kept by id."""

    def __init__(
        self,
        check: Callable[[Any, str], dict],
        *,
        threads: int = 1,
        max_queued: int = MAX_QUEUED,
        keep_verdicts: int = KEEP_VERDICTS,
        alive: Callable[[], bool] = lambda: True,
        in_flight: InFlight | None = None,
    ):
        """``check(lease, commit)`` admits one round and returns its wire envelope (never raises). Threads start
        with the first round queued and end once ``alive()`` is False (the app closed) and nothing is queued.
        ``in_flight``: the coordinator's record of the rounds queued here (each one from its queueing to its
        verdict)."""
        self.check, self.threads, self.alive = check, max(1, int(threads)), alive
        self.in_flight = in_flight if in_flight is not None else InFlight()
        self.max_queued, self.keep_verdicts = int(max_queued), int(keep_verdicts)
        self._cond = threading.Condition()
        self._queue: collections.deque[str] = collections.deque()
        self._jobs: dict[str, Job] = {}  # queued or being checked
        self._verdicts: collections.OrderedDict[str, tuple[str, dict]] = collections.OrderedDict()  # (commit, envelope)
        self._workers: list[threading.Thread] = []
        self.check_s = 0.05  # moving average of one round's check (the wait_s hint of `checking`)

    # -------------------------------------------------------------------------------------------- requests

    def enqueue(self, lease, commit: str) -> dict:
        """Queue ``lease``'s round and answer (an envelope) when to ask for its verdict. A round already queued is
        not queued again; a round already decided is not checked again: ``duplicate`` when it was admitted (what
        a repeated synchronous submit answers), its refusal again when it was refused; a round whose check
        failed for want of the store (or any other passing failure), or that is submitted with another commit
        than the one checked, is queued again."""
        sub_id = layout.submission_id(lease.worker, lease.lease_id)
        with self._cond:
            commit_checked, kept = self._verdicts.get(sub_id, (None, None))
            if sub_id not in self._jobs and kept is not None and settled(kept) and commit_checked == commit:
                if not kept.get("ok"):
                    return kept
                result = kept.get("result")
                version = result.get("version") if isinstance(result, dict) else None
                return {
                    "ok": True,
                    "result": {"status": "duplicate", "submission_id": sub_id, "version": version},
                }
            if sub_id not in self._jobs:
                if len(self._queue) >= self.max_queued:
                    wait = round(min(60.0, 1.0 + len(self._queue) * self.check_s / self.threads), 1)
                    raise Refused(
                        "rate",
                        f"{len(self._queue)} rounds are waiting for their check; submit again in {wait} s",
                        hint=f"wait_s={wait}",
                        wait_s=wait,
                    )
                self._verdicts.pop(sub_id, None)
                self._jobs[sub_id] = Job(lease, commit)
                self.in_flight.add(sub_id)
                self._queue.append(sub_id)
                self._cond.notify()
                self._start_locked()
            return {"ok": True, "result": self._checking(sub_id)}

    def verdict(self, sub_id: str) -> dict:
        """The round's verdict (a wire envelope), or a ``checking`` / ``unknown`` answer."""
        with self._cond:
            if sub_id in self._verdicts:
                return self._verdicts[sub_id][1]
            if sub_id in self._jobs:
                return {"ok": True, "result": self._checking(sub_id)}
        return {
            "ok": True,
            "result": {
                "status": "unknown",
                "submission_id": sub_id,
                "hint": "this coordinator has no such round queued: submit it again",
            },
        }

    def wait(self, sub_id: str, timeout: float) -> dict:
        """Block until the round has a verdict (the synchronous ``submit`` of the Gradio endpoints)."""
        with self._cond:
            job = self._jobs.get(sub_id)
        if job is not None:
            job.done.wait(timeout)
        return self.verdict(sub_id)

    def _checking(self, sub_id: str) -> dict:
        ahead = self._queue.index(sub_id) if sub_id in self._queue else 0  # under the lock
        wait = round(min(30.0, max(0.05, (ahead + 1) * self.check_s / self.threads)), 2)
        return {"status": "checking", "submission_id": sub_id, "queued": len(self._jobs), "wait_s": wait}

    # -------------------------------------------------------------------------------------------- threads

    def _start_locked(self) -> None:
        """Start the missing admission threads (called under the lock)."""
        self._workers = [t for t in self._workers if t.is_alive()]
        while len(self._workers) < self.threads:
            t = threading.Thread(target=self._run, name=f"hubgrpo-admit-{len(self._workers)}", daemon=True)
            self._workers.append(t)
            t.start()

    def join(self, timeout: float = 10.0) -> None:
        """Wait for the threads to end (after the app closed: they finish what is queued first)."""
        for t in list(self._workers):
            t.join(timeout)

    def _next(self) -> str | None:
        """The next queued round (under the lock), waiting for one; None when the app is gone and none is left."""
        while not self._queue:
            if not self.alive():
                return None
            self._cond.wait(1.0)
        return self._queue.popleft()

    def _run(self) -> None:
        while True:
            with self._cond:
                sub_id = self._next()
                if sub_id is None:
                    self._workers = [t for t in self._workers if t is not threading.current_thread()]
                    return
                job = self._jobs[sub_id]
            t0 = time.monotonic()
            try:
                envelope = self.check(job.lease, job.commit)
            except Exception as e:  # deliberate: `check` answers envelopes; a bug here must not strand the round
                log.exception("admission of %s failed", sub_id)
                envelope = {
                    "ok": False,
                    "error": {
                        "error": "CoordinatorError",
                        "code": "internal",
                        "message": f"the admission of {sub_id} failed: {type(e).__name__}",
                        "hint": "submit again later",
                    },
                }
            with self._cond:
                self.check_s = 0.8 * self.check_s + 0.2 * (time.monotonic() - t0)
                self._verdicts[sub_id] = (job.commit, envelope)
                while len(self._verdicts) > self.keep_verdicts:
                    self._verdicts.popitem(last=False)
                del self._jobs[sub_id]
                self.in_flight.discard(sub_id)
            job.done.set()
