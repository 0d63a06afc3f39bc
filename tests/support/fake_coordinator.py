"""A small in-memory coordinator with the real ``Coordinator`` interface, for server/client tests.

Real behaviour where the API layer can observe it: leases are HMAC-signed and checked, heartbeats re-sign with
a later deadline, expired leases are dropped by ``tick()`` (fake clock), submissions are counted and merged at a
quorum, stale / duplicate / malformed submissions are refused with their codes, a lease budget refuses with a
wait. Like the real one it holds its own ``lock`` and takes it in each call; under it, deliberately unsafe (a plain
counter read-modify-write), so a missing lock shows up. ``fail_with`` makes the next call raise an arbitrary
exception (an internal bug).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import threading
import time

import httpx

from hubgrpo.coordinator.inflight import InFlight
from hubgrpo.errors import InvalidSubmission, LeaseError, NotFound, Refused
from hubgrpo.layout import Lease, check_name

_SHA = re.compile(r"[0-9a-f]{40}")


class FakeClock:
    """A clock the test advances by hand."""

    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class FakeCoordinator:
    """In-memory coordinator: lease / heartbeat / release / submit / status / tick."""

    def __init__(self, *, secret: bytes = b"test-secret", clock=None, ttl: float = 60.0, quorum: int = 2,
                 max_staleness: int = 1, max_leases: int | None = None, race_window: float = 0.001):
        self.secret, self.clock, self.ttl = secret, clock or FakeClock(), ttl
        self.quorum, self.max_staleness, self.max_leases = quorum, max_staleness, max_leases
        self.race_window = race_window
        self.counter = 0
        self.version = 0
        self.active: dict[str, Lease] = {}
        self.pending: list[str] = []
        self.seen: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.ticks = 0
        self.expired = 0
        self.finished = False
        self.fail_with: BaseException | None = None
        self.merge_wait_s = 0.0  # merges happen inside submit: nothing for a lease to wait for
        self.lock = threading.Lock()
        self.in_flight = InFlight()
        self.background_merges = False

    # -------------------------------------------------------------------------------------------- helpers

    def _enter(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.fail_with is not None:
            err, self.fail_with = self.fail_with, None
            raise err

    def sign(self, lease: Lease) -> str:
        """HMAC-SHA256 over the lease's JSON without its signature."""
        body = lease.model_copy(update={"signature": ""}).model_dump_json().encode()
        return hmac.new(self.secret, body, hashlib.sha256).hexdigest()

    def _verify(self, lease: Lease) -> Lease:
        if not hmac.compare_digest(self.sign(lease), lease.signature):
            raise LeaseError(f"lease {lease.lease_id} has a bad signature", hint="do not edit leases")
        if lease.lease_id not in self.active:
            raise LeaseError(f"lease {lease.lease_id} is unknown, released or expired",
                             hint="lease a new round", code="lease_unknown")
        if self.clock() > lease.deadline:
            raise LeaseError(f"lease {lease.lease_id} expired", hint="heartbeat more often", code="expired")
        return lease

    # -------------------------------------------------------------------------------------------- interface

    def lease(self, worker: str, user: str | None = None) -> Lease:
        """Issue a signed lease over 4 fresh prompt indices."""
        with self.lock:
            return self._lease(worker, user)

    def _lease(self, worker: str, user: str | None) -> Lease:
        self._enter("lease")
        check_name(worker)
        if self.finished:
            raise Refused("finished", "the run is finished", hint="start a new run")
        if self.max_leases is not None and len(self.active) >= self.max_leases:
            raise Refused("budget", f"{len(self.active)} leases are out (budget {self.max_leases})",
                          hint="wait and lease again", wait_s=2.5)
        n = self.counter  # read-modify-write on purpose: only the server's lock makes this safe
        time.sleep(self.race_window)  # widen the race window so a missing lock shows up as duplicate ids
        now = self.clock()
        lease = Lease(lease_id=f"L{n:06d}", run_id="fake", round_id=n, worker=worker, user=user,
                      base_version=self.version, base_sha=f"{self.version:040x}",
                      prompt_indices=list(range(4 * n, 4 * n + 4)), steps=2, seed=n, params={"lr": 0.01},
                      issued_at=now, deadline=now + self.ttl)
        self.counter = n + 1
        lease.signature = self.sign(lease)
        self.active[lease.lease_id] = lease
        return lease

    def heartbeat(self, lease: Lease) -> Lease:
        """Re-sign ``lease`` with a deadline ``ttl`` from now."""
        with self.lock:
            return self._heartbeat(lease)

    def _heartbeat(self, lease: Lease) -> Lease:
        self._enter("heartbeat")
        self._verify(lease)
        new = lease.model_copy(update={"deadline": self.clock() + self.ttl, "signature": ""})
        new.signature = self.sign(new)
        self.active[new.lease_id] = new
        return new

    def release(self, lease: Lease) -> None:
        """Forget ``lease``."""
        with self.lock:
            self._enter("release")
            self._verify(lease)
            del self.active[lease.lease_id]

    def precheck(self, lease: Lease) -> None:
        """The server's cheap check before it queues a round: the lease's signature (as the real one, not whether
        the lease is still live: a resubmitted round's lease is not)."""
        if not hmac.compare_digest(self.sign(lease), lease.signature):
            raise LeaseError(f"lease {lease.lease_id} has a bad signature", hint="do not edit leases")

    def hand_in(self, lease: Lease) -> None:
        """A round queued for its check: nothing to do here (its lease stays for ``submit``)."""

    def with_uploads(self, lease: Lease) -> Lease:
        return lease

    def submit(self, lease: Lease, commit: str) -> dict:
        """Admit a submission; merge a new version at ``quorum`` pending ones (all under ``lock``: no I/O here)."""
        with self.lock:
            return self._submit(lease, commit)

    def _submit(self, lease: Lease, commit: str) -> dict:
        self._enter("submit")
        sid = f"{lease.worker}-{lease.lease_id}"
        if sid in self.seen and hmac.compare_digest(self.sign(lease), lease.signature):
            return {"status": "duplicate", "submission_id": sid, "version": self.seen[sid]}
        self._verify(lease)
        if not _SHA.fullmatch(commit):
            raise InvalidSubmission("bad_commit", f"{commit!r} is not a commit sha", hint="send the 40-hex sha")
        if self.version - lease.base_version > self.max_staleness:
            raise InvalidSubmission("stale", f"base version {lease.base_version} is too old "
                                    f"(current {self.version}, max staleness {self.max_staleness})")
        del self.active[lease.lease_id]
        self.pending.append(sid)
        status = "admitted"
        if len(self.pending) >= self.quorum:
            self.version += 1
            self.pending.clear()
            status = "merged"
        self.seen[sid] = self.version
        return {"status": status, "submission_id": sid, "version": self.version}

    def status(self) -> dict:
        """Counts only (JSON-serialisable)."""
        self._enter("status")
        return {"run_id": "fake", "version": self.version, "leases": len(self.active), "issued": self.counter,
                "pending": len(self.pending), "ticks": self.ticks, "expired": self.expired,
                "finished": self.finished, "reward": float("nan")}

    def tick(self) -> None:
        """Drop leases past their deadline."""
        with self.lock:
            self.ticks += 1
            now = self.clock()
            for lease_id in [k for k, v in self.active.items() if now > v.deadline]:
                del self.active[lease_id]
                self.expired += 1

    def use_merge_thread(self) -> None:
        self.background_merges = True

    def plan_merge(self, on_planned=None):
        """This fake merges inside ``submit``; nothing is ever left for the tick thread."""
        with self.lock:
            if on_planned is not None:
                on_planned(False)
        return None

    def finish_merge(self, plan, result) -> bool:
        return False

    def scan_pass(self, *, force: bool = False) -> int:
        return 0

    def warm_up(self) -> None:
        pass

    def flush(self, *, force: bool = True) -> bool:
        return False

    def abort_merge(self, plan) -> None:
        pass

    def prefold(self) -> int:
        return 0

    def checkpoints_inline(self) -> bool:
        return False

    def rounds_via_upload(self) -> bool:
        return False

    def version_dir(self, version: int, adapter_id: str):
        raise NotFound(f"version {version} is not a version of this fake coordinator", hint="lease again")


class RecordingTransport(httpx.HTTPTransport):
    """httpx's own transport that keeps each request's URL: what a ``CoordinatorClient(…, http_transport=…)``
    sent, seen from outside the client."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[httpx.URL] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(request.url)
        return super().handle_request(request)

    @property
    def paths(self) -> list[str]:
        return [u.path for u in self.urls]
