"""``Worker.run`` with each round delivered while the next one trains (``hubgrpo.worker.pipeline``).

    lease 1 ─ train 1 ─┬─ train 2 (lease 2 asked here, once) ─┬─ train 3 (lease 3 fetched ahead) ─ …
                       └─ deliver 1, fetch lease 3 ────────────┘└─ deliver 2, fetch lease 4 ──────────

Each answer is kept when its handoff is joined, after the next round trained; what the handoff raised is raised
there. A coordinator that refuses a second live lease to one worker (``duplicate_worker``: an older coordinator,
or ``coordinator.leases_per_worker: 1``) gets no lease fetched ahead: the worker then leases after each delivery,
as in sequence, and still uploads while it trains.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from hubgrpo.error_codes import stop_codes
from hubgrpo.errors import CoordinatorError, HubGrpoError, RateLimited, Refused
from hubgrpo.layout import Lease
from hubgrpo.worker.lease_bounds import adapter_limit, check_lease_bounds
from hubgrpo.worker.pipeline import Handoff, release_quietly

if TYPE_CHECKING:
    from hubgrpo.worker.loop import Trained, Worker

log = logging.getLogger("hubgrpo.worker")
NOT_NOW = object()  # a lease fetched ahead was refused as a second live lease: lease after the delivery
JOIN_ON_EXIT_S = 30.0  # on Ctrl-C, how long the round being delivered may take to finish


def fetch_ahead(w: Worker, protected: dict[str, str]) -> Lease | None | object:
    """The next lease and its adapter, asked once while another round trains; None when the run is finished,
    ``NOT_NOW`` when the coordinator wants a wait or is out of reach (the worker then leases after the delivery,
    as in sequence: a trained round never waits behind a lease asked ahead). ``protected``: lease id → the adapter
    id this call kept from pruning (``Worker.in_use``), for ``Piped.unprotect``."""
    try:
        lease = w.client.lease(w.name, w.user)
    except (Refused, RateLimited, CoordinatorError) as e:
        if e.code in stop_codes():
            raise
        if e.code == "finished":
            return None
        log.info("no lease ahead (%s): %s; the next one is asked after this delivery", e.code, e.message)
        return NOT_NOW
    try:  # the download too, off the training's path (the round's own call then finds it cached)
        check_lease_bounds(w.cfg, lease, w.name)
        w.in_use.append(lease.base_sha)  # kept from pruning until its round has loaded it (``Worker.train``)
        protected[lease.lease_id] = lease.base_sha
        w.client.adapter(lease.base_version, lease.base_sha, w.workdir / "adapters", adapter_limit(w.cfg))
    except (HubGrpoError, OSError) as e:  # the round itself downloads it (and says what is wrong)
        log.info("could not fetch version %s ahead: %s", lease.base_version, e)
    except BaseException:  # the worker will not train it: the lease goes back, its adapter may be pruned
        if protected.pop(lease.lease_id, None) is not None:
            w.in_use.remove(lease.base_sha)
        release_quietly(w._release, lease)
        raise
    return lease


class Piped:
    """The state of a pipelined loop: the handoff in flight, the round on the worker's thread, the leases taken."""

    def __init__(self, w: Worker):
        self.w = w
        self.handoff: Handoff | None = None
        self.leases = 0
        self.finished = False
        self.holding: Lease | None = None  # the lease of the round on the worker's thread, until handed off
        self.trained: Trained | None = None  # that round once trained, until handed off
        self.in_flight: str | None = None  # the lease id being delivered
        self.protected: dict[str, str] = {}  # lease id fetched ahead → its adapter id, kept in ``Worker.in_use``

    def wanted(self) -> bool:
        return not self.finished and (self.w.max_rounds is None or self.leases < self.w.max_rounds)

    def lease_now(self) -> Lease | None:
        lease = self.w._lease() if self.wanted() else None
        self.finished |= lease is None
        self.leases += lease is not None
        return lease

    def join(self) -> tuple[Lease | None, float]:
        """The handoff in flight: its answer kept, its error raised; the lease it fetched and the seconds waited."""
        if self.handoff is None:
            return None, 0.0
        t = time.time()
        out = self.handoff.join()  # a Ctrl-C while waiting leaves the handoff for ``close`` to abandon
        handoff, self.handoff = self.handoff, None
        waited = time.time() - t
        for gone in out.lost:  # fetched ahead, then refused or given back: its adapter may be pruned again
            self.unprotect(gone)
        if out.answer is not None:
            self.w.collect(out.answer | out.extra | {"pipelined": True})
        lease = out.lease if isinstance(out.lease, Lease) else None
        if out.error is not None:
            if lease is not None:
                self.unprotect(lease)
            release_quietly(self.w._release, lease)
            raise out.error
        if out.fetched and out.lease is None:
            self.finished = True
        elif handoff.ahead and lease is None:
            self.leases -= 1  # asked ahead, not given: the loop asks it
        return lease, waited

    def hand_off(self, trained: Trained, lease_s: float) -> None:
        w = self.w
        ahead = self.wanted() and self.leases + 1 < (w.max_rounds or 10**18)  # the next lease is asked by the loop
        self.leases += ahead
        self.in_flight = trained.hb.lease.lease_id
        self.handoff = Handoff(
            lambda: w._guarded(trained.hb.lease, lambda: w.finish(trained)),
            (lambda: fetch_ahead(w, self.protected)) if ahead else None,
            keep=w.client.heartbeat,
            interval=max(1.0, w.cfg.coordinator.heartbeat_interval_s),
            release=w._release,
        )
        self.handoff.outcome.extra["lease_s"] = lease_s  # read at the join, on this thread
        self.holding = self.trained = None

    def unprotect(self, lease: Lease) -> None:
        """A lease fetched ahead has been trained (or given up): its adapter needs no protection from pruning."""
        sha = self.protected.pop(lease.lease_id, None)
        if sha is not None and sha in self.w.in_use:
            self.w.in_use.remove(sha)

    def take(self, lease: Lease) -> Lease:
        """A lease the worker is about to train: never the id of the round being delivered (a coordinator that
        issues one id twice would make the two rounds share a folder)."""
        if lease.lease_id == self.in_flight:
            self.w._release(lease)
            raise CoordinatorError(
                f"the coordinator issued lease {lease.lease_id} again while its round is being delivered",
                code="protocol",
                hint="a coordinator issues each lease id once; report it to the run's owner",
            )
        self.holding = lease
        return lease

    def close(self) -> None:
        """On the way out: the round on this thread is dropped, the one in flight delivered (bounded) and kept, a
        lease fetched ahead given back (also one that arrives after the wait: the handoff releases it)."""
        if self.trained is not None:
            self.w.drop(self.trained)
        else:
            release_quietly(self.w._release, self.holding)
        if self.handoff is not None:
            out = self.handoff.abandon(JOIN_ON_EXIT_S)
            for gone in out.lost:
                self.unprotect(gone)
            if out.answer is not None:
                self.w.collect(out.answer | out.extra | {"pipelined": True})


def run_piped(w: Worker) -> None:
    """Rounds until the run finishes or ``max_rounds`` leases were trained (module docstring)."""
    p = Piped(w)
    t0 = time.time()
    lease = p.lease_now()
    lease_s = time.time() - t0
    try:
        while lease is not None:
            current = p.take(lease)
            trained = w._guarded(current, lambda: w.train(current))
            p.unprotect(current)
            p.trained = None if isinstance(trained, dict) else trained
            lease, waited = p.join()
            if isinstance(trained, dict):  # the round did not train (refused, an outage): nothing to deliver
                trained["lease_s"] = lease_s
                w.collect(trained)
                p.holding = None
            else:
                p.hand_off(trained, lease_s)
            t0 = time.time()
            if lease is None and p.wanted():
                lease = p.lease_now()
            lease_s = time.time() - t0 + waited
        last, _ = p.join()  # the run finished while a lease was fetched ahead: it goes back untrained
        if last is not None:
            p.unprotect(last)
            release_quietly(w._release, last)
    except BaseException:
        p.close()
        raise
