"""Metrics trackers selected by the config's ``log: none|trackio|tensorboard``.

The coordinator logs one point per merged version; each worker logs its per-step GRPO metrics and its round
timings. A tracker never breaks a run: when its package is missing it warns once and logs nothing, and an
error inside it is logged as a warning, not raised.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

log = logging.getLogger("hubgrpo.tracking")


class Tracker:
    """Does nothing (``log: none``); the base of the real trackers."""

    kind = "none"

    def log(self, metrics: dict, step: int | None = None) -> None:
        clean = {
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        }
        if not clean:
            return
        try:
            self._log(clean, step)
        except Exception as e:  # deliberate: a tracker must never stop training
            log.warning("%s tracker failed to log (%s); continuing", self.kind, e)

    def _log(self, metrics: dict[str, float], step: int | None) -> None:
        return None

    def close(self) -> None:
        return None


class TrackioTracker(Tracker):
    """trackio (local-first; ``trackio show`` opens the dashboard; TRACKIO_DIR sets where it writes)."""

    kind = "trackio"

    def __init__(self, project: str, name: str, config: dict | None):
        import trackio

        self._trackio = trackio
        self.run = trackio.init(project=project, name=name, config=config or {}, embed=False, resume="allow")

    def _log(self, metrics, step):
        self.run.log(metrics, step=step)

    def close(self) -> None:
        try:
            self.run.finish()
        except Exception as e:  # deliberate: closing a tracker must not fail a finished run
            log.warning("trackio finish failed: %s", e)


class TensorBoardTracker(Tracker):
    """TensorBoard event files under ``log_dir`` (``tensorboard --logdir`` shows them)."""

    kind = "tensorboard"

    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def _log(self, metrics, step):
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def make_tracker(
    kind: str, *, project: str, name: str, config: dict | None = None, log_dir: Path | None = None
) -> Tracker:
    """The tracker for ``log:``; falls back to a no-op tracker (with a warning) when its package is missing."""
    try:
        if kind == "trackio":
            return TrackioTracker(project, name, config)
        if kind == "tensorboard":
            from hubgrpo.runrepo import cache_root

            return TensorBoardTracker(log_dir or cache_root() / "tensorboard" / project / name)
    except ImportError as e:
        log.warning(
            "log: %s needs a package that is missing (%s); metrics are not tracked. Install it with `pip install %s`",
            kind,
            e.name or e,
            kind,
        )
    return Tracker()
