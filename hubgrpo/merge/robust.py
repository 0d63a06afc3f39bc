"""Weights before the mean: staleness weighting, per-update norms, norm clipping and a trimmed mean.

- ``staleness_weight``: ``wᵢ ∝ samplesᵢ · (1+τᵢ)^(−decay)``; τᵢ > ``max_staleness`` is refused (code ``stale``).
- ``update_norm``: exact ``‖ΔWᵢ − ΔW_base(i)‖_F`` over the whole adapter, from r×r Gram matrices (no dense ΔW).
- ``robust_coefficients``: a trimmed mean over update norms drops the ⌊trim_fraction·N⌋ smallest- and
  largest-norm updates (ranked by their raw norms); clipping scales every kept update with
  ‖uᵢ‖ > clip_factor · median(‖u‖ over all N) down to that bound; the kept weights are renormalised to sum 1.
"""

from __future__ import annotations

import math

from hubgrpo.errors import InvalidSubmission, MergeError
from hubgrpo.merge.adapter import Adapter, ModuleSpec, factors
from hubgrpo.merge.lowrank import difference_sq_norm


def staleness_weight(samples: float, tau: int, decay: float = 0.5, max_staleness: int | None = None) -> float:
    """``samples · (1 + τ)^(−decay)`` — the async-FL staleness discount (FedAsync's polynomial form).

    Raises ``InvalidSubmission("stale")`` when ``τ > max_staleness``."""
    if samples < 0 or tau < 0 or decay < 0:
        raise ValueError(f"samples ({samples}), tau ({tau}) and decay ({decay}) must be ≥ 0")
    if max_staleness is not None and tau > max_staleness:
        raise InvalidSubmission(
            "stale",
            f"the submission is {tau} versions behind the current global adapter; at most {max_staleness} are accepted",
            hint="lease a new round to train from the current version",
        )
    return float(samples) * (1.0 + tau) ** (-decay)


def update_norm(
    sub: Adapter, sub_specs: dict[str, ModuleSpec], base: Adapter, base_specs: dict[str, ModuleSpec]
) -> float:
    """Exact ``‖ΔW_sub − ΔW_base‖_F`` summed over all modules (each term rank r_sub + r_base)."""
    total = 0.0
    for prefix, spec in sub_specs.items():
        bspec = base_specs[prefix]
        total += difference_sq_norm(spec.scaling, *factors(sub, spec), bspec.scaling, *factors(base, bspec))
    return math.sqrt(max(total, 0.0))


def robust_coefficients(
    weights: list[float], norms: list[float] | None, clip_factor: float | None, trim_fraction: float
) -> tuple[list[float], dict]:
    """Per-update coefficients ``cᵢ`` (Σ over kept = 1 before clipping) and a JSON report of what was done."""
    n = len(weights)
    if n == 0:
        raise MergeError("nothing to merge: no submissions were given")
    if any(w < 0 or not math.isfinite(w) for w in weights) or sum(weights) <= 0:
        raise MergeError(f"merge weights must be finite, ≥ 0 and not all 0, got {weights}")
    keep = [w > 0 for w in weights]
    trimmed = 0
    if trim_fraction > 0:
        k = int(math.floor(trim_fraction * n))
        if n - 2 * k < 1:
            k = (n - 1) // 2
        assert norms is not None, "trimming ranks the updates by their norms"
        order = sorted(range(n), key=lambda i: norms[i])
        for i in order[:k] + order[n - k :]:  # k = 0 drops nothing
            keep[i] = False
        trimmed = 2 * k
    total = sum(w for w, kept in zip(weights, keep) if kept)
    if total <= 0:
        raise MergeError("every update was trimmed or had weight 0", hint="lower trim_fraction")
    coefs = [w / total if kept else 0.0 for w, kept in zip(weights, keep)]
    clipped = 0
    bound = None
    if clip_factor is not None:
        assert norms is not None, "clipping bounds the updates' norms"
        bound = clip_factor * _median(norms)
        for i, norm in enumerate(norms):
            if coefs[i] and norm > bound:
                coefs[i] *= bound / norm
                clipped += 1
    info = {
        "clipped": clipped,
        "trimmed": trimmed,
        "clip_bound": bound,
        "weights": [w / total if kept else 0.0 for w, kept in zip(weights, keep)],
    }
    return coefs, info


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])
