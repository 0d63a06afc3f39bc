"""The simulation's run repo: a ``LocalStore`` on the virtual clock, held to the Hub's hourly commit quota.

- **Virtual commit times.** A ``LocalStore`` stamps each commit with the real clock; the coordinator reads those
  stamps back (``history()``: the commits of the last hour count against its budget; the last checkpoint's time).
  Mixed with a virtual clock that starts at 0 they were ~1.8·10⁹ s in the future: the budget's commit times
  jumped by the wall-clock epoch at the first wait, or, clamped to now, every commit of the history counted as
  made this very second. Here every commit is stamped with the virtual time at which it was made, and
  ``history()`` answers those stamps.
- **The quota** (``quota_per_hour``; None: none). Like the Hub (``tests/support/hub_emulator_api.py``), every commit
  request spends one of the repo's commits of the rolling hour, and past the quota a commit is refused with the
  Hub's 429 as ``HubStore`` maps it: ``RateLimited`` (the Hub names no wait: ``QUOTA_WAIT_S``, the wait
  ``HubStore`` assumes then). Tags cost nothing, as on the Hub. The store says so as ``HubStore`` does
  (``hourly_commit_quota``), so the coordinator paces its checkpoints as it would on the Hub.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from hubgrpo.errors import ConfigError, RateLimited
from hubgrpo.store.local import LocalStore

HUB_QUOTA = 128  # commits per rolling hour per repo: the Hub's 429 "... repository commits (128 per hour)"
HOUR_S = 3600.0
QUOTA_WAIT_S = 60.0  # the Hub's quota 429 carries no wait header: HubStore (``_server_wait``) then waits 60 s
QUOTA_MESSAGE = "You have exceeded our hourly quotas for action: commit. We invite you to retry later."


class SimStore(LocalStore):
    """A local run repo whose commits are stamped with ``clock()`` and limited to ``quota_per_hour`` an hour."""

    def __init__(self, root: str | Path, clock: Callable[[], float], quota_per_hour: int | None = None):
        super().__init__(root)
        self.clock, self.quota = clock, quota_per_hour
        self.hourly_commit_quota = quota_per_hour  # as HubStore's: the coordinator paces its checkpoints by it
        self.stamps: dict[str, float] = {}  # commit sha → the virtual time it was made
        self.spent: list[float] = []  # virtual times of every commit request that counted against the quota
        self.refused: list[float] = []  # virtual times of commits refused with the 429

    def commit(
        self, adds: Mapping[str, bytes | Path], deletes: Sequence[str] = (), *, message: str, parent: str | None = None
    ) -> str:
        now = self.clock()
        self._spend(now)
        before = self.head()
        sha = super().commit(adds, deletes, message=message, parent=parent)
        if sha != before:
            self.stamps[sha] = now
        return sha

    def _spend(self, now: float) -> None:
        """One commit of the rolling hour's quota, or the Hub's 429 (``RateLimited``)."""
        if self.quota is not None and sum(1 for t in self.spent if t > now - HOUR_S) >= self.quota:
            self.refused.append(now)
            raise RateLimited(
                f"commit on {self.location}: rate-limited by the Hub (429), retry in "
                f"{QUOTA_WAIT_S:.0f}s ({QUOTA_MESSAGE})",
                wait_s=QUOTA_WAIT_S,
                hint="commits have an hourly quota per repo: batch changes into fewer commits",
            )
        self.spent.append(now)

    def history(self, limit: int | None = None):
        return [replace(c, created_at=self.stamps.get(c.sha, c.created_at)) for c in super().history(limit)]


def parse_quota(spec: str) -> int | None:
    """``--commit-quota``: a whole number of commits per rolling hour (1 to 1,000,000), or ``off`` (None)."""
    text = str(spec).strip().lower()
    if text == "off":
        return None
    if text.isdigit() and 1 <= int(text) <= 1_000_000:
        return int(text)
    raise ConfigError(
        f"--commit-quota {spec!r} is not a number of commits an hour",
        hint=f"use a whole number from 1 to 1000000 (the Hub: {HUB_QUOTA}), or off for free commits",
    )


def peak_per_hour(times: list[float]) -> int:
    """The most of ``times`` that fall in one rolling hour (the figure the Hub's quota bounds)."""
    times, best, lo = sorted(times), 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - HOUR_S:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def quota_report(store: SimStore, virtual_s: float, budget: int) -> dict:
    """What ``simulation.json`` says of the quota: which was in force, the commits made, the most in one rolling
    (virtual) hour, the commits refused with the 429, and the coordinator's own budget."""
    made = sorted(store.stamps.values())
    hours = virtual_s / HOUR_S
    return {
        "quota_per_hour": store.quota,
        "in_force": store.quota is not None,
        "commit_budget_per_hour": budget,
        "commits": len(made),
        "peak_commits_per_hour": peak_per_hour(made),
        "commits_per_hour_mean": round(len(made) / hours, 2) if hours >= 1 else None,
        "refused_429": len(store.refused),
    }
