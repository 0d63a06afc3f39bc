"""The coordinator's background thread: ticks (lease expiry) and due merges, off the request path.

``Ticker`` calls ``coord.tick()`` every ``interval`` seconds while the app runs, and runs a due merge as soon as a
submit completes a quorum (``CoordinatorApi.merge_wanted`` wakes it): planned under the coordinator's lock,
computed WITHOUT it (heartbeats and other submissions go on meanwhile), adopted under it again; the coordinator
takes its lock itself in each phase. Checkpoints run in a thread of their own (``coord.flush``) and the repo scan
in a third (``coord.scan_pass``), so that a scan of a large inbox (10–19 s at 1000 workers) never delays a merge.
Store I/O runs outside the lock. The tick thread also keeps the garbage collector's full passes short
(``freeze_heap``).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hubgrpo.space.endpoints import CoordinatorApi

log = logging.getLogger("hubgrpo.space.api")


FREEZES = 2  # the heap is frozen at start and after the first merges (torch and the merge code load at the first)


def freeze_heap() -> None:
    """Move everything alive now to the collector's permanent generation (``gc.freeze``): a served coordinator's
    heap (gradio, torch, the run) is large and long-lived, and each full collection walks all of it with the GIL
    held: at 1000 workers, pauses of a few hundred milliseconds that stalled every request in flight
    (``benchmarks/load/results/coordinator_load.md``). Afterwards a full collection walks only what was
    allocated since. Called a bounded number of times: what is frozen is never collected."""
    gc.collect()
    gc.freeze()


class Ticker:
    """Calls ``coord.tick()`` every ``interval`` seconds while ``blocks`` is running, and runs due merges (woken at
    once by a submit that completes a quorum) with the coordinator's lock released during the compute."""

    def __init__(self, api: CoordinatorApi, blocks: Any, interval: float):
        self.api, self.blocks, self.interval = api, blocks, float(interval)
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None
        self._scanner: threading.Thread | None = None
        self._checkpointer: threading.Thread | None = None

    def start(self) -> None:
        """Start the daemon threads unless they are alive (idempotent): ticks and merges in one, the repo scan in
        another, so that a long scan never delays a merge."""
        with self._guard:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._run, name="hubgrpo-tick", daemon=True)
            self._thread.start()
            self._scanner = threading.Thread(target=self._scan_loop, name="hubgrpo-scan", daemon=True)
            self._scanner.start()
            self._checkpointer = threading.Thread(target=self._checkpoint_loop, name="hubgrpo-checkpoint", daemon=True)
            self._checkpointer.start()

    def _scan_loop(self) -> None:
        force = True  # the first pass at once: rounds committed while the coordinator was starting (after the scan
        # of its constructor), whose workers wait out a backoff before they submit again, or crashed
        while self.blocks.is_running:
            try:
                self.api.coord.scan_pass(force=force)
                force = False
            except Exception:  # deliberate: the scan must survive one bad pass (the next one retries)
                log.exception("coordinator repo scan failed")
            time.sleep(self.interval)  # no lock held

    def _checkpoint_loop(self) -> None:
        """Checkpoints (``coord.flush``: a commit when one is due), in their own thread: a Hub commit that takes
        seconds, or waits out a 429 for minutes, never holds up a merge."""
        while self.blocks.is_running:
            try:
                self.api.coord.flush(force=False)
            except Exception:  # deliberate: the next pass retries (what is unsaved stays unsaved until then)
                log.exception("coordinator checkpoint failed")
            time.sleep(self.interval)  # no lock held

    def _run(self) -> None:
        freezes = FREEZES - 1
        freeze_heap()
        while True:
            self.api.merge_wanted.wait(self.interval)
            self.api.merge_wanted.clear()
            if not self.blocks.is_running:
                return
            try:
                merged = self.step()
            except Exception:  # deliberate: the tick thread must survive one bad tick
                log.exception("coordinator tick failed")
                continue
            if merged and freezes > 0:
                freezes -= 1
                freeze_heap()

    def step(self) -> bool:
        """One tick, then the due merge if any (computed outside the lock); the repo scan and the checkpoints have
        their own threads — except where commits are free and every version is a checkpoint (a local folder, S3):
        then the merge's checkpoint follows it here, so that no version is skipped. True when a version was
        merged."""
        api, coord = self.api, self.api.coord
        coord.tick()
        plan = coord.plan_merge(on_planned=api.set_merge_busy)  # under its lock: no submit makes one due between
        merged = False
        if plan is None:
            coord.prefold()  # FFA: fold what is pending now, so the merge at the quorum is short
        if plan is not None:
            try:
                result = plan.compute()
            except BaseException:
                coord.abort_merge(plan)
                api.set_merge_busy(False)
                raise
            try:
                merged = coord.finish_merge(plan, result)
            finally:
                api.set_merge_busy(False)
            if merged and coord.checkpoints_inline():
                coord.flush(force=False)  # free commits, one per version: before the next merge
        return merged

    def join(self, timeout: float | None = None) -> None:
        """Wait for the threads to end (they end within one interval, or one scan pass, of the app closing)."""
        for thread in (self._thread, self._scanner, self._checkpointer):
            if thread is not None:
                thread.join(timeout)
