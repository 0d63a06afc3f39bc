"""Held-out scores of global versions, recorded by an evaluator (``hubgrpo evaluate``), and the optional gate.

An evaluator scores a version greedily on the run's held-out prompts and reports ``(version, reward, samples)``
through the ``record_eval`` endpoint. The report is hostile input until checked (``parse``): integers and a finite
float of the right types, the reward within what the run's reward functions can give (``reward_bound``), samples
in 1…``MAX_SAMPLES``, an existing version, and only the first score of a version counts (a repeat answers
``duplicate``). Who may report is the server's business (``coordinator.evaluators``, default the repo owner).

Scores wait in ``c.new_evals`` (the status shows them at once) and reach state.json with the next merge commit,
or in a state-only commit after ``coordinator.refusal_flush_s`` (``merging.stage_refusals``), also once the run has
finished. ``merge.eval_gate`` (a margin): when the newest scored version's held-out reward is more than the margin
below the best so far, the next merge starts from the best version instead (``gate_start``; the new version records
``start_version``), once per bad score.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

from hubgrpo.errors import InvalidSubmission
from hubgrpo.layout import RunState

if TYPE_CHECKING:
    from hubgrpo.coordinator.core import Coordinator

MAX_SAMPLES = 100_000
UNBOUNDED = 1e6  # |reward| bound when a reward function is not built in (its range is unknown)


def reward_bound(cfg) -> float:
    """The largest |held-out reward| the run's reward functions can give: Σ|weight| for built-ins (each within
    [-1, 1]), else ``UNBOUNDED``."""
    if any(not r.function.startswith("builtin:") for r in cfg.rewards):
        return UNBOUNDED
    return sum(abs(r.weight) for r in cfg.rewards)


def parse(cfg, version, reward, samples) -> tuple[int, float, int]:
    """Check a reported score's types and ranges; ``InvalidSubmission`` (``bad_eval``) naming the problem."""

    def bad(why: str):
        raise InvalidSubmission(
            "bad_eval",
            f"held-out score refused: {why}",
            hint="report what `hubgrpo evaluate` measured: an integer version, a finite reward, "
            "an integer number of samples",
        )

    if not isinstance(version, numbers.Integral) or isinstance(version, bool) or not 0 <= int(version) <= 10**9:
        bad(f"version {str(version)[:40]!r} is not a version number")
    if not isinstance(reward, numbers.Real) or isinstance(reward, bool) or not math.isfinite(float(reward)):
        bad(f"reward {str(reward)[:40]!r} is not a finite number")
    bound = reward_bound(cfg)
    if abs(float(reward)) > bound + 1e-9:
        bad(f"reward {float(reward):.6g} is outside what the run's reward functions give (±{bound:g})")
    if not isinstance(samples, numbers.Integral) or isinstance(samples, bool) or not 1 <= int(samples) <= MAX_SAMPLES:
        bad(f"samples {str(samples)[:40]!r} is not an integer in 1…{MAX_SAMPLES}")
    return int(version), float(reward), int(samples)


def record(c: Coordinator, version: int, reward: float, samples: int) -> dict:
    """Keep a parsed score of ``version`` (under ``c.lock``); the first score of a version wins."""
    known = {v.version for v in c.state.versions}
    if version not in known:
        raise InvalidSubmission(
            "unknown_version",
            f"version {version} does not exist (the run is at version {c.state.version})",
            hint="score the versions the status lists",
        )
    if version in c.new_evals or scores(c.state).get(version) is not None:
        return {"status": "duplicate", "version": version}
    c.new_evals[version] = (reward, samples, c.clock())
    return {"status": "recorded", "version": version}


def scores(state: RunState, pending: dict | None = None) -> dict[int, float]:
    """version → held-out reward: state.json's, then the unsaved ones."""
    out = {v.version: v.eval_reward for v in state.versions if v.eval_reward is not None}
    out.update({v: e[0] for v, e in (pending or {}).items()})
    return out


def apply(state: RunState, pending: dict) -> dict:
    """Write the unsaved scores into ``state`` (a copy being staged); returns what it wrote."""
    saved = {}
    for i, v in enumerate(state.versions):
        if v.version in pending and v.eval_reward is None:  # copy-on-write: the record may be shared (fork_state)
            reward, samples = pending[v.version][:2]
            state.versions[i] = v.model_copy(update={"eval_reward": reward, "eval_samples": samples})
            saved[v.version] = pending[v.version]
    return saved


def gate_start(c: Coordinator) -> int | None:
    """With ``merge.eval_gate``: the best-scored version when the newest score fell more than the margin below it
    (and no merge has started from elsewhere since that score); else None (merge onto the current version)."""
    margin = c.cfg.merge.eval_gate
    if margin is None:
        return None
    known = scores(c.state, c.new_evals)
    if not known:
        return None
    latest = max(known)
    best = max(known, key=lambda v: (known[v], -v))
    if known[latest] >= known[best] - margin or best == c.state.version or not c.loadable(best):
        return None
    if any(v.start_version is not None for v in c.state.versions if v.version > latest):
        return None  # already reverted after that score
    return best
