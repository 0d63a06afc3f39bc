"""A lease kept alive: background heartbeats for one lease while its round trains and is delivered."""

from __future__ import annotations

import logging
import threading

from hubgrpo.errors import CoordinatorError, LeaseError
from hubgrpo.layout import Lease

log = logging.getLogger("hubgrpo.worker")


class Heartbeat:
    """Background heartbeats for one lease; ``lease`` is always the latest re-signed copy."""

    def __init__(self, client, lease: Lease, interval: float):
        self.client, self.lease, self.interval = client, lease, interval
        self.lost: Exception | None = None
        self.orphaned: CoordinatorError | None = None  # set when the `hubgrpo run` that started us is gone
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hubgrpo-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.lease = self.client.heartbeat(self.lease)
            except LeaseError as e:  # expired or refused: finish the round anyway, the submit will say
                self.lost = e
                return
            except CoordinatorError as e:  # unreachable: keep trying at the next beat ...
                if e.code == "orphaned":  # ... unless our `hubgrpo run` is gone: the round stops at its next step
                    self.orphaned = e
                    return
                log.warning("heartbeat failed: %s", e.message)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
