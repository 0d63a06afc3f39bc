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

from hubgrpo.errors import CoordinatorError, Refused
from hubgrpo.layout import Lease
from hubgrpo.worker.pipeline import Handoff, release_quietly

if TYPE_CHECKING:
    from hubgrpo.worker.loop import Trained, Worker

log = logging.getLogger("hubgrpo.worker")
NOT_NOW = object()  # a lease fetched ahead was refused as a second live lease: lease after the delivery
JOIN_ON_EXIT_S = 30.0  # on Ctrl-C, how long the round being delivered may take to finish


def fetch_ahead(w: Worker) -> Lease | None | object:
    """The next lease and its adapter, asked while another round trains; None when the run is finished."""
    try:
        lease = w.client.lease(w.name, w.user)
    except Refused as e:
        if e.code == "duplicate_worker":
            return NOT_NOW
        if e.code == "finished":
            return None
        lease = w._lease()  # any other refusal or outage: waited out as always
    except CoordinatorError:
        lease = w._lease()
    if lease is not None:
        try:  # the download too, off the training's path (the round's own call then finds it cached)
            from hubgrpo.worker.loop import adapter_limit

            w.client.adapter(lease.base_version, lease.base_sha, w.workdir / "adapters", adapter_limit(w.cfg))
        except CoordinatorError as e:
            log.info("could not fetch version %s ahead (%s): the round downloads it", lease.base_version, e.code)
    return lease


class Piped:
    """The state of a pipelined loop: the handoff in flight and how many leases were taken."""

    def __init__(self, w: Worker):
        self.w = w
        self.handoff: Handoff | None = None
        self.leases = 0
        self.finished = False
        self.holding: Lease | None = None  # the lease of the round on the worker's thread, until handed off

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
        out, self.handoff = self.handoff.join(), None
        waited = time.time() - t
        if out.answer is not None:
            self.w.collect(out.answer | out.extra | {"pipelined": True})
        if out.error is not None:
            release_quietly(self.w._release, out.lease if isinstance(out.lease, Lease) else None)
            raise out.error
        if out.fetched and out.lease is None:
            self.finished = True
        return (out.lease if isinstance(out.lease, Lease) else None), waited

    def hand_off(self, trained: Trained, lease_s: float) -> None:
        w = self.w
        ahead = self.wanted() and self.leases + 1 < (w.max_rounds or 10**18)  # the next lease is asked by the loop
        self.leases += ahead
        self.handoff = Handoff(
            lambda: w._guarded(trained.hb.lease, lambda: w.finish(trained)),
            (lambda: fetch_ahead(w)) if ahead else None,
            keep=w.client.heartbeat,
            interval=w.cfg.coordinator.heartbeat_interval_s,
        )
        self.handoff.outcome.extra["lease_s"] = lease_s  # read at the join, on this thread

    def close(self) -> None:
        """On the way out: the round in flight is delivered (bounded), a lease fetched ahead is given back."""
        if self.handoff is not None:
            out = self.handoff.join(JOIN_ON_EXIT_S)
            release_quietly(self.w._release, out.lease if isinstance(out.lease, Lease) else None)


def run_piped(w: Worker) -> None:
    """Rounds until the run finishes or ``max_rounds`` leases were trained (module docstring)."""
    p = Piped(w)
    t0 = time.time()
    lease = p.lease_now()
    lease_s = time.time() - t0
    try:
        while lease is not None:
            current = p.holding = lease
            trained = w._guarded(current, lambda: w.train(current))
            lease, waited = p.join()
            if isinstance(trained, dict):  # the round did not train (refused, an outage): nothing to deliver
                trained["lease_s"] = lease_s
                w.collect(trained)
            else:
                p.hand_off(trained, lease_s)
            p.holding = None
            t0 = time.time()
            if lease is None and p.wanted():
                lease = p.lease_now()
            lease_s = time.time() - t0 + waited
        p.join()
    except BaseException as e:
        if not isinstance(e, KeyboardInterrupt):  # (Ctrl-C: the round's own handler gave its lease back)
            release_quietly(w._release, p.holding)  # trained or not, this round will not be delivered
        p.close()
        raise
