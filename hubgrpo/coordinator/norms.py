"""The typical size of an honest round, from the per-step update norms of recent credited rounds.

Two bounds hang on it: the ``norm_outlier`` refusal (an update more than ``merge.max_norm_factor`` × typical) and
the free-rider floor (below ``merge.min_norm_factor`` × typical: merged with weight 0, no credit). Typical is the
median over participants of each participant's median (a participant is its HF user, else its worker name), not
the median of all rounds: one participant whose many tiny (or huge) rounds fill the history cannot move it, so it
can neither make every honest round an outlier (stalling the run) nor lower the floor for itself. What it cannot
stop: a hostile participant alone in the history before anyone else has a credited round sets typical for the
first newcomer (the run's allow-list decides who can be first). Rounds far below typical
(< 1/``max_norm_factor`` of it) never enter. State.json keeps every merged entry's norm, so a restarted
coordinator rebuilds the same history.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hubgrpo.config import Config
    from hubgrpo.coordinator.admission import Pending

NORM_HISTORY = 64  # credited update norms (per step) kept
MIN_NORM_HISTORY = 3  # below this many, no bound but the step bound applies (and only a zero update is a free-rider)


class NormHistory:
    """The last ``NORM_HISTORY`` credited per-step norms, each with the participant that made it."""

    def __init__(self, entries: Iterable = ()):
        self._items: collections.deque[tuple[str, float]] = collections.deque(maxlen=NORM_HISTORY)
        for who, norm in entries:
            self._items.append((who, norm))

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        return iter(list(self._items))

    def typical(self) -> float | None:
        """The median over participants of their median per-step norm; None while the history is too short."""
        if len(self._items) < MIN_NORM_HISTORY:
            return None
        by_who: dict[str, list[float]] = collections.defaultdict(list)
        for who, norm in self._items:
            by_who[who].append(norm)
        return statistics.median(statistics.median(norms) for norms in by_who.values())

    def offer(self, who: str, norm_per_step: float | None, factor: float | None) -> bool:
        """Add a credited round's per-step norm unless it is zero or far below typical; whether it was added."""
        if norm_per_step is None or not norm_per_step > 0:
            return False
        typical = self.typical()
        if factor is not None and typical is not None and norm_per_step < typical / factor:
            return False
        self._items.append((who, float(norm_per_step)))
        return True

    def add_merged(self, entries, factor: float | None) -> None:
        """Offer the credited entries of one merged version (uncredited rounds never set later bounds)."""
        for e in entries:
            if e.weight > 0 and e.update_norm is not None:
                self.offer(participant(e), e.update_norm / max(1, e.steps or 1), factor)


def participant(entry) -> str:
    """Whom a merged entry or submission counts for: its HF user, else (a run without auth) its worker name."""
    return f"user:{entry.user}" if entry.user else f"worker:{entry.worker}"


def norm_limit(history: NormHistory, steps: int, factor: float | None) -> float | None:
    """``factor`` × typical × ``steps``: the largest update norm a round of ``steps`` steps may have; None while
    the history is too short or without a factor."""
    typical = history.typical()
    if factor is None or typical is None:
        return None
    return factor * typical * max(1, steps)


def rebuild(versions, factor: float | None) -> NormHistory:
    """The history of a run's merged versions (state.json), as the merges built it."""
    history = NormHistory()
    for version in versions:
        history.add_merged(version.merged, factor)
    return history


def credited(cfg: Config, history: NormHistory, p: Pending) -> bool:
    """Whether pending submission ``p`` of the run of ``cfg`` moved the adapter enough to earn merge weight and
    credit: at or above the free-rider floor (``merge.submission_checks.norm_floor`` from the typical norm of
    ``history``, scaled by its lease's learning rate ÷ the run's)."""
    from hubgrpo.merge.submission_checks import below_floor, norm_floor
    from hubgrpo.task.rollouts import lease_params

    ratio = float(lease_params(cfg, p.sub.lease)["learning_rate"]) / cfg.params.learning_rate
    floor = norm_floor(history.typical(), cfg.merge.min_norm_factor, ratio)
    return not below_floor(p.update_norm, p.steps, floor)
