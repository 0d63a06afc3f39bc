"""The rounds a coordinator has been handed and not decided yet: delivered, queued for their check.

A served coordinator answers a submit at once and checks the round later, in an admission thread
(``hubgrpo.space.admission_queue``). Meanwhile the round is neither pending nor refused, yet it is no stranger either:
the repo scan must leave it to its queue, a heartbeat of its lease must not revive it, and the commit budget
counts it. ``InFlight`` is the coordinator's own record of those rounds; the admission queue reports each round
it takes in (``add``) and lets go of (``discard``). Without a server it stays empty.
"""

from __future__ import annotations

import threading


class InFlight:
    """Submission ids of the rounds queued for their check (thread-safe); ``in_flight()`` is a copy of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: set[str] = set()

    def add(self, sub_id: str) -> None:
        with self._lock:
            self._ids.add(sub_id)

    def discard(self, sub_id: str) -> None:
        with self._lock:
            self._ids.discard(sub_id)

    def __call__(self) -> set[str]:
        with self._lock:
            return set(self._ids)
