"""A worker's rounds back to back: round k is delivered while round k + 1 trains.

Sequentially a round is lease → download → train → upload → submit, and only the training uses the processor.
With 1-step rounds of a few seconds the rest weighs: a 19 MB adapter committed takes about a second
(``benchmarks/round/results/overhead-demo.md``). A ``Handoff`` moves that work off the training's path: when round
k has trained, a background thread uploads and submits it, then leases round k + 2 and downloads its adapter,
while the worker trains round k + 1 on the lease the previous handoff fetched. A worker therefore holds up to two
live leases (the coordinator allows ``coordinator.leases_per_worker``, 2 by default): the round it trains and the
one it delivers, or the one it fetched ahead.

What changes for the run: a round's lease is taken one round earlier, so it starts from a version one round
older; ``merge.rebase`` moves a round onto newer versions between its steps (a 1-step round only with
``merge.rebase_after_generation``).
Nothing else: the same checks on every answer (the handoff calls the worker's own lease, download and submit),
one delivery at a time, and a refusal, an error or a stop on the background thread reaches the worker at the
next handoff exactly as it would have in sequence.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hubgrpo.errors import CoordinatorError, LeaseError
from hubgrpo.layout import Lease


@dataclass
class Outcome:
    """What a handoff did: the delivered round's answer, the next lease (None: none was asked for, or the run
    is finished), and an exception the worker must not survive (raised again on the worker's thread)."""

    answer: dict | None = None
    lease: Lease | None = None
    fetched: bool = False  # a lease was asked for (None then means: the run is finished)
    error: BaseException | None = None
    extra: dict = field(default_factory=dict)
    lost: list[Lease] = field(default_factory=list)  # leases fetched ahead, then given back or refused a heartbeat


class Handoff:
    """One background job: ``deliver()`` (the trained round's upload and submit), then, when ``fetch`` is given,
    the next lease and its adapter, kept alive with ``keep`` (a heartbeat) every ``interval`` seconds until the
    worker takes it (``join``): a lease fetched ahead of a long round neither expires nor looks abandoned."""

    def __init__(
        self,
        deliver: Callable[[], dict],
        fetch: Callable[[], Any] | None,
        *,
        release: Callable[[Lease], Any],
        keep: Callable[[Lease], Lease] | None = None,
        interval: float = 30.0,
    ):
        self._deliver, self._fetch, self._keep, self._interval = deliver, fetch, keep, interval
        self._release = release
        self.ahead = fetch is not None
        self.outcome = Outcome()
        self._taken = threading.Event()
        self._abandoned = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hubgrpo-handoff", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        out = self.outcome
        try:
            out.answer = self._deliver()
            if self._fetch is not None and not self._abandoned.is_set():  # the worker left: nothing to fetch for
                out.fetched = True
                out.lease = self._fetch()
                if isinstance(out.lease, Lease) and self._abandoned.is_set():  # the worker left meanwhile
                    self._release(out.lease)
                    out.lost.append(out.lease)
                    out.lease = None
                while isinstance(out.lease, Lease) and self._keep and not self._taken.wait(self._interval):
                    try:
                        out.lease = self._keep(out.lease)
                    except LeaseError:  # expired or refused: the worker leases anew after its round
                        out.lost.append(out.lease)
                        out.lease, out.fetched = None, False
                    except CoordinatorError as e:  # unreachable: try at the next beat, unless our run is gone
                        if e.code == "orphaned":
                            raise
        except BaseException as e:  # noqa: BLE001  (handed to the worker's thread, which decides)
            out.error = e

    def abandon(self, timeout: float) -> Outcome:
        """The worker is leaving: wait up to ``timeout`` s for the delivery; a lease fetched ahead (now or later)
        is given back."""
        self._abandoned.set()
        out = self.join(timeout)
        if isinstance(out.lease, Lease):
            self._release(out.lease)
            out.lost.append(out.lease)
            out.lease = None
        return out

    def join(self, timeout: float | None = None) -> Outcome:
        """Take the outcome: stop keeping the fetched lease alive and wait for the job (``error`` is the
        caller's to raise)."""
        self._taken.set()
        self._thread.join(timeout)
        return self.outcome


def release_quietly(release: Callable[[Lease], Any], lease: Lease | None) -> None:
    """Give a fetched-ahead lease back (on the way out); best effort."""
    if lease is not None:
        release(lease)
